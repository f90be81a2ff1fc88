// Controlled sampling on the GPU, materialized path: exact samples of rows
// with sampling controls (kernels/common/row_controls.h: bitmask, bans, bias,
// penalties, temperature, min_p, top_k, top_p, num_samples, top_logprobs in
// both modes), with the same semantics as the CPU backend
// (kernels/cpu/controlled_sampler.h).
//
// What it computes, per row b (one cluster of cluster_blocks thread blocks per
// row, each sweeping a slice of it; every reduction combines the blocks'
// partials in rank order through distributed shared memory):
//   0. L = H W^T (logits_gemm.h: the fused samplers' own GEMM on Hopper,
//      cuBLAS elsewhere, ControlledSampleArgs::logits_gemm), fp32, written once to the
//      workspace (LaunchControlledSample; LaunchControlledSampleFromLogits
//      starts from given logits).
//   1-4. l'_i = raw_i * scale, -inf where the allowed bitmask clears i; the
//      row's touched tokens (touched_tokens.h: bans, bias, penalties) are then
//      overwritten with TouchedLogit, the same fp32 function the CPU uses, so
//      l' is bit-identical to the CPU's for the same raw logits. Non-finite l'
//      become -inf (never kept, as on the CPU).
//   5-7. The kept set is a prefix of the canonical order (l' desc, id asc),
//      kept as a cut (last kept key, last kept id among ties):
//      - min_p: the smallest float t with exp(double(t) - double(max)) >=
//        min_p is found by stepping ulps from float(max + log(min_p)); kept:
//        l' >= t (the CPU's per-token test, since it is monotone in l').
//      - top_k: radix select (11/11/10-bit digits of the order-preserving key
//        of l', shared-memory histograms) finds the k-th kept token's exact
//        value; ties at it keep the lowest ids (an in-order block scan finds
//        the id), exactly the CPU's nth_element on (l' desc, id asc).
//      - top_p: the same radix descent on the mass exp(double(l') - max),
//        summed per bin in 64-bit fixed point (2^F units, F = 63 -
//        ceil(log2(valid_vocab + 1)), so no sum can overflow): the kept prefix
//        is every token whose mass strictly before it is < top_p * total.
//        Integer sums are exact and order-free, so the cut is deterministic;
//        it differs from the CPU's float64 sums only when a token's prefix mass
//        lies within valid_vocab * 2^-F (< 1e-8 of the max token's mass at
//        V = 151936) of the target.
//   8. Sample j: argmax over kept i of l'_i + GumbelNoise(seed, offset,
//      stream + j * sample_stream_stride, i) (greedy rows: argmax l'_i), ties
//      to the lower id, as in the RNG contract; a token whose l' + kGumbelMax
//      is below the thread's best score skips its noise (exact pruning).
//   logz = max + log(sum over kept of exp(double(l') - max)) (each term in
//   float64, rounded down to a multiple of 2^-96 and summed exactly as a
//   128-bit integer: the same sum for any split of the row over threads,
//   blocks and clusters), logprobs = l'_token - logz.
//   Draft rows (speculative verification, server/engine/engine.h; controls.draft_tokens
//   set and draft x >= 0): draft_logprobs = l'_x - logz when x is kept, else
//   -inf (p(x) = 0); the samples of a sampled row (T > 0) are drawn from the
//   kept tokens other than x (the residual), or are x when x is all that is
//   kept; greedy rows sample as usual. Rows with x = -1 get NaN. The CPU's
//   SampleFromCandidates step for step.
//   top_logprobs > 0: the sampled mode takes the n best kept tokens (the same
//   radix select), each sample's logprob and vLLM's rank (kept tokens with
//   l' >= the sample's); the raw mode does the same over the raw logits of
//   the whole valid vocabulary with their own log-sum-exp.
// Why exact: each filter keeps the prefix row_controls.h defines (computed
// from exact values, not approximations), and the Gumbel-max trick over the
// kept set with the contract's noise samples softmax over it; the CPU backend
// draws the same noise, so both agree token for token whenever their logits
// agree (up to fp32 summation order of the GEMM).
//
// A row with no finite l' left gets row_status 1 (its other outputs are
// unspecified): the caller fails the request with FailedPrecondition, as the
// CPU backend does (KernelStatus::kFailedPrecondition).
//
// Performance: a cluster of up to 16 blocks of 512 threads per row (the
// largest that still fits the batch in one wave, kControlledClusterAuto) makes
// a handful of sweeps over its logits (transform with max and count, 3 per
// radix select, one per sample; 16-byte loads, 4 in flight per thread), so
// even one row keeps 16 SMs busy. The blocks merge their histograms by
// reduce-scatter through distributed shared memory (each block sums 1/g of
// the digits). The logits make one round trip through memory (the fused path,
// fused_controlled_sample.h, avoids it for the rows it serves).
// Thread safety: enqueues work on `stream`, keeps no state; binds the cuBLAS
// handle to `stream`. Distinct launches need distinct workspaces and outputs.
// Outcomes: kOk (enqueued); kInvalidArgument for null pointers, sizes out of
// range, a workspace too small; kDeviceError when a launch or cuBLAS fails.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/common/kernel_status.h"
#include "kernels/common/row_controls.h"
#include "kernels/common/row_params.h"
#include "kernels/common/touched_tokens.h"
#include "kernels/cuda/fused_sample.h"
#include "kernels/cuda/logits_gemm.h"

