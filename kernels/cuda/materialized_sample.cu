// Materialized baseline: cuBLAS logits to device memory, then a standalone
// Gumbel-max kernel. What it computes and why: materialized_sample.h. Reads top
// to bottom: workspace layout, the Gumbel-max kernel, the launcher (whose
// GEMM step is logits_gemm.h's).
#include "kernels/cuda/materialized_sample.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "kernels/common/gumbel_noise.h"
#include "kernels/common/sample_summary.h"
#include "kernels/cuda/logits_gemm.h"
#include "kernels/cuda/sample_reduce.cuh"

namespace flashsampler::kernels {
namespace {

using cuda_internal::ShuffleXorSummary;
using cuda_internal::StatusFromCuda;
using cuda_internal::RowSampler;

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// ---- Workspace layout ---------------------------------------------------------
// [logits: batch * vocab fp32][cast hidden: batch * hidden_dim 16-bit, only for
// 16-bit weights][tile summaries: batch * num_tiles], each part 256-byte aligned.
constexpr int kGumbelThreads = 256;
constexpr int64_t kGumbelTileVocab = 1024;  // tokens per block of the Gumbel-max kernel

int64_t NumTiles(int64_t vocab) { return (vocab + kGumbelTileVocab - 1) / kGumbelTileVocab; }

size_t AlignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

struct WorkspaceLayout {
  size_t logits_offset = 0;
  size_t cast_offset = 0;
  size_t summaries_offset = 0;
  size_t total = 0;  // 0: sizes out of range
};

WorkspaceLayout Layout(int64_t batch, int64_t vocab, int64_t hidden_dim, CudaWeightDType dtype) {
  WorkspaceLayout l;
  if (batch < 1 || batch > kMaxInt32 || vocab < 1 || vocab > kMaxInt32 || hidden_dim < 1 ||
      hidden_dim > kMaxInt32 || CudaWeightDTypeBytes(dtype) == 0) {
    return l;
  }
  // Each product is at most 2^31 * 2^31 * 20 < 2^67: check against size_t first.
  const size_t b = static_cast<size_t>(batch);
  const size_t max = std::numeric_limits<size_t>::max() / 4;
  if (b > max / static_cast<size_t>(vocab) / sizeof(float)) return l;
  const size_t logits_bytes = AlignUp(b * static_cast<size_t>(vocab) * sizeof(float));
  const size_t cast_bytes =
      dtype == CudaWeightDType::kFloat32 ? 0 : AlignUp(b * static_cast<size_t>(hidden_dim) * 2);
  const size_t summary_bytes =
      AlignUp(b * static_cast<size_t>(NumTiles(vocab)) * sizeof(SampleSummary));
  l.logits_offset = 0;
  l.cast_offset = logits_bytes;
  l.summaries_offset = logits_bytes + cast_bytes;
  l.total = logits_bytes + cast_bytes + summary_bytes;
  return l;
}

// ---- Gumbel-max over materialized logits ------------------------------------------
// Block b handles row b / num_tiles and tokens [tile * 1024, tile * 1024 + 1024)
// of it, tile = b % num_tiles. Thread t scores tokens t, t + 256, ... of the
// tile (coalesced reads of the logits row), exactly like the fused kernel's
// epilogue: l' = logit * scale (one fp32 multiply), score = l' + noise for
// sampled rows. Then the 32 lanes and the 8 warps are merged in a fixed order.
__global__ void __launch_bounds__(kGumbelThreads)
    GumbelMaxTileKernel(const float* __restrict__ logits, const RowParams* __restrict__ params,
                        int64_t valid_vocab, int64_t num_tiles, bool want_lse,
                        const int32_t* __restrict__ draft_tokens, float* __restrict__ draft_logits,
                        int64_t token_offset, SampleSummary* __restrict__ tile_summaries) {
  __shared__ SampleSummary warp_summaries[kGumbelThreads / 32];
  const int64_t row = blockIdx.x / num_tiles;
  const int64_t tile = blockIdx.x % num_tiles;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);

  const RowSampler sampler =
      RowSampler::Load(params, row, /*active=*/true, draft_tokens, draft_logits, token_offset);

