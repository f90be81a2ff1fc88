// Stage 2 of the CUDA samplers: merge each row's tile summaries into its token,
// log Z and log-prob. See sample_reduce.cuh for the contract.
//
// One block of kMergeThreads threads per row. Thread k merges tiles k,
// k + kMergeThreads, k + 2 kMergeThreads, ... in that order (coalesced loads,
// a few per thread, all independent of the merges so they are in flight
// together); a butterfly merges each warp's 32 partials, and thread 0 merges
// the warps' results in warp order. The shape depends only on num_tiles, so
// the reduction is fixed: the winner is the global argmax (MergeSummaries is
// associative for it) and log Z rounds identically on every launch.
// (Measured: one warp per row walking its tiles took ~25 us at 1187 tiles,
// latency-bound; see kernels/cuda/NOTES-fused.md.)
#include "kernels/cuda/sample_reduce.cuh"

namespace flashsampler::kernels::cuda_internal {
namespace {

constexpr int kMergeThreads = 256;
constexpr int kMergeWarps = kMergeThreads / 32;

// FusedSampleArgs::output_spans by value: kernel parameters, read by one
// thread a row.
struct OutputSpans {
  OutputSpan span[kMaxOutputSpans];
  int32_t count;
};

__global__ void __launch_bounds__(kMergeThreads)
    MergeTileSummariesKernel(const SampleSummary* __restrict__ tile_summaries, int64_t num_tiles,
                             int64_t valid_vocab, int32_t* __restrict__ token_ids,
                             float* __restrict__ logz, float* __restrict__ logprobs,
                             const int32_t* __restrict__ draft_tokens,
                             float* __restrict__ draft_logprobs,
                             SampleSummary* __restrict__ row_summaries, const OutputSpans spans) {
  __shared__ SampleSummary warp_results[kMergeWarps];
  // Launched as a programmatic dependent of stage 1: wait until its tile
  // summaries are written (a no-op for an ordinary launch).
  GridDependencyWait();
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int64_t row = blockIdx.x;

  const SampleSummary* tiles = tile_summaries + row * num_tiles;
  SampleSummary s = EmptySampleSummary();
#pragma unroll 4
  for (int64_t t = threadIdx.x; t < num_tiles; t += kMergeThreads) s = MergeSummaries(s, tiles[t]);
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) s = MergeSummaries(s, ShuffleXorSummary(s, m));
  if (lane == 0) warp_results[warp] = s;
  __syncthreads();

  if (threadIdx.x == 0) {
    s = warp_results[0];
#pragma unroll
    for (int w = 1; w < kMergeWarps; ++w) s = MergeSummaries(s, warp_results[w]);
    if (token_ids != nullptr) token_ids[row] = s.best_index;
    if (row_summaries != nullptr) row_summaries[row] = s;
    // NaN stands in where log Z was not asked for: a span's logz / logprobs
    // are set only when the launch's are (CheckSampleArgs), so it never lands.
    float row_logz = __int_as_float(0x7fffffff);
    if (logz != nullptr || logprobs != nullptr || draft_tokens != nullptr) {
      row_logz = SummaryLogZ(s);
      if (logz != nullptr) logz[row] = row_logz;
      if (logprobs != nullptr) logprobs[row] = s.best_logit - row_logz;
      if (draft_tokens != nullptr) {
        // Stage 1 stored l'_x here (exactly one thread scored x).
        const int32_t x = draft_tokens[row];
        draft_logprobs[row] = x >= 0 && x < valid_vocab ? __fsub_rn(draft_logprobs[row], row_logz)
                                                        : __int_as_float(0x7fffffff);
      }
    }
    // Unrolled with constant indices, so the spans stay in the parameter
    // space instead of a local copy.
#pragma unroll
    for (int k = 0; k < kMaxOutputSpans; ++k) {
      const OutputSpan& span = spans.span[k];
      const int64_t at = row - span.first_row;
      if (k >= spans.count || at < 0 || at >= span.rows) continue;
      span.token_ids[at] = s.best_index;
      if (span.logz != nullptr) span.logz[at] = row_logz;
      if (span.logprobs != nullptr) span.logprobs[at] = s.best_logit - row_logz;
    }
  }
}

}  // namespace

