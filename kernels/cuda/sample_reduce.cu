// Stage 2 of the CUDA samplers: merge each row's tile summaries into its token,
// log Z and log-prob. See sample_reduce.cuh for the contract.
//
// One warp per row. Lane k merges a contiguous run of tiles,
// [k * per_lane, (k + 1) * per_lane), in tile order; then the 32 partial
// summaries are merged by a tree that keeps them in lane order (lane k absorbs
// lane k + 1, then k + 2, ...). The result is an ordered, fixed-shape
// reduction of the tiles: the winner is the global argmax (MergeSummaries is
// associative for it) and log Z rounds identically on every launch.
#include "kernels/cuda/sample_reduce.cuh"

namespace flashsampler::kernels::cuda_internal {
namespace {

constexpr int kMergeWarpsPerBlock = 4;  // rows per block
constexpr int kMergeThreads = kMergeWarpsPerBlock * 32;

__global__ void __launch_bounds__(kMergeThreads)
    MergeTileSummariesKernel(const SampleSummary* __restrict__ tile_summaries, int64_t batch,
                             int64_t num_tiles, int32_t* __restrict__ token_ids,
                             float* __restrict__ logz, float* __restrict__ logprobs) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMergeWarpsPerBlock + threadIdx.x / 32;
  if (row >= batch) return;  // uniform across the warp: the shuffles below stay full-warp

  // This lane's contiguous run of tiles.
  const int64_t per_lane = (num_tiles + 31) / 32;
  const int64_t begin = lane * per_lane;
  const int64_t end = begin + per_lane < num_tiles ? begin + per_lane : num_tiles;
  const SampleSummary* tiles = tile_summaries + row * num_tiles;
  SampleSummary s = EmptySampleSummary();
  for (int64_t t = begin; t < end; ++t) s = MergeSummaries(s, tiles[t]);

  // Ordered tree: at step `delta`, lane k (k a multiple of 2*delta) appends the
  // partial of lane k + delta, which covers the tiles right after its own.
  for (unsigned delta = 1; delta < 32; delta *= 2) {
    const SampleSummary next = ShuffleDownSummary(s, delta);
    if (lane % (2 * delta) == 0 && lane + delta < 32) s = MergeSummaries(s, next);
  }

  if (lane == 0) {
    token_ids[row] = s.best_index;
    if (logz != nullptr || logprobs != nullptr) {
      const float row_logz = SummaryLogZ(s);
      if (logz != nullptr) logz[row] = row_logz;
      if (logprobs != nullptr) logprobs[row] = s.best_logit - row_logz;
    }
  }
}

}  // namespace

cudaError_t LaunchMergeTileSummaries(const SampleSummary* tile_summaries, int64_t batch,
                                     int64_t num_tiles, int32_t* token_ids, float* logz,
                                     float* logprobs, cudaStream_t stream) {
  // One warp per row, kMergeWarpsPerBlock rows per block. The callers bound
  // batch by INT32_MAX, so the block count fits a 1-D grid.
  const int64_t blocks = (batch + kMergeWarpsPerBlock - 1) / kMergeWarpsPerBlock;
  MergeTileSummariesKernel<<<static_cast<unsigned>(blocks), kMergeThreads, 0, stream>>>(
      tile_summaries, batch, num_tiles, token_ids, logz, logprobs);
  return cudaGetLastError();
}

KernelStatus CheckSampleArgs(const FusedSampleArgs& args, size_t workspace_alignment) {
  constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
  const size_t elem_bytes = CudaWeightDTypeBytes(args.weight_dtype);
  if (elem_bytes == 0 || args.weight == nullptr || args.hidden == nullptr ||
      args.params == nullptr || args.token_ids == nullptr || args.workspace == nullptr) {
    return KernelStatus::kInvalidArgument;
  }
  if (args.batch < 1 || args.batch > kMaxInt32 || args.vocab < 1 || args.vocab > kMaxInt32 ||
      args.valid_vocab < 1 || args.valid_vocab > args.vocab || args.hidden_dim < 1 ||
      args.hidden_dim > kMaxInt32) {
    return KernelStatus::kInvalidArgument;
  }
  auto aligned = [](const void* p, size_t alignment) {
    return reinterpret_cast<uintptr_t>(p) % alignment == 0;
  };
  if (!aligned(args.weight, elem_bytes) || !aligned(args.hidden, alignof(float)) ||
      !aligned(args.params, alignof(RowParams)) || !aligned(args.workspace, workspace_alignment)) {
    return KernelStatus::kInvalidArgument;
  }
  return KernelStatus::kOk;
}

}  // namespace flashsampler::kernels::cuda_internal
