// The CUDA backend's planner and its path for rows with sampling controls.
//
// PlanCudaSamplerPath picks, per batch, the kernel that serves it:
//  - kControlled when any row has a control (HasAnyControl): the whole batch
//    goes to CudaControlledRunner (plain rows in such a batch are served with
//    neutral controls, which sample exactly what the plain kernels sample);
//  - else kFused up to fused_max_rows rows, kMaterialized above (unchanged).
//
// CudaControlledRunner owns the buffers of the controlled paths on one device
// (flattened controls, per-row status, the per-sample and top-list outputs,
// device and pinned host copies) and runs one batch on the engine's stream,
// after the engine has enqueued the upload of the hidden states and params.
// The fused controlled path (kernels/cuda/fused_controlled_sample.h: the
// controls inside the LM-head matmul, no logits in memory) serves rows with
// top_k <= 64 (with any other control) or no filter at all, in batches of at
// most fused_max_rows rows without drafts, on heads it supports; the
// materialized path (kernels/cuda/controlled_sample.h: cuBLAS logits, then
// one block per row applies every control) serves every row. Per batch:
//  - every row one the fused path serves: one fused launch;
//  - none: one materialized launch;
//  - a mix: with split_rows (--batch_invariant), the fused launch over the
//    batch, then the rows it did not serve by themselves on the materialized
//    path (RunMaterializedRows: their hidden states and params gathered on
//    the device); without, one materialized launch for the whole batch.
// A row the fused path finds it cannot finish exactly (a tile held more of
// the row's top-k than it kept, row_status 2) is re-run with the same noise
// on the materialized path: alone with the other unserved rows under
// split_rows, else with the whole batch. A row the fused path serves gets
// the same bits whatever its companions as long as it is served there (its
// summary rows fold and merge as the plain kernels do); a row on the
// materialized path gets cuBLAS logits, whose rounding may depend on how
// many rows share the launch, and under !split_rows so do its companions.
// Under split_rows the materialized path takes its logits from the fused
// kernels' own GEMM instead (ControlledSampleArgs::batch_invariant, 16-bit
// heads with hidden_size % 16 == 0), so its rows, draft rows included, keep
// their bits in every batch as well.
// The result's path: kFusedControlled (every row fused),
// kFusedControlledFallback (the fused launch, then the materialized path
// for some rows or, without split_rows, the whole batch), kControlled (one
// materialized launch); flashsampler_launches_total counts them.
//
// Thread safety: like the engine, one batch at a time (Run is not reentrant).
// Outcomes of Run: OK with the batch's SampleResult (details for every row);
// FailedPrecondition when a row has no token with a finite logit left (the
// CPU backend's status and message; the engine stays healthy); InvalidArgument
// for controls the kernel rejects; Internal for CUDA / cuBLAS failures. Draft
// rows (speculative verification) always take the materialized path, which
// applies the draft to the distribution left after every control
// (controlled_sample.h), as the CPU backend does.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/controlled_sample.h"
#include "server/engine/engine.h"

namespace flashsampler {

enum class CudaSamplerPath { kFused, kMaterialized, kControlled };

CudaSamplerPath PlanCudaSamplerPath(const SampleBatch& batch, int64_t fused_max_rows);

class CudaControlledRunner {
 public:
  CudaControlledRunner() = default;
  ~CudaControlledRunner();
  CudaControlledRunner(const CudaControlledRunner&) = delete;
  CudaControlledRunner& operator=(const CudaControlledRunner&) = delete;

  // Allocates the output buffers for batches of up to max_rows rows (on the
  // current device). The workspace the engine hands to Run must hold
  // kernels::ControlledSampleWorkspaceBytes(max_rows, ...) and, when
  // fused_max_rows > 0, kernels::FusedControlledWorkspaceBytes(fused_max_rows,
  // ...). fused_max_rows = 0: never the fused controlled path.
  // split_rows: a batch that mixes rows the fused path serves with rows it
  // cannot runs the fused launch and then only the others on the
  // materialized path (CudaEngineOptions::batch_invariant); false: such a
  // batch, and one in which the fused path hands a row back, runs whole on
  // the materialized path.
  absl::Status Init(int64_t max_rows, int64_t fused_max_rows, bool split_rows = false);

