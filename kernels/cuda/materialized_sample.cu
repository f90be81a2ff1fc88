// Materialized baseline: cuBLAS logits to device memory, then a standalone
// Gumbel-max kernel. What it computes and why: materialized_sample.h. Reads top
// to bottom: workspace layout, the hidden-state cast, the Gumbel-max kernel,
// the launcher.
#include "kernels/cuda/materialized_sample.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "kernels/common/gumbel_noise.h"
#include "kernels/common/sample_summary.h"
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

// ---- Hidden states to the weight type (round to nearest even) ------------------------
__device__ __forceinline__ void StoreAs(__nv_bfloat16* out, float x) { *out = __float2bfloat16_rn(x); }
__device__ __forceinline__ void StoreAs(__half* out, float x) { *out = __float2half_rn(x); }

template <class Out>
__global__ void CastHiddenKernel(const float* __restrict__ in, Out* __restrict__ out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    StoreAs(out + i, in[i]);
  }
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
                        int64_t token_offset, SampleSummary* __restrict__ tile_summaries) {
  __shared__ SampleSummary warp_summaries[kGumbelThreads / 32];
  const int64_t row = blockIdx.x / num_tiles;
  const int64_t tile = blockIdx.x % num_tiles;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);

  const RowSampler sampler = RowSampler::Load(params, row, /*active=*/true, token_offset);

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

KernelStatus StatusFromCublas(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? KernelStatus::kOk : KernelStatus::kDeviceError;
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

  // ---- 1. H in the weight type (16-bit weights): a grid-stride cast, 256
  // threads per block, at most 4096 blocks.
  const void* gemm_hidden = args.hidden;
  const int64_t hidden_elems = args.batch * args.hidden_dim;
  const int64_t cast_blocks_needed = (hidden_elems + 255) / 256;
  const unsigned cast_blocks =
      static_cast<unsigned>(cast_blocks_needed < 4096 ? cast_blocks_needed : 4096);
  if (args.weight_dtype == CudaWeightDType::kBFloat16) {
    auto* cast = reinterpret_cast<__nv_bfloat16*>(ws + layout.cast_offset);
    CastHiddenKernel<<<cast_blocks, 256, 0, stream>>>(args.hidden, cast, hidden_elems);
    gemm_hidden = cast;
  } else if (args.weight_dtype == CudaWeightDType::kFloat16) {
    auto* cast = reinterpret_cast<__half*>(ws + layout.cast_offset);
    CastHiddenKernel<<<cast_blocks, 256, 0, stream>>>(args.hidden, cast, hidden_elems);
    gemm_hidden = cast;
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return StatusFromCuda(err);

  // ---- 2. logits [batch, valid_vocab] (row-major) = H W^T. In cuBLAS's
  // column-major terms: C (valid_vocab x batch, ldc = valid_vocab) =
  // op(A) * B with A = W seen as (hidden_dim x vocab, lda = hidden_dim),
  // op = transpose, and B = H seen as (hidden_dim x batch, ldb = hidden_dim).
  // Only the first valid_vocab rows of W are read.
  cudaDataType_t ab_type = CUDA_R_16BF;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // fp32 accumulation
  if (args.weight_dtype == CudaWeightDType::kFloat16) ab_type = CUDA_R_16F;
  if (args.weight_dtype == CudaWeightDType::kFloat32) {
    ab_type = CUDA_R_32F;
    compute = CUBLAS_COMPUTE_32F_PEDANTIC;  // true fp32, never TF32
  }
  const float alpha = 1.0f;
  const float beta = 0.0f;
  KernelStatus status = StatusFromCublas(cublasSetStream(cublas, stream));
  if (status == KernelStatus::kOk) {
    status = StatusFromCublas(cublasSetPointerMode(cublas, CUBLAS_POINTER_MODE_HOST));
  }
  if (status == KernelStatus::kOk) {
    const int m = static_cast<int>(args.valid_vocab);
    const int n = static_cast<int>(args.batch);
    const int k = static_cast<int>(args.hidden_dim);
    status = StatusFromCublas(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha,
                                           args.weight, ab_type, k, gemm_hidden, ab_type, k,
                                           &beta, logits, CUDA_R_32F, m, compute,
                                           CUBLAS_GEMM_DEFAULT));
  }
  if (status != KernelStatus::kOk) return status;

  // ---- 3. Gumbel-max: one block of 256 threads per (row, 1024-token tile),
  // tile-fastest; then stage 2, one warp per row, merges the tiles in order.
  const bool want_lse = args.logz != nullptr || args.logprobs != nullptr;
  GumbelMaxTileKernel<<<static_cast<unsigned>(args.batch * num_tiles), kGumbelThreads, 0,
                        stream>>>(logits, args.params, args.valid_vocab, num_tiles, want_lse,
                                  args.token_offset, tile_summaries);
  err = cudaGetLastError();
  if (err != cudaSuccess) return StatusFromCuda(err);
  err = cuda_internal::LaunchMergeTileSummaries(tile_summaries, args.batch, num_tiles,
                                                args.token_ids, args.logz, args.logprobs,
                                                args.row_summaries, stream);
  return StatusFromCuda(err);
}

}  // namespace flashsampler::kernels
