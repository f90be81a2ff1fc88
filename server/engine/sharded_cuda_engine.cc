// The sharded CUDA Engine: W split by vocabulary over several local GPUs
// (--devices=0,1,...), one process, one stream and one NCCL communicator per
// GPU (ncclCommInitAll). MakeEngine (engine.cc) picks it when more than one
// device is requested; with one device the single-GPU engine (cuda_engine.cc)
// serves.
//
// Layout. PlanVocabShards (vocab_shards.h) cuts [0, valid_vocab) into
// contiguous, tile-aligned shards; GPU k holds only its rows of W (padding
// rows past valid_vocab are not uploaded), so each GPU streams 1/n of W per
// step. Per batch: the fp32 hidden states (rounded to W's dtype, as the
// single-GPU engine does) and RowParams are copied once into pinned memory and
// uploaded to every GPU on its own stream; LaunchShardedSample
// (kernels/cuda/sharded_sample.h) runs every shard's sampler (the fused kernel
// up to --cuda_fused_max_rows rows, the cuBLAS materialized path above, as on
// one GPU), exchanges the per-row summaries (O(B * shards) bytes, never
// logits: an NCCL all-gather, or with --shard_exchange=peer stores from each
// GPU's kernel into GPU 0's memory) and merges them on GPU 0, whose results
// come back through pinned memory. With --shard_merge=exact (the default) the
// tokens are those of one GPU for the same seeds; log Z agrees to fp32
// rounding.
//
// Failure. Every CUDA / NCCL call is checked. The step is awaited with
// WaitForShards under --shard_timeout_s: a device error, an NCCL error or a
// hang aborts the communicators, marks the engine unhealthy (health flips to
// NOT_SERVING) and fails the batch with Internal; it is never retried. A GPU
// that fails to initialise fails MakeEngine with the GPU named.
//
// Controls and drafts. A batch with a sampling control on any row, or with
// draft tokens (Verify), takes one of two paths; the controlled runner
// (cuda_controlled_runner.h, on GPU 0) flattens the controls and assembles
// the result either way, plain rows of such a batch sampling with neutral
// controls:
//  - gathered tile candidates (LaunchShardedFusedControlledSample) when the
//    batch has no drafts, at most --cuda_fused_max_rows rows, and every row
//    is one the fused controlled path serves (top_k <= 64 with any other
//    control, or no filter): each GPU runs the fused controlled stage 1 on
//    its slice, GPU 0 gathers the per-tile summaries and top candidates and
//    runs stage 2: one GPU's fused controlled result, bit for bit. When a
//    tile held more of a row's top-k than it kept, the batch is re-run on
//  - gathered logits (LaunchShardedControlledSample), for everything else:
//    each GPU writes its logits slice with cuBLAS, GPU 0 gathers them into
//    [rows, valid_vocab] and runs the single-GPU materialized controlled
//    sampler over them (global token ids), so every control and the
//    verification behave exactly as on one GPU. It moves rows * valid_vocab
//    floats per step; its buffers are allocated at start-up for
//    max_batch_rows rows (in chunks of at most 256).
//
// Thread safety: as Engine (Sample is serialised by its one caller).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda/fused_controlled_sample.h"
#include "kernels/cuda/fused_sample.h"
#include "kernels/cuda/materialized_sample.h"
#include "kernels/cuda/sharded_sample.h"
#include "server/engine/cuda_controlled_runner.h"
#include "server/engine/cuda_call_status.h"
#include "server/engine/engine.h"
#include "server/engine/vocab_shards.h"

