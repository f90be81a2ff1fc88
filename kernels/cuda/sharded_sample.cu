// Sharded sampling over the local GPUs: per-shard samplers, one NCCL
// all-gather of per-row summaries, the merge on shard 0. Contract:
// sharded_sample.h. Reads top to bottom: exchange layout, the merge kernel,
// the launcher, the bounded wait.
#include "kernels/cuda/sharded_sample.h"

#include <cuda_runtime.h>

#include <chrono>
#include <limits>
#include <thread>

#include "kernels/cuda/materialized_sample.h"

namespace flashsampler::kernels {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// ---- Exchange buffer of one shard ----------------------------------------------
// [gathered: num_shards * batch SampleSummary, shard-major (NCCL's all-gather
// layout: rank k's batch summaries at k * batch)][shard log Z: batch floats],
// the second part from a 256-byte boundary.
size_t GatheredBytes(int64_t batch, int32_t num_shards) {
  const size_t bytes = static_cast<size_t>(batch) * static_cast<size_t>(num_shards) *
                       sizeof(SampleSummary);
  return (bytes + 255) / 256 * 256;
}

// ---- Merge on shard 0 ---------------------------------------------------------
// One thread per row; 20 * num_shards bytes per row, a few microseconds even
// at thousands of rows.
constexpr int kMergeThreads = 128;

__global__ void __launch_bounds__(kMergeThreads)
    MergeShardSummariesKernel(const SampleSummary* __restrict__ gathered, int64_t batch,
                              int32_t num_shards, const RowParams* __restrict__ params,
                              ShardMergeMode mode, int32_t* __restrict__ token_ids,
                              float* __restrict__ logz, float* __restrict__ logprobs) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMergeThreads + threadIdx.x;
  if (row >= batch) return;
  const SampleSummary s = MergeShardSummaries(gathered + row, batch, num_shards, params[row], mode);
  token_ids[row] = s.best_index;
  if (logz != nullptr || logprobs != nullptr) {
    const float row_logz = SummaryLogZ(s);
    if (logz != nullptr) logz[row] = row_logz;
    if (logprobs != nullptr) logprobs[row] = s.best_logit - row_logz;
  }
}

KernelStatus FromCuda(cudaError_t err) {
  return err == cudaSuccess ? KernelStatus::kOk : KernelStatus::kDeviceError;
}

}  // namespace

size_t ShardExchangeBytes(int64_t batch, int32_t num_shards) {
  if (batch < 1 || batch > kMaxInt32 || num_shards < 1 || num_shards > 1024) return 0;
  return GatheredBytes(batch, num_shards) + static_cast<size_t>(batch) * sizeof(float);
}

cudaError_t LaunchMergeShardSummaries(const SampleSummary* gathered, int64_t batch,
                                      int32_t num_shards, const RowParams* params,
                                      ShardMergeMode mode, int32_t* token_ids, float* logz,
                                      float* logprobs, cudaStream_t stream) {
  const int64_t blocks = (batch + kMergeThreads - 1) / kMergeThreads;
  MergeShardSummariesKernel<<<static_cast<unsigned>(blocks), kMergeThreads, 0, stream>>>(
      gathered, batch, num_shards, params, mode, token_ids, logz, logprobs);
  return cudaGetLastError();
}