namespace flashsampler::kernels {

// One row's controls as the device reads them (flattened RowControls).
struct ControlledRowDesc {
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t touched_begin = 0;  // into ControlledDeviceControls::touched
  int32_t touched_count = 0;
  int32_t bitmask_begin = -1;  // word offset into ::bitmask; -1: every token allowed
  int32_t top_logprobs = 0;
  int32_t logprobs_mode = 0;  // LogprobsMode
  int32_t num_samples = 1;
  uint32_t sample_stream_stride = 1;
  int32_t sample_begin = 0;  // into the per-sample outputs
};

// Device pointers to a batch's flattened controls.
struct ControlledDeviceControls {
  const ControlledRowDesc* rows = nullptr;  // [batch]
  const TouchedToken* touched = nullptr;    // all rows' touched tokens
  const uint32_t* bitmask = nullptr;        // all rows' bitmask words (may be null if none)
  // [batch] draft token per row, -1 (none) or in [0, valid_vocab) (the caller
  // validates; a token past valid_vocab counts as removed: -inf), or nullptr
  // when no row verifies a draft. Not part of the packed upload: the caller
  // sets it.
  const int32_t* draft_tokens = nullptr;
};

// A batch's controls flattened on the host into one upload: the row
// descriptors, the touched tokens (MergeTouchedTokens per row) and the bitmask
// words, each part 256-byte aligned in the packed buffer.
struct FlatControls {
  std::vector<ControlledRowDesc> rows;
  std::vector<TouchedToken> touched;
  std::vector<uint32_t> bitmask;
  int64_t total_samples = 0;  // sum of num_samples