namespace flashsampler {
namespace {

using kernels::CudaWeightDType;
using kernels::KernelStatus;

absl::Status CudaError(int device, const char* what, cudaError_t err) {
  return CudaCallStatus(absl::StrCat("GPU ", device, ": ", what), err);
}

#define FS_SHARD_RETURN_IF_CUDA_ERROR(device, expr)                        \
  do {                                                                     \
    const cudaError_t fs_err = (expr);                                     \
    if (fs_err != cudaSuccess) return CudaError((device), #expr, fs_err);  \
  } while (0)

CudaWeightDType ToCudaDType(WeightDType d) {
  switch (d) {
    case WeightDType::kFloat32: return CudaWeightDType::kFloat32;
    case WeightDType::kFloat16: return CudaWeightDType::kFloat16;
    case WeightDType::kBFloat16: return CudaWeightDType::kBFloat16;
  }
  return CudaWeightDType::kBFloat16;
}

// Everything one GPU holds: its rows of W and the buffers of one batch.
struct ShardState {
  VocabShard range;
  kernels::ShardDevice device;
  void* weight = nullptr;
  void* hidden = nullptr;
  void* params = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* exchange = nullptr;  // kernels::ShardExchangeBytes
  void* controlled_scratch = nullptr;  // kernels::ShardedControlledShardBytes
  size_t controlled_scratch_bytes = 0;
  void* controls = nullptr;  // shards > 0: a copy of the packed controls (fused path)
  size_t controls_capacity = 0;
};

class ShardedCudaEngine final : public Engine {
 public:
  ShardedCudaEngine(const ModelShape& shape, const CudaEngineOptions& options, int64_t max_rows,
                    std::vector<VocabShard> plan)
      : shape_(shape), options_(options), max_rows_(max_rows) {
    shards_.resize(plan.size());
    for (size_t k = 0; k < plan.size(); ++k) {
      shards_[k].range = plan[k];
      shards_[k].device.device = plan[k].device;
    }
  }

  ~ShardedCudaEngine() override {
    for (ShardState& s : shards_) {
      cudaSetDevice(s.device.device);
      // After an abort (unhealthy) the streams may hold failed work; do not wait.
      if (s.device.stream != nullptr && healthy_) cudaStreamSynchronize(s.device.stream);
    }
    for (ShardState& s : shards_) {
      if (s.device.comm != nullptr) ncclCommDestroy(s.device.comm);
    }
    for (ShardState& s : shards_) {
      cudaSetDevice(s.device.device);
      if (s.device.cublas != nullptr) cublasDestroy(s.device.cublas);
      for (void* p : {s.weight, s.hidden, s.params, s.workspace, s.exchange, s.controlled_scratch,
                      s.controls}) {
        cudaFree(p);
      }
      if (s.device.stream != nullptr) cudaStreamDestroy(s.device.stream);
    }
    if (!shards_.empty()) {
      cudaSetDevice(shards_[0].device.device);
      for (void* p : {tokens_, logz_, logprobs_, drafts_, gather_scratch_, fused_gather_scratch_}) {
        cudaFree(p);
      }
    }
    for (void* p : {host_hidden_, host_params_, host_tokens_, host_logz_, host_logprobs_,
                    host_drafts_}) {
      cudaFreeHost(p);
    }
  }

  // Uploads every shard's rows of W, allocates the buffers for batches of up
  // to max_rows_ rows and creates the communicators.
  absl::Status Init(const LmHead& head) {
    const CudaWeightDType dtype = ToCudaDType(shape_.weight_dtype);
    const size_t elem_bytes = kernels::CudaWeightDTypeBytes(dtype);
    const size_t row_bytes = static_cast<size_t>(shape_.hidden_size) * elem_bytes;
    const size_t rows = static_cast<size_t>(max_rows_);
    const size_t hidden_bytes = rows * shape_.hidden_size * sizeof(float);
    const int32_t n = static_cast<int32_t>(shards_.size());
    const size_t exchange_bytes = kernels::ShardExchangeBytes(max_rows_, n);
    if (exchange_bytes == 0) return absl::InvalidArgumentError("batch too large for sharding");
    const int64_t fused_rows = std::min<int64_t>(max_rows_, options_.fused_max_rows);
    // The fused controlled path across shards: 16-bit W whose whole
    // vocabulary fits its stage 2 (each shard's slice then fits too).
    const bool fused_controlled =
        fused_rows > 0 &&
        kernels::FusedControlledShapeSupported(dtype, shape_.valid_vocab, shape_.hidden_size);
    for (ShardState& s : shards_) {
      const int d = s.device.device;
      const int64_t shard_rows = s.range.end - s.range.begin;
      FS_SHARD_RETURN_IF_CUDA_ERROR(d, cudaSetDevice(d));
      FS_SHARD_RETURN_IF_CUDA_ERROR(d, cudaStreamCreateWithFlags(&s.device.stream, cudaStreamNonBlocking));
      if (cublasCreate(&s.device.cublas) != CUBLAS_STATUS_SUCCESS) {
        s.device.cublas = nullptr;
        return absl::InternalError(absl::StrCat("GPU ", d, ": cublasCreate failed"));
      }
      const size_t weight_bytes = static_cast<size_t>(shard_rows) * row_bytes;
      FS_SHARD_RETURN_IF_CUDA_ERROR(d, cudaMalloc(&s.weight, weight_bytes));
      // Rows [begin, end) straight from the mapping; nothing is staged.
      FS_SHARD_RETURN_IF_CUDA_ERROR(
          d, cudaMemcpy(s.weight, static_cast<const char*>(head.data()) + s.range.begin * row_bytes,
                        weight_bytes, cudaMemcpyHostToDevice));
      FS_SHARD_RETURN_IF_CUDA_ERROR(d, cudaMalloc(&s.hidden, hidden_bytes));
      FS_SHARD_RETURN_IF_CUDA_ERROR(d, cudaMalloc(&s.params, rows * sizeof(RowParams)));
      FS_SHARD_RETURN_IF_CUDA_ERROR(d, cudaMalloc(&s.exchange, exchange_bytes));
      s.workspace_bytes = std::max(
          kernels::FusedSampleWorkspaceBytes(fused_rows, shard_rows, shape_.hidden_size),
          kernels::MaterializedSampleWorkspaceBytes(max_rows_, shard_rows, shape_.hidden_size,
                                                    dtype));
      if (fused_controlled) {
        s.workspace_bytes = std::max(
            s.workspace_bytes,
            kernels::FusedControlledWorkspaceBytes(fused_rows, shard_rows, shape_.hidden_size));
      }
      if (s.workspace_bytes == 0) return absl::InvalidArgumentError("model too large for the CUDA backend");
      FS_SHARD_RETURN_IF_CUDA_ERROR(d, cudaMalloc(&s.workspace, s.workspace_bytes));
      s.controlled_scratch_bytes =
          kernels::ShardedControlledShardBytes(max_rows_, shard_rows, shape_.hidden_size, dtype);
      if (s.controlled_scratch_bytes == 0) {
        return absl::InvalidArgumentError("model too large for the sharded CUDA backend");
      }
      FS_SHARD_RETURN_IF_CUDA_ERROR(d, cudaMalloc(&s.controlled_scratch, s.controlled_scratch_bytes));
    }
    const int d0 = shards_[0].device.device;
    FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaSetDevice(d0));
    FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaMalloc(&tokens_, rows * sizeof(int32_t)));
    FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaMalloc(&logz_, rows * sizeof(float)));
    FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaMalloc(&logprobs_, rows * sizeof(float)));
    FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaMallocHost(&host_hidden_, hidden_bytes));
    FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaMallocHost(&host_params_, rows * sizeof(RowParams)));
    FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaMallocHost(&host_tokens_, rows * sizeof(int32_t)));
    FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaMallocHost(&host_logz_, rows * sizeof(float)));
    FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaMallocHost(&host_logprobs_, rows * sizeof(float)));
    FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaMalloc(&drafts_, rows * sizeof(int32_t)));
    FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaMallocHost(&host_drafts_, rows * sizeof(int32_t)));
    gather_bytes_ = kernels::ShardedControlledGatherBytes(max_rows_, shape_.valid_vocab);
    if (gather_bytes_ == 0) return absl::InvalidArgumentError("model too large for the sharded CUDA backend");
    FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaMalloc(&gather_scratch_, gather_bytes_));
    if (fused_controlled) {
      fused_gather_bytes_ = kernels::ShardedFusedControlledGatherBytes(fused_rows, shape_.valid_vocab);
      FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaMalloc(&fused_gather_scratch_, fused_gather_bytes_));
    }
    // The controlled runner's buffers live on GPU 0 (current device).
    if (absl::Status s = controlled_.Init(max_rows_, /*fused_max_rows=*/0); !s.ok()) return s;

    // One communicator per GPU, rank k = shard k.
    std::vector<ncclComm_t> comms(shards_.size(), nullptr);
    std::vector<int> ordinals;
    for (const ShardState& s : shards_) ordinals.push_back(s.device.device);
    if (const ncclResult_t r = ncclCommInitAll(comms.data(), n, ordinals.data()); r != ncclSuccess) {
      return absl::InternalError(absl::StrCat("ncclCommInitAll over GPUs ", absl::StrJoin(ordinals, ","),
                                              " failed: ", ncclGetErrorString(r)));
    }
    for (size_t k = 0; k < shards_.size(); ++k) shards_[k].device.comm = comms[k];
    return EnablePeerCopies();
  }

  // The controlled paths copy every shard's logits or tile outputs to GPU 0
  // (cudaMemcpy3DPeerAsync). With peer access those copies go GPU to GPU over
  // NVLink / PCIe; without it the driver stages them through the host, which
  // is slower but correct, so GPUs that cannot reach each other only cost
  // speed. Access may already be on (NCCL turns it on for the links it uses).
  // --shard_exchange=peer has each shard's kernel store into GPU 0's memory,
  // which needs access from every GPU to GPU 0: refused without it.
  absl::Status EnablePeerCopies() {
    const int d0 = shards_[0].device.device;
    const bool peer_exchange = options_.shard_exchange == ShardExchange::kPeerWrite;
    for (size_t k = 1; k < shards_.size(); ++k) {
      const int dk = shards_[k].device.device;
      for (const auto& [from, to] : {std::pair<int, int>{d0, dk}, std::pair<int, int>{dk, d0}}) {
        int can = 0;
        FS_SHARD_RETURN_IF_CUDA_ERROR(from, cudaDeviceCanAccessPeer(&can, from, to));
        if (can == 0 && peer_exchange && to == d0) {
          return absl::FailedPreconditionError(absl::StrCat(
              "--shard_exchange=peer: GPU ", from, " cannot access GPU ", d0,
              "'s memory (no peer access between them); use --shard_exchange=nccl"));
        }
        if (can == 0) continue;
        FS_SHARD_RETURN_IF_CUDA_ERROR(from, cudaSetDevice(from));
        const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled) {
          cudaGetLastError();  // not sticky: clear it so no later check sees it
        } else if (err != cudaSuccess) {
          return CudaError(from, "cudaDeviceEnablePeerAccess", err);
        }
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<SampleResult> Sample(const SampleBatch& batch) override {
    if (!healthy_) {
      return absl::UnavailableError("the sharded CUDA backend failed earlier and is not serving");
    }
    if (absl::Status s = CheckBatchLayout(batch, shape_.hidden_size, max_rows_, "sharded cuda engine");
        !s.ok()) {
      return s;
    }
    absl::StatusOr<SampleResult> result = Run(batch);
    if (!result.ok() && result.status().code() == absl::StatusCode::kInternal) healthy_ = false;
    return result;
  }

  const ModelShape& shape() const override { return shape_; }
  std::string backend_name() const override { return "cuda"; }
  bool healthy() const override { return healthy_; }
  // Draft rows take the gathered-logits path, with or without controls.
  bool serves_draft_rows(bool /*with_controls*/) const override { return true; }
  // One entry per shard's GPU (the metrics' `shards` label counts them).
  std::vector<DeviceMemoryInfo> DeviceMemory() const override {
    std::vector<DeviceMemoryInfo> out;
    for (const ShardState& s : shards_) {
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaSetDevice(s.device.device) != cudaSuccess ||
          cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        return {};
      }
      out.push_back(DeviceMemoryInfo{s.device.device, static_cast<int64_t>(total_bytes - free_bytes),
                                     static_cast<int64_t>(total_bytes)});
    }
    return out;
  }

 private:
  absl::StatusOr<SampleResult> Run(const SampleBatch& batch) {
    const int64_t rows = batch.rows;
    const size_t hidden_bytes = batch.hidden.size() * sizeof(float);
    std::memcpy(host_hidden_, batch.hidden.data(), hidden_bytes);
    // Every shard and both launch paths see the same (exactly representable)
    // inputs; the request parser has usually rounded them already.
    if (absl::Status s = batch.hidden_in_weight_dtype
                             ? absl::OkStatus()
                             : RoundHiddenToWeightDType(shape_.weight_dtype,
                                                        static_cast<float*>(host_hidden_),
                                                        static_cast<int64_t>(batch.hidden.size()),
                                                        shape_.hidden_size, "hidden_states",
                                                        batch.request_row_offset);
        !s.ok()) {
      return s;
    }
    std::memcpy(host_params_, batch.params.data(), rows * sizeof(RowParams));
    const bool drafts = !batch.draft_tokens.empty();
    if (drafts || PlanCudaSamplerPath(batch, options_.fused_max_rows) == CudaSamplerPath::kControlled) {
      return RunControlled(batch);
    }

    const int32_t n = static_cast<int32_t>(shards_.size());
    std::vector<kernels::FusedSampleArgs> args(n);
    std::vector<void*> exchange(n);
    std::vector<kernels::ShardDevice> devices(n);
    for (int32_t k = 0; k < n; ++k) {
      ShardState& s = shards_[k];
      if (absl::Status st = UploadToShard(s, hidden_bytes, rows, /*with_params=*/true); !st.ok()) {
        return st;
      }
      kernels::FusedSampleArgs& a = args[k];
      a.weight = s.weight;
      a.weight_dtype = ToCudaDType(shape_.weight_dtype);
      a.hidden = static_cast<const float*>(s.hidden);
      a.params = static_cast<const RowParams*>(s.params);
      a.batch = rows;
      a.vocab = s.range.end - s.range.begin;
      a.valid_vocab = a.vocab;
      a.hidden_dim = shape_.hidden_size;
      a.token_offset = s.range.begin;
      a.workspace = s.workspace;
      a.workspace_bytes = s.workspace_bytes;
      exchange[k] = s.exchange;
      devices[k] = s.device;
    }
    kernels::ShardedSampleArgs sharded;
    sharded.shard_args = args.data();
    sharded.exchange = exchange.data();
    sharded.devices = devices.data();
    sharded.num_shards = n;
    sharded.mode = options_.shard_merge;
    sharded.exchange_mode = options_.shard_exchange;
    sharded.materialized = rows > options_.fused_max_rows;
    sharded.token_ids = static_cast<int32_t*>(tokens_);
    sharded.logz = batch.want_logz ? static_cast<float*>(logz_) : nullptr;
    sharded.logprobs = batch.want_logprobs ? static_cast<float*>(logprobs_) : nullptr;
    const KernelStatus launch = kernels::LaunchShardedSample(sharded);

    cudaStream_t stream0 = shards_[0].device.stream;
    absl::Status copy_status = absl::OkStatus();
    if (launch == KernelStatus::kOk) {
      auto copy_back = [&](void* host, const void* device, size_t bytes) {
        if (!copy_status.ok()) return;
        const cudaError_t err = cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream0);
        if (err != cudaSuccess) copy_status = CudaError(shards_[0].device.device, "cudaMemcpyAsync", err);
      };
      cudaSetDevice(shards_[0].device.device);
      copy_back(host_tokens_, tokens_, rows * sizeof(int32_t));
      if (batch.want_logz) copy_back(host_logz_, logz_, rows * sizeof(float));
      if (batch.want_logprobs) copy_back(host_logprobs_, logprobs_, rows * sizeof(float));
    }
    // Always wait (bounded), even after a failed launch: earlier shards' work
    // may be in flight and owns the buffers.
    if (absl::Status s = AwaitShards(devices); !s.ok()) return s;
    if (launch != KernelStatus::kOk) return KernelStatusToStatus(launch, "sharded cuda sampler launch");
    if (!copy_status.ok()) return copy_status;

    // Controls that are all neutral reach here (details: one sample per row).
    SampleResult result = SampleResultFromHostOutputs(
        batch, static_cast<const int32_t*>(host_tokens_), static_cast<const float*>(host_logz_),
        static_cast<const float*>(host_logprobs_), nullptr);
    result.path = LaunchPath::kSharded;
    return result;
  }

  // Waits (bounded) for every shard's stream; on an error or a hang the
  // communicators are aborted (their handles become null) and the step fails
  // with Internal.
  absl::Status AwaitShards(std::vector<kernels::ShardDevice>& devices) {
    const int32_t n = static_cast<int32_t>(devices.size());
    std::string wait_error;
    const KernelStatus waited =
        kernels::WaitForShards(devices.data(), n, options_.shard_timeout_s, &wait_error);
    for (int32_t k = 0; k < n; ++k) shards_[k].device.comm = devices[k].comm;  // null if aborted
    if (waited != KernelStatus::kOk) {
      return absl::InternalError(absl::StrCat("sharded sampling step failed: ", wait_error));
    }
    return absl::OkStatus();
  }

  // Enqueues the copy of the batch's (pinned) hidden states to shard s's GPU,
  // and of its params when `with_params`, on the shard's stream.
  absl::Status UploadToShard(ShardState& s, size_t hidden_bytes, int64_t rows, bool with_params) {
    const int d = s.device.device;
    FS_SHARD_RETURN_IF_CUDA_ERROR(d, cudaSetDevice(d));
    FS_SHARD_RETURN_IF_CUDA_ERROR(d, cudaMemcpyAsync(s.hidden, host_hidden_, hidden_bytes,
                                                     cudaMemcpyHostToDevice, s.device.stream));
    if (with_params) {
      FS_SHARD_RETURN_IF_CUDA_ERROR(d, cudaMemcpyAsync(s.params, host_params_, rows * sizeof(RowParams),
                                                       cudaMemcpyHostToDevice, s.device.stream));
    }
    return absl::OkStatus();
  }

  // A batch with controls or drafts (header comment): the fused controlled
  // path when every row is one it serves (no drafts, at most
  // --cuda_fused_max_rows rows), re-run on the gathered-logits path when it
  // hands the batch back; the gathered-logits path otherwise.
  absl::StatusOr<SampleResult> RunControlled(const SampleBatch& batch) {
    const bool try_fused = fused_gather_scratch_ != nullptr && batch.draft_tokens.empty() &&
                           batch.rows <= options_.fused_max_rows;
    absl::StatusOr<SampleResult> result = RunControlledOnShards(batch, try_fused);
    if (try_fused && result.ok() && controlled_.fused_row_not_served()) {
      result = RunControlledOnShards(batch, /*try_fused=*/false);
    }
    return result;
  }

  // One launch of LaunchShardedFusedControlledSample (when try_fused and
  // every row is one it serves) or LaunchShardedControlledSample: the hidden
  // states go to every GPU; the params, drafts and controls to GPU 0, and for
  // the fused path the params and controls to every GPU.
  absl::StatusOr<SampleResult> RunControlledOnShards(const SampleBatch& batch, bool try_fused) {
    bool fused = try_fused;
    const int64_t rows = batch.rows;
    const size_t hidden_bytes = batch.hidden.size() * sizeof(float);
    const int32_t n = static_cast<int32_t>(shards_.size());
    std::vector<kernels::ShardDevice> devices(n);
    for (int32_t k = 0; k < n; ++k) devices[k] = shards_[k].device;
    // Everything enqueued is awaited (bounded) before returning, whatever
    // fails on the way: the buffers belong to the work in flight.
    absl::Status enqueued = [&]() -> absl::Status {
      for (int32_t k = 0; k < n; ++k) {
        if (absl::Status st = UploadToShard(shards_[k], hidden_bytes, rows, try_fused || k == 0);
            !st.ok()) {
          return st;
        }
      }
      ShardState& s0 = shards_[0];
      const int d0 = s0.device.device;
      cudaStream_t stream0 = s0.device.stream;
      FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaSetDevice(d0));
      const bool drafts = !batch.draft_tokens.empty();
      if (drafts) {
        std::memcpy(host_drafts_, batch.draft_tokens.data(), rows * sizeof(int32_t));
        FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaMemcpyAsync(drafts_, host_drafts_, rows * sizeof(int32_t),
                                                          cudaMemcpyHostToDevice, stream0));
      }
      absl::StatusOr<CudaControlledRunner::LaunchBuffers> buffers = controlled_.Prepare(
          batch, shape_, drafts ? static_cast<const int32_t*>(drafts_) : nullptr, stream0);
      if (!buffers.ok()) return buffers.status();
      const kernels::FlatControls& flat = controlled_.flat_controls();
      fused = fused && controlled_.fused_serves_every_row();
      kernels::ShardedControlledBatch common;
      common.devices = devices.data();
      common.num_shards = n;
      common.weight_dtype = ToCudaDType(shape_.weight_dtype);
      common.batch = rows;
      common.hidden_dim = shape_.hidden_size;
      common.valid_vocab = shape_.valid_vocab;
      common.params = static_cast<const RowParams*>(s0.params);
      common.controls = buffers->controls;
      common.outputs = buffers->outputs;
      KernelStatus launch = KernelStatus::kOk;
      if (fused) {
        std::vector<kernels::ShardedFusedControlledShard> slices(n);
        for (int32_t k = 0; k < n; ++k) {
          ShardState& s = shards_[k];
          kernels::ShardedFusedControlledShard& slice = slices[k];
          slice.weight = s.weight;
          slice.hidden = static_cast<const float*>(s.hidden);
          slice.params = static_cast<const RowParams*>(s.params);
          slice.begin = s.range.begin;
          slice.end = s.range.end;
          slice.workspace = s.workspace;
          slice.workspace_bytes = s.workspace_bytes;
          if (k == 0) {
            slice.controls = buffers->controls;
            continue;
          }
          // The packed controls (pinned on the host since Prepare) to GPU k.
          if (absl::Status st = EnsureShardControls(s, flat.PackedBytes()); !st.ok()) return st;
          FS_SHARD_RETURN_IF_CUDA_ERROR(s.device.device, cudaSetDevice(s.device.device));
          FS_SHARD_RETURN_IF_CUDA_ERROR(
              s.device.device, cudaMemcpyAsync(s.controls, controlled_.packed_controls_host(),
                                               flat.PackedBytes(), cudaMemcpyHostToDevice,
                                               s.device.stream));
          slice.controls = flat.DeviceView(s.controls);
        }
        kernels::ShardedFusedControlledArgs args{common, slices.data()};
        args.gather_scratch = fused_gather_scratch_;
        args.gather_scratch_bytes = fused_gather_bytes_;
        launch = kernels::LaunchShardedFusedControlledSample(args);
      } else {
        std::vector<kernels::ShardedControlledShard> slices(n);
        for (int32_t k = 0; k < n; ++k) {
          ShardState& s = shards_[k];
          slices[k] = kernels::ShardedControlledShard{s.weight, static_cast<const float*>(s.hidden),
                                                      s.range.begin, s.range.end,
                                                      s.controlled_scratch, s.controlled_scratch_bytes};
        }
        kernels::ShardedControlledArgs args{common, slices.data()};
        args.gather_scratch = gather_scratch_;
        args.gather_scratch_bytes = gather_bytes_;
        launch = kernels::LaunchShardedControlledSample(args);
      }
      if (launch != KernelStatus::kOk) {
        return KernelStatusToStatus(launch, "sharded cuda controlled sampler launch");
      }
      FS_SHARD_RETURN_IF_CUDA_ERROR(d0, cudaSetDevice(d0));
      return controlled_.EnqueueDownloads(batch, stream0);
    }();
    if (absl::Status s = AwaitShards(devices); !s.ok()) return s;
    if (!enqueued.ok()) return enqueued;
    absl::StatusOr<SampleResult> result = controlled_.Collect(batch);
    if (result.ok()) {
      result->path = fused ? LaunchPath::kShardedFusedControlled : LaunchPath::kShardedControlled;
    }
    return result;
  }

  // Grows shard s's device copy of the packed controls (no work of an earlier
  // batch is in flight: every step is awaited).
  absl::Status EnsureShardControls(ShardState& s, size_t bytes) {
    if (bytes <= s.controls_capacity) return absl::OkStatus();
    const size_t capacity = std::max(bytes, 2 * s.controls_capacity);
    // On the shard's own GPU: its stage 1 reads the controls in every block.
    FS_SHARD_RETURN_IF_CUDA_ERROR(s.device.device, cudaSetDevice(s.device.device));
    cudaFree(s.controls);
    s.controls = nullptr;
    s.controls_capacity = 0;
    FS_SHARD_RETURN_IF_CUDA_ERROR(s.device.device, cudaMalloc(&s.controls, capacity));
    s.controls_capacity = capacity;
    return absl::OkStatus();
  }

  const ModelShape shape_;
  const CudaEngineOptions options_;
  const int64_t max_rows_;
  std::atomic<bool> healthy_{true};
  std::vector<ShardState> shards_;
  // On shard 0's device: the merged outputs.
  void* tokens_ = nullptr;
  void* logz_ = nullptr;
  void* logprobs_ = nullptr;
  void* host_hidden_ = nullptr;
  void* host_params_ = nullptr;
  void* host_tokens_ = nullptr;
  void* host_logz_ = nullptr;
  void* host_logprobs_ = nullptr;
  void* drafts_ = nullptr;  // GPU 0, [max_rows]
  void* host_drafts_ = nullptr;
  void* gather_scratch_ = nullptr;  // GPU 0, kernels::ShardedControlledGatherBytes
  size_t gather_bytes_ = 0;
  // GPU 0, kernels::ShardedFusedControlledGatherBytes; null when the fused
  // controlled path cannot serve this head (or --cuda_fused_max_rows is 0).
  void* fused_gather_scratch_ = nullptr;
  size_t fused_gather_bytes_ = 0;
  // On GPU 0; destroyed after ~ShardedCudaEngine's body has waited for the streams.
  CudaControlledRunner controlled_;
};

}  // namespace