  // Samples `batch` (controls non-empty) whose hidden states (rounded to the
  // weight dtype), params and draft tokens (device [rows], exactly when the
  // batch has draft_tokens, else nullptr) are already on the device or
  // enqueued on `stream`.
  absl::StatusOr<SampleResult> Run(const SampleBatch& batch, const ModelShape& shape,
                                   const void* weight, kernels::CudaWeightDType dtype,
                                   const float* hidden, const RowParams* params,
                                   const int32_t* draft_tokens, void* workspace,
                                   size_t workspace_bytes, cublasHandle_t cublas,
                                   cudaStream_t stream);

  // Run's steps, for a caller that launches a sampler of its own on this
  // runner's buffers (the sharded engine's gathered-logits path) and waits in
  // its own way. In order, for one batch at a time:
  //  - Prepare flattens the batch's controls (neutral ones when
  //    batch.controls is empty: a batch of plain draft rows), enqueues their
  //    upload on `stream` and returns the device controls (with
  //    `draft_tokens`) and the outputs the launch must write;
  //  - EnqueueDownloads enqueues the outputs' copies to the host on `stream`
  //    after the launch;
  //  - Collect, once `stream` has passed them, assembles the SampleResult
  //    (FailedPrecondition when a row has no token left).
  struct LaunchBuffers {
    kernels::ControlledDeviceControls controls;
    kernels::ControlledSampleOutputs outputs;
  };
  absl::StatusOr<LaunchBuffers> Prepare(const SampleBatch& batch, const ModelShape& shape,
                                        const int32_t* draft_tokens, cudaStream_t stream);
  absl::Status EnqueueDownloads(const SampleBatch& batch, cudaStream_t stream);
  absl::StatusOr<SampleResult> Collect(const SampleBatch& batch);
  // After Collect: true when it found a row the fused controlled path left
  // unserved (row_status 2; its result is empty: re-run the batch on a
  // materialized path).
  bool fused_row_not_served() const { return fused_row_not_served_; }
  // After Prepare: the batch's flattened controls, and their packed copy in
  // pinned host memory (valid until the next Prepare), for a caller that
  // needs the controls on other devices too (kernels::FlatControls::DeviceView
  // of a copy gives their device view).
  const kernels::FlatControls& flat_controls() const { return flat_; }
  // After Prepare: true when the fused controlled path serves every row of
  // the batch (kernels::FusedRowKindOf); drafts and sizes are the caller's.
  bool fused_serves_every_row() const;
  const void* packed_controls_host() const { return controls_.host; }

 private:
  absl::Status EnsureControlsCapacity(size_t bytes);
  // EnqueueDownloads, a wait for `stream`, then Collect (which sets
  // fused_row_not_served_ and returns an empty result when a row has
  // row_status kFusedRowNotServed) or, with not_served, CollectRows.
  absl::StatusOr<SampleResult> Finish(const SampleBatch& batch, cudaStream_t stream,
                                      std::vector<int64_t>* not_served = nullptr);
  // Collect for a batch whose rows with row_status kFusedRowNotServed are
  // listed in *not_served (their entries left default) instead of failing
  // the batch; not_served = nullptr: such a row is FailedPrecondition.
  absl::StatusOr<SampleResult> CollectRows(const SampleBatch& batch,
                                           std::vector<int64_t>* not_served);
  // The materialized controlled path for `rows` of `batch` alone (hidden
  // states and params gathered from `whole`'s device buffers into this
  // runner's), their results written into *result at their rows.
  absl::Status RunMaterializedRows(const SampleBatch& batch, const ModelShape& shape,
                                   const std::vector<int64_t>& rows,
                                   const kernels::ControlledSampleArgs& whole,
                                   cublasHandle_t cublas, cudaStream_t stream, SampleResult* result);

  int64_t max_rows_ = 0;
  int64_t fused_max_rows_ = 0;
  bool split_rows_ = false;
  bool fused_row_not_served_ = false;
  kernels::FlatControls flat_;  // the batch in flight's (Prepare .. Collect)
  // Device outputs and their pinned host copies.
  struct Buffer {
    void* device = nullptr;
    void* host = nullptr;
  };
  Buffer tokens_, logz_, logprobs_, status_, sample_tokens_, sample_logprobs_, sample_ranks_,
      top_ids_, top_logprobs_, top_counts_, draft_logprobs_;
  Buffer controls_;
  size_t controls_capacity_ = 0;
  // RunMaterializedRows' gathered hidden states and params (device).
  void* subset_hidden_ = nullptr;
  size_t subset_hidden_bytes_ = 0;
  void* subset_params_ = nullptr;
};

}  // namespace flashsampler