KernelStatus LaunchShardedSample(const ShardedSampleArgs& args) {
  // ---- Arguments (nothing is enqueued when they are wrong).
  if (args.num_shards < 1 || args.shard_args == nullptr || args.exchange == nullptr ||
      args.devices == nullptr || args.token_ids == nullptr) {
    return KernelStatus::kInvalidArgument;
  }
  const int32_t n = args.num_shards;
  const int64_t batch = args.shard_args[0].batch;
  if (ShardExchangeBytes(batch, n) == 0) return KernelStatus::kInvalidArgument;
  for (int32_t k = 0; k < n; ++k) {
    const FusedSampleArgs& a = args.shard_args[k];
    if (a.batch != batch || args.exchange[k] == nullptr ||
        reinterpret_cast<uintptr_t>(args.exchange[k]) % 256 != 0 ||
        (n > 1 && args.devices[k].comm == nullptr) ||
        (args.materialized && args.devices[k].cublas == nullptr)) {
      return KernelStatus::kInvalidArgument;
    }
  }
  // The shard log-masses are needed for log Z / log-probs and for choosing a
  // shard in kGroupGumbel mode; otherwise the shards skip the exponentials.
  const bool want_lse =
      args.logz != nullptr || args.logprobs != nullptr || args.mode == ShardMergeMode::kGroupGumbel;
  const size_t slot_bytes = static_cast<size_t>(batch) * sizeof(SampleSummary);

  // ---- 1. Every shard's sampler; its row summaries go to its own slot of its
  // gathered buffer (the in-place all-gather's send buffer).
  for (int32_t k = 0; k < n; ++k) {
    char* exchange = static_cast<char*>(args.exchange[k]);
    FusedSampleArgs a = args.shard_args[k];
    a.token_ids = nullptr;
    a.logprobs = nullptr;
    a.row_summaries = reinterpret_cast<SampleSummary*>(exchange) + static_cast<int64_t>(k) * batch;
    a.logz = want_lse ? reinterpret_cast<float*>(exchange + GatheredBytes(batch, n)) : nullptr;
    if (cudaSetDevice(args.devices[k].device) != cudaSuccess) return KernelStatus::kDeviceError;
    const KernelStatus s = args.materialized
                               ? LaunchMaterializedSample(a, args.devices[k].cublas,
                                                          args.devices[k].stream)
                               : LaunchFusedSample(a, args.devices[k].stream);
    if (s != KernelStatus::kOk) return s;
  }

  // ---- 2. One all-gather of the summaries (bytes: batch * n * 20). A group,
  // because one thread drives every communicator.
  if (n > 1) {
    if (ncclGroupStart() != ncclSuccess) return KernelStatus::kDeviceError;
    ncclResult_t result = ncclSuccess;
    for (int32_t k = 0; k < n && result == ncclSuccess; ++k) {
      char* gathered = static_cast<char*>(args.exchange[k]);
      result = ncclAllGather(gathered + k * slot_bytes, gathered, slot_bytes, ncclUint8,
                             args.devices[k].comm, args.devices[k].stream);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (result != ncclSuccess || end != ncclSuccess) return KernelStatus::kDeviceError;
  }

  // ---- 3. The merge on shard 0, after its all-gather in stream order.
  if (cudaSetDevice(args.devices[0].device) != cudaSuccess) return KernelStatus::kDeviceError;
  return FromCuda(LaunchMergeShardSummaries(
      static_cast<const SampleSummary*>(args.exchange[0]), batch, n, args.shard_args[0].params,
      args.mode, args.token_ids, args.logz, args.logprobs, args.devices[0].stream));
}

KernelStatus WaitForShards(ShardDevice* devices, int32_t num_shards, double timeout_seconds,
                           std::string* error) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout_seconds));
  std::string what;
  for (int64_t spin = 0;; ++spin) {
    bool all_done = true;
    for (int32_t k = 0; k < num_shards && what.empty(); ++k) {
      const cudaError_t err = cudaStreamQuery(devices[k].stream);
      if (err == cudaErrorNotReady) {
        all_done = false;
      } else if (err != cudaSuccess) {
        what = std::string("GPU ") + std::to_string(devices[k].device) + ": " +
               cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
      }
      if (devices[k].comm != nullptr) {
        ncclResult_t async = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(devices[k].comm, &async);
        if (r != ncclSuccess || async != ncclSuccess) {
          what = std::string("NCCL on GPU ") + std::to_string(devices[k].device) + ": " +
                 ncclGetErrorString(r != ncclSuccess ? r : async);
        }
      }
    }
    if (what.empty() && all_done) return KernelStatus::kOk;
    if (what.empty() && Clock::now() > deadline) {
      what = "the shards did not finish within " + std::to_string(timeout_seconds) +
             " s (a GPU or the NCCL exchange hung)";
    }
    if (!what.empty()) break;
    // A step takes tens to hundreds of microseconds: spin first, then yield.
    if (spin > 1000) std::this_thread::yield();
  }
  // Abort every communicator: frees peers blocked in the all-gather.
  for (int32_t k = 0; k < num_shards; ++k) {
    if (devices[k].comm != nullptr) {
      ncclCommAbort(devices[k].comm);
      devices[k].comm = nullptr;
    }
  }
  if (error != nullptr) *error = what;
  return KernelStatus::kDeviceError;
}

}  // namespace flashsampler::kernels