// Declared in engine.cc, its only caller (MakeEngine with several devices).
absl::StatusOr<std::unique_ptr<Engine>> MakeShardedCudaEngine(const LmHead& head,
                                                              int64_t valid_vocab,
                                                              int64_t max_batch_rows,
                                                              const CudaEngineOptions& options) {
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess || count == 0) {
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device is usable: ", err == cudaSuccess ? "none found" : cudaGetErrorString(err)));
  }
  for (int d : options.devices) {
    if (d < 0 || d >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA device ", d, " does not exist (", count, " visible)"));
    }
  }
  if (max_batch_rows < 1) return absl::InvalidArgumentError("max_batch_rows must be >= 1");
  if (!(options.shard_timeout_s > 0.0)) {
    return absl::InvalidArgumentError("shard_timeout_s must be > 0");
  }
  absl::StatusOr<ModelShape> shape = ResolveModelShape(head, valid_vocab);
  if (!shape.ok()) return shape.status();
  absl::StatusOr<std::vector<VocabShard>> plan =
      PlanVocabShards(shape->valid_vocab, options.devices, options.shard_split);
  if (!plan.ok()) return plan.status();
  auto engine = std::make_unique<ShardedCudaEngine>(*shape, options, max_batch_rows, *std::move(plan));
  if (absl::Status s = engine->Init(head); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("sharded CUDA backend initialisation failed: ", s.message()));
  }
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace flashsampler