cudaError_t LaunchMergeTileSummaries(const SampleSummary* tile_summaries, int64_t num_tiles,
                                     const FusedSampleArgs& args, cudaStream_t stream) {
  // One block per row. The callers bound batch by INT32_MAX, so the block
  // count fits a 1-D grid.
  // Programmatic dependent launch: the blocks are scheduled while stage 1's
  // last blocks finish and wait in the kernel for its writes.
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config =
      DependentLaunch(dim3(static_cast<unsigned>(args.batch)), dim3(kMergeThreads), 0, stream,
                      &attribute);
  OutputSpans spans{};
  spans.count = args.num_output_spans;  // 0 .. kMaxOutputSpans (CheckSampleArgs)
  for (int k = 0; k < spans.count; ++k) spans.span[k] = args.output_spans[k];
  return cudaLaunchKernelEx(&config, MergeTileSummariesKernel, tile_summaries, num_tiles,
                            args.valid_vocab, args.token_ids, args.logz, args.logprobs,
                            args.draft_tokens, args.draft_logprobs, args.row_summaries, spans);
}

KernelStatus CheckSampleArgs(const FusedSampleArgs& args, size_t workspace_alignment) {
  constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
  const size_t elem_bytes = CudaWeightDTypeBytes(args.weight_dtype);
  const HiddenInWeightDType& in_weight_dtype = args.hidden_in_weight_dtype;
  // Exactly one H: fp32 rows, or rows in the weights' dtype.
  if (elem_bytes == 0 || args.weight == nullptr || (args.hidden == nullptr) == (in_weight_dtype.rows == nullptr) ||
      args.params == nullptr || args.workspace == nullptr ||
      (args.token_ids == nullptr && args.row_summaries == nullptr)) {
    return KernelStatus::kInvalidArgument;
  }
  // A shard's global ids (token_offset + local row) must fit int32, and the
  // offset must keep 4-token Philox blocks aligned (RowSampler::AddFour).
  if (args.token_offset < 0 || args.token_offset % 4 != 0 ||
      args.token_offset > kMaxInt32 - args.vocab) {
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
      !aligned(args.params, alignof(RowParams)) || !aligned(args.workspace, workspace_alignment) ||
      !aligned(args.row_summaries, alignof(SampleSummary))) {
    return KernelStatus::kInvalidArgument;
  }
  if (in_weight_dtype.rows != nullptr) {
    const size_t rows_bytes = static_cast<size_t>(args.batch) * static_cast<size_t>(args.hidden_dim) * 2;
    if (elem_bytes != 2 || !aligned(in_weight_dtype.rows, 16) ||
        !ReportAndRideValid(in_weight_dtype.report, in_weight_dtype.ride,
                            {{in_weight_dtype.rows, rows_bytes}, {args.workspace, args.workspace_bytes}})) {
      return KernelStatus::kInvalidArgument;
    }
  }
  // Draft tokens and their log-probs come together, and only for a whole
  // head: a shard's draft log-prob would need the merged log Z.
  if ((args.draft_tokens == nullptr) != (args.draft_logprobs == nullptr)) {
    return KernelStatus::kInvalidArgument;
  }
  if (args.draft_tokens != nullptr && (args.token_offset != 0 || args.row_summaries != nullptr)) {
    return KernelStatus::kInvalidArgument;
  }
  // Spans take a whole head's results: a shard's are its local winners.
  if (args.num_output_spans < 0 || args.num_output_spans > kMaxOutputSpans ||
      (args.num_output_spans > 0 && (args.token_offset != 0 || args.row_summaries != nullptr))) {
    return KernelStatus::kInvalidArgument;
  }
  for (int k = 0; k < args.num_output_spans; ++k) {
    const OutputSpan& span = args.output_spans[k];
    if (span.first_row < 0 || span.rows < 1 || span.first_row > args.batch - span.rows ||
        span.token_ids == nullptr || !aligned(span.token_ids, alignof(int32_t)) ||
        !aligned(span.logz, alignof(float)) || !aligned(span.logprobs, alignof(float)) ||
        (span.logz != nullptr && args.logz == nullptr) ||
        (span.logprobs != nullptr && args.logprobs == nullptr)) {
      return KernelStatus::kInvalidArgument;
    }
  }
  return KernelStatus::kOk;
}

}  // namespace flashsampler::kernels::cuda_internal