  size_t PackedBytes() const;
  // Writes the three parts into `host` (PackedBytes() bytes).
  void PackTo(void* host) const;
  // The device view of a packed copy at `device` (256-byte aligned).
  ControlledDeviceControls DeviceView(const void* device) const;
};

// Flattens `batch` rows of controls. kInvalidArgument when a row breaks
// ValidRowControls(c, vocab, valid_vocab).
KernelStatus FlattenControls(const RowControls* controls, int64_t batch, int64_t vocab,
                             int64_t valid_vocab, FlatControls* out);

struct ControlledSampleOutputs {
  int32_t* token_ids = nullptr;        // [batch], required: sample 0
  float* logz = nullptr;               // [batch], optional
  float* logprobs = nullptr;           // [batch], optional: sample 0's
  int32_t* row_status = nullptr;       // [batch], required: 0 ok, 1 no token left
  int32_t* sample_tokens = nullptr;    // [total_samples], required
  // Required as well; written only for rows with top_logprobs > 0:
  float* sample_logprobs = nullptr;    // [total_samples]
  int32_t* sample_ranks = nullptr;     // [total_samples]
  int32_t* top_ids = nullptr;          // [batch * kMaxTopLogprobs]
  float* top_logprobs = nullptr;       // [batch * kMaxTopLogprobs]
  int32_t* top_counts = nullptr;       // [batch]: entries of the row's top list
  float* draft_logprobs = nullptr;     // [batch], required when controls.draft_tokens is set
};

// Blocks per row (a thread-block cluster sharing the row's sweeps through
// distributed shared memory): 1, 2, 4, 8 or 16 (a non-portable cluster size;
// a device that refuses it fails the launch), or kControlledClusterAuto. The
// results do not depend on it, bit for bit (the only sums over the row are
// exact: integer histograms and fixed-point masses).
inline constexpr int kControlledClusterBlocks = 8;
// Auto (the default): per launch chunk of `rows` rows, the largest g of 16, 8,
// 4, 2 for which all `rows` clusters can be resident at once on the current
// device (cudaOccupancyMaxActiveClusters, queried once per device and g),
// else 1. Many rows per SM beat waves of clusters: 8-block clusters win for a
// few rows (one row keeps 8 SMs busy) and lose badly once their clusters no
// longer fit in one wave (BENCHMARKS.md, issue 3).
inline constexpr int kControlledClusterAuto = 0;

// What kControlledClusterAuto resolves to for a launch of `rows` rows on the
// current device, and the occupancy it is decided from (clusters of g blocks
// resident at once; 0 when the query fails). For benchmarks and tests.
int ControlledClusterBlocksFor(int64_t rows);
int ControlledMaxActiveClusters(int g);

struct ControlledSampleArgs {
  const void* weight = nullptr;  // device [vocab, hidden_dim]
  CudaWeightDType weight_dtype = CudaWeightDType::kBFloat16;
  const float* hidden = nullptr;      // device [batch, hidden_dim] fp32
  const RowParams* params = nullptr;  // device [batch]
  int64_t batch = 0;
  int64_t vocab = 0;
  int64_t valid_vocab = 0;
  int64_t hidden_dim = 0;
  ControlledDeviceControls controls;
  ControlledSampleOutputs outputs;
  void* workspace = nullptr;  // device, 256-byte aligned
  size_t workspace_bytes = 0;
  int cluster_blocks = kControlledClusterAuto;
  // The fused controlled path's stage-1 kernel (fused_controlled_sample.h;
  // FusedSampleArgs::stage1's meaning: kAuto is mma.sync below 16 rows and
  // WGMMA from 16 where available, the same bits).
  // kCudaCore and kWgmmaPingpong cannot run its epilogue: kInvalidArgument.
  // The materialized path ignores it.
  Stage1Kernel stage1 = Stage1Kernel::kAuto;
  // The materialized path's logits GEMM (LaunchControlledSample;
  // logits_gemm.h). With the fused samplers' GEMM (kAuto on Hopper,
  // kBatchInvariant anywhere) every output of a row is the same in every
  // batch: steps 1-8 read only the row's own logits, and neither the chunk
  // nor the cluster size the batch picks changes a bit (exact sums above).
  // The fused controlled path ignores it (it is invariant as it is).
  LogitsGemmPath logits_gemm = LogitsGemmPath::kAuto;
};

// Rows per chunk: the launch processes the batch in chunks of at most this
// many rows (GEMM, then the row kernel), which bounds the workspace.
inline constexpr int64_t kControlledChunkRows = 256;

// Workspace of LaunchControlledSample for batches up to `batch` rows: raw
// logits and l' for one chunk, plus the cast hidden states. 0 when out of range.
size_t ControlledSampleWorkspaceBytes(int64_t batch, int64_t valid_vocab, int64_t hidden_dim,
                                      CudaWeightDType weight_dtype);

KernelStatus LaunchControlledSample(const ControlledSampleArgs& args, cublasHandle_t cublas,
                                    cudaStream_t stream);

// Steps 1-8 from given raw logits [batch, valid_vocab] (device, fp32); the
// workspace needs ControlledFromLogitsWorkspaceBytes(batch, valid_vocab)
// (l' of every row). For benchmarks and tests on the same logits.
size_t ControlledFromLogitsWorkspaceBytes(int64_t batch, int64_t valid_vocab);
KernelStatus LaunchControlledSampleFromLogits(const float* logits, const RowParams* params,
                                              int64_t batch, int64_t valid_vocab,
                                              const ControlledDeviceControls& controls,
                                              const ControlledSampleOutputs& outputs,
                                              void* workspace, size_t workspace_bytes,
                                              cudaStream_t stream,
                                              int cluster_blocks = kControlledClusterAuto);

// True when `outputs` holds every output a launch with `controls` writes
// (the required ones, and draft_logprobs when controls.draft_tokens is set)
// and the controls' required parts are set: what every launcher checks
// first. For launchers that enqueue other work before the sampler.
bool ControlledBuffersValid(const ControlledDeviceControls& controls,
                            const ControlledSampleOutputs& outputs);

// Steps 1-8 for one chunk of a larger batch: the rows [row_begin, row_begin +
// rows) from their raw logits [rows, valid_vocab] (device, fp32). params,
// controls and outputs are the whole batch's, indexed by batch row; lp is
// device scratch of rows * valid_vocab floats (the chunk's l'), 16-byte
// aligned. The step a launcher that produces logits chunk by chunk itself
// runs (the sharded one, sharded_sample.h).
KernelStatus LaunchControlledChunkFromLogits(const float* logits, float* lp, int64_t rows,
                                             int64_t row_begin, int64_t valid_vocab,
                                             const RowParams* params,
                                             const ControlledDeviceControls& controls,
                                             const ControlledSampleOutputs& outputs,
                                             cudaStream_t stream,
                                             int cluster_blocks = kControlledClusterAuto);

}  // namespace flashsampler::kernels