  const int64_t begin = tile * kGumbelTileVocab;
  const int64_t end = begin + kGumbelTileVocab < valid_vocab ? begin + kGumbelTileVocab : valid_vocab;
  const float* row_logits = logits + row * valid_vocab;
  SampleSummary mine = EmptySampleSummary();
  for (int64_t v = begin + threadIdx.x; v < end; v += kGumbelThreads) {
    sampler.Add(mine, v, __ldcs(row_logits + v), want_lse);  // logits read once: streaming
  }

#pragma unroll
  for (int m = 16; m >= 1; m /= 2) mine = MergeSummaries(mine, ShuffleXorSummary(mine, m));
  if (lane == 0) warp_summaries[warp] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    SampleSummary s = warp_summaries[0];
#pragma unroll
    for (int w = 1; w < kGumbelThreads / 32; ++w) s = MergeSummaries(s, warp_summaries[w]);
    tile_summaries[row * num_tiles + tile] = s;
  }
}

}  // namespace

size_t MaterializedSampleWorkspaceBytes(int64_t batch, int64_t vocab, int64_t hidden_dim,
                                        CudaWeightDType weight_dtype) {
  return Layout(batch, vocab, hidden_dim, weight_dtype).total;
}

KernelStatus LaunchMaterializedSample(const FusedSampleArgs& args, cublasHandle_t cublas,
                                      cudaStream_t stream) {
  // ---- Arguments (nothing is enqueued when they are wrong).
  if (cublas == nullptr) return KernelStatus::kInvalidArgument;
  if (const KernelStatus s = cuda_internal::CheckSampleArgs(args, 256); s != KernelStatus::kOk) return s;
  // cuBLAS reads fp32 H (FusedSampleArgs::hidden_in_weight_dtype is LaunchFusedSample's).
  if (args.hidden == nullptr) return KernelStatus::kInvalidArgument;
  const WorkspaceLayout layout =
      Layout(args.batch, args.valid_vocab, args.hidden_dim, args.weight_dtype);
  if (layout.total == 0 || args.workspace_bytes < layout.total) {
    return KernelStatus::kInvalidArgument;
  }
  const int64_t num_tiles = NumTiles(args.valid_vocab);
  if (args.batch * num_tiles > kMaxInt32) return KernelStatus::kInvalidArgument;

  char* ws = static_cast<char*>(args.workspace);
  float* logits = reinterpret_cast<float*>(ws + layout.logits_offset);
  SampleSummary* tile_summaries = reinterpret_cast<SampleSummary*>(ws + layout.summaries_offset);

  // ---- 1-2. H in the weight type (16-bit weights), then cuBLAS writes the
  // logits [batch, valid_vocab] (logits_gemm.h).
  LogitsGemmArgs gemm;
  gemm.weight = args.weight;
  gemm.weight_dtype = args.weight_dtype;
  gemm.hidden = args.hidden;
  gemm.batch = args.batch;
  gemm.valid_vocab = args.valid_vocab;
  gemm.hidden_dim = args.hidden_dim;
  gemm.cast_hidden = ws + layout.cast_offset;
  gemm.logits = logits;
  if (const KernelStatus s = LaunchLogitsGemm(gemm, cublas, stream); s != KernelStatus::kOk) {
    return s;
  }

  // ---- 3. Gumbel-max: one block of 256 threads per (row, 1024-token tile),
  // tile-fastest; then stage 2, one warp per row, merges the tiles in order.
  const bool want_lse = cuda_internal::WantsLogSumExp(args);
  GumbelMaxTileKernel<<<static_cast<unsigned>(args.batch * num_tiles), kGumbelThreads, 0,
                        stream>>>(logits, args.params, args.valid_vocab, num_tiles, want_lse,
                                  args.draft_tokens, args.draft_logprobs, args.token_offset,
                                  tile_summaries);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return StatusFromCuda(err);
  err = cuda_internal::LaunchMergeTileSummaries(tile_summaries, num_tiles, args, stream);
  return StatusFromCuda(err);
}

}  // namespace flashsampler::kernels
