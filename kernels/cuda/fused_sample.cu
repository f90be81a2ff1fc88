// Fused LM-head sampling: logits, Gumbel noise and the argmax in one pass over
// W; the [batch, vocab] logits never reach device memory. What it computes and
// why it is exact: fused_sample.h. This file reads top to bottom: tiling
// constants, weight formats, the dot-product inner loops, the stage-1 kernel,
// the launcher (with the grid / block / shared-memory arithmetic).
//
// Stage 1, one block per (vocabulary tile, row chunk):
//   - the block's R hidden rows (R = 1, 2, 4 or 8) are copied to shared memory
//     as fp32, once;
//   - its tile is kTile = 128 or 64 consecutive tokens, chosen per head
//     (stage1_shape.h: 64 where 128 would end the grid in a mostly empty
//     wave); warp w owns the kTile / 8 tokens [w * kTile / 8, ...) of it and
//     walks them in groups of kGroupRows = 4;
//   - for a group, each lane streams a strided slice of the 4 W rows (16-byte
//     loads, 4 rows in flight) and accumulates the 4 x R partial dot products in
//     fp32 registers; a butterfly of shuffles then gives every lane the full
//     4 x R dot products;
//   - lane p < 4R takes the pair (token v0 + p / R, row p % R): it forms
//     l' = dot * scale, adds the row's Gumbel noise for that token (sampled rows
//     only) and folds (l', score) into its running SampleSummary for that row
//     (best score, plus the online log-sum-exp when logz / logprobs are wanted);
//   - the per-lane summaries are merged across the warp (lanes of the same row)
//     and then across the 8 warps, in a fixed order, into one SampleSummary per
//     (row, tile) stored in the workspace at [row, tile].
// Stage 2 (sample_reduce.cu): one block per row merges its tiles in a fixed order.
//
// Why the result does not depend on the batch: a dot product is summed by the
// same lanes in the same order whatever R is (lane k always takes the same
// elements of d, then the same butterfly), a token's noise depends only on its
// row's params and its id, and every merge tree has a shape fixed by the tile,
// not by R; the tile itself depends on the head and the device, not the
// batch. So a row's token (and log Z) is the same alone or in any batch. The
// token does not depend on the tile either (the best-score merge is exact);
// log Z does, by fp32 rounding.
//
// Memory traffic: W is read once per row chunk; blocks are numbered chunk-fastest,
// so the chunks of one tile run back to back and its later chunks find the tile
// in L2. For decode-sized batches (B <= 8 at hidden_dim <= 3072, B <= 4 at 4096)
// there is a single chunk and W crosses HBM exactly once.
#include "kernels/cuda/fused_sample.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "kernels/common/gumbel_noise.h"
#include "kernels/common/sample_summary.h"
#include "kernels/cuda/stage1_shape.h"
#include "kernels/cuda/fused_sample_mma.cuh"
#include "kernels/cuda/fused_sample_sm90.cuh"
#include "kernels/cuda/sample_reduce.cuh"

namespace flashsampler::kernels {
namespace {

using cuda_internal::kFullWarpMask;
using cuda_internal::ShuffleXorSummary;
using cuda_internal::StatusFromCuda;
using cuda_internal::RowSampler;

// ---- Tiling -------------------------------------------------------------------
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Tokens per block: kCudaCoreLargeTile (128, the tensor-core path's tile) or
// kCudaCoreSmallTile (64), chosen per head (stage1_shape.h).
static_assert(kCudaCoreLargeTile == cuda_internal::kMmaTileVocab,
              "the tensor-core path fills the large tiles");
constexpr int kGroupRows = 4;                            // W rows a warp streams at once
constexpr int kMaxRowChunk = 8;                          // hidden rows per block (R)
static_assert(kGroupRows * kMaxRowChunk <= 32, "each (token, row) pair of a group needs a lane");

// Shared memory: the R hidden rows (dynamic, R * hidden_dim floats) and the
// per-warp summaries (static, at most this many bytes).
constexpr size_t kStaticSharedBytes = sizeof(SampleSummary) * kWarps * kMaxRowChunk;
// R is halved until the rows fit in this much, so that at least two blocks
// (16 warps) share an SM; e.g. hidden_dim 4096 gives R <= 4, 8192 gives R <= 2.
constexpr size_t kPreferredRowBytes = 96 * 1024;

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

int64_t NumTiles(int64_t valid_vocab, int tile) { return (valid_vocab + tile - 1) / tile; }

// ---- Weight formats ---------------------------------------------------------------
// Each format says how many elements a 16-byte load holds (kVec), how to widen
// them to fp32 (exactly: every fp16 and bf16 value is an fp32 value) and how to
// load one element. Loads use __ldcg (cache in L2, not L1): W is streamed, and
// L2 is where the other row chunks of the same tile find it.
struct Fp32Weights {
  using Storage = float;
  static constexpr int kVec = 4;
  __device__ static void Widen(const uint4& raw, float (&out)[kVec]) {
    out[0] = __uint_as_float(raw.x);
    out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
  }
  __device__ static float LoadScalar(const Storage* p) { return __ldcg(p); }
};

// Two 16-bit values per 32-bit word, element 2k in the low half (little endian).
struct Bf16Weights {
  using Storage = unsigned short;
  static constexpr int kVec = 8;
  __device__ static void WidenWord(uint32_t word, float* out) {
    out[0] = __uint_as_float(word << 16);           // bf16 is the top half of an fp32
    out[1] = __uint_as_float(word & 0xffff0000u);
  }
  __device__ static void Widen(const uint4& raw, float (&out)[kVec]) {
    WidenWord(raw.x, out + 0);
    WidenWord(raw.y, out + 2);
    WidenWord(raw.z, out + 4);
    WidenWord(raw.w, out + 6);
  }
  __device__ static float LoadScalar(const Storage* p) {
    return __uint_as_float(static_cast<uint32_t>(__ldcg(p)) << 16);
  }
};

struct Fp16Weights {
  using Storage = unsigned short;
  static constexpr int kVec = 8;
  __device__ static void WidenWord(uint32_t word, float* out) {
    out[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(word & 0xffffu)));
    out[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(word >> 16)));
  }
  __device__ static void Widen(const uint4& raw, float (&out)[kVec]) {
    WidenWord(raw.x, out + 0);
    WidenWord(raw.y, out + 2);
    WidenWord(raw.z, out + 4);
    WidenWord(raw.w, out + 6);
  }
  __device__ static float LoadScalar(const Storage* p) { return __half2float(__ushort_as_half(__ldcg(p))); }
};

// ---- Dot products of one group of kGroupRows W rows with the block's R rows -------
// acc[i][r] += partial dot of W row (v0 + i) with hidden row r over this lane's
// elements; rows v0 + i >= valid_vocab are not loaded (their acc stays 0 and is
// never used). Both paths sum each lane's elements in increasing d with fp32 FMA.

// Vector path: W rows start 16-byte aligned and hold whole 16-byte vectors.
// Lane k takes vectors k, k + 32, ...: each load instruction of the warp reads
// 512 contiguous bytes of one row. The hidden slice comes from shared memory as
// float4s (for 16-bit weights a lane reads 32 contiguous bytes per row: a 2-way
// bank conflict, cheap next to the global loads for R <= 4).
template <class W, int R>
__device__ __forceinline__ void AccumulateVector(const typename W::Storage* __restrict__ weight,
                                                 const float* h_smem, int64_t v0,
                                                 int64_t valid_vocab, int64_t hidden_dim,
                                                 int lane, float (&acc)[kGroupRows][R]) {
  constexpr int kVec = W::kVec;
  const int64_t vectors_per_row = hidden_dim / kVec;  // exact on this path
  const uint4* rows[kGroupRows];
  bool live[kGroupRows];
#pragma unroll
  for (int i = 0; i < kGroupRows; ++i) {
    live[i] = v0 + i < valid_vocab;
    rows[i] = reinterpret_cast<const uint4*>(weight + (live[i] ? v0 + i : v0) * hidden_dim);
  }
  // Two iterations in flight (8 loads per lane), except at R = 8 where the
  // 4 x 8 accumulators leave no registers for it.
#pragma unroll(R >= 8 ? 1 : 2)
  for (int64_t k = lane; k < vectors_per_row; k += 32) {
    float w[kGroupRows][kVec];
#pragma unroll
    for (int i = 0; i < kGroupRows; ++i) {  // all loads issued before any use
      const uint4 raw = live[i] ? __ldcg(rows[i] + k) : make_uint4(0u, 0u, 0u, 0u);
      W::Widen(raw, w[i]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float4* hp = reinterpret_cast<const float4*>(h_smem + r * hidden_dim + k * kVec);
      float h[kVec];
#pragma unroll
      for (int q = 0; q < kVec / 4; ++q) {
        const float4 t = hp[q];
        h[4 * q + 0] = t.x;
        h[4 * q + 1] = t.y;
        h[4 * q + 2] = t.z;
        h[4 * q + 3] = t.w;
      }
#pragma unroll
      for (int i = 0; i < kGroupRows; ++i) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[i][r] = fmaf(w[i][j], h[j], acc[i][r]);
      }
    }
  }
}

// Scalar path (any hidden_dim, any element-aligned W): lane k takes elements
// k, k + 32, ... (still coalesced: a warp reads 64 or 128 contiguous bytes).
template <class W, int R>
__device__ __forceinline__ void AccumulateScalar(const typename W::Storage* __restrict__ weight,
                                                 const float* h_smem, int64_t v0,
                                                 int64_t valid_vocab, int64_t hidden_dim,
                                                 int lane, float (&acc)[kGroupRows][R]) {
  const typename W::Storage* rows[kGroupRows];
  bool live[kGroupRows];
#pragma unroll
  for (int i = 0; i < kGroupRows; ++i) {
    live[i] = v0 + i < valid_vocab;
    rows[i] = weight + (live[i] ? v0 + i : v0) * hidden_dim;
  }
  for (int64_t d = lane; d < hidden_dim; d += 32) {
    float w[kGroupRows];
#pragma unroll
    for (int i = 0; i < kGroupRows; ++i) w[i] = live[i] ? W::LoadScalar(rows[i] + d) : 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float h = h_smem[r * hidden_dim + d];
#pragma unroll
      for (int i = 0; i < kGroupRows; ++i) acc[i][r] = fmaf(w[i], h, acc[i][r]);
    }
  }
}

// ---- Stage 1 --------------------------------------------------------------------
// Block b handles row chunk (b % num_chunks), rows [chunk * R, chunk * R + R),
// and tile (b / num_chunks), tokens [tile * kTile, ... + kTile). It
// writes tile_summaries[row * num_tiles + tile] for each of its rows < batch.
template <class W, int R, int kTile>
__global__ void __launch_bounds__(kThreads, 2)
    FusedSampleTileKernel(const typename W::Storage* __restrict__ weight,
                          const float* __restrict__ hidden, const RowParams* __restrict__ params,
                          int64_t batch, int64_t valid_vocab, int64_t hidden_dim,
                          int64_t num_chunks, int64_t num_tiles, bool vector_path, bool want_lse,
                          const int32_t* __restrict__ draft_tokens, float* __restrict__ draft_logits,
                          int64_t token_offset, SampleSummary* __restrict__ tile_summaries) {
  extern __shared__ float4 dynamic_smem[];  // float4: 16-byte aligned rows
  float* h_smem = reinterpret_cast<float*>(dynamic_smem);  // [R][hidden_dim]
  __shared__ SampleSummary warp_summaries[kWarps][R];

  const int64_t chunk = blockIdx.x % num_chunks;
  const int64_t tile = blockIdx.x / num_chunks;
  const int64_t row0 = chunk * R;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);

  // 1. The block's hidden rows into shared memory (rows past the batch: zeros).
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float* dst = h_smem + r * hidden_dim;
    if (row0 + r < batch) {
      const float* src = hidden + (row0 + r) * hidden_dim;
      for (int64_t d = threadIdx.x; d < hidden_dim; d += kThreads) dst[d] = src[d];
    } else {
      for (int64_t d = threadIdx.x; d < hidden_dim; d += kThreads) dst[d] = 0.0f;
    }
  }

  // 2. The (token, row) pair this lane scores in every group, and its row's params.
  const int pair_token = lane / R;  // token v0 + pair_token of each group
  const int pair_row = lane % R;    // hidden row row0 + pair_row
  const bool pair_active = lane < kGroupRows * R && row0 + pair_row < batch;
  const RowSampler row = RowSampler::Load(params, row0 + pair_row, pair_active, draft_tokens,
                                          draft_logits, token_offset);
  SampleSummary mine = EmptySampleSummary();
  __syncthreads();

  // 3. This warp's tokens, one group of kGroupRows W rows at a time.
  constexpr int kRowsPerWarp = kTile / kWarps;
  constexpr int kGroupsPerWarp = kRowsPerWarp / kGroupRows;
  static_assert(kRowsPerWarp % kGroupRows == 0, "a warp's tokens split into whole groups");
  const int64_t warp_v0 = tile * kTile + warp * kRowsPerWarp;
  for (int g = 0; g < kGroupsPerWarp; ++g) {
    const int64_t v0 = warp_v0 + g * kGroupRows;
    if (v0 >= valid_vocab) break;  // same for the whole warp

    float acc[kGroupRows][R];
#pragma unroll
    for (int i = 0; i < kGroupRows; ++i) {
#pragma unroll
      for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;
    }
    if (vector_path) {
      AccumulateVector<W, R>(weight, h_smem, v0, valid_vocab, hidden_dim, lane, acc);
    } else {
      AccumulateScalar<W, R>(weight, h_smem, v0, valid_vocab, hidden_dim, lane, acc);
    }

    // Butterfly: afterwards every lane holds every full dot product (and all
    // lanes hold bit-identical values: each step adds the same two numbers).
    // The pair's value is picked with compile-time indices, so acc stays in
    // registers.
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kGroupRows; ++i) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float x = acc[i][r];
#pragma unroll
        for (int m = 16; m >= 1; m /= 2) x = __fadd_rn(x, __shfl_xor_sync(kFullWarpMask, x, m));
        if (i * R + r == lane) dot = x;
      }
    }

    const int64_t v = v0 + pair_token;
    if (pair_active && v < valid_vocab) row.Add(mine, v, dot, want_lse);
  }

  // 4. Lanes p, p ^ R, p ^ 2R, ... hold the same row: merge them (a tree whose
  // shape depends only on the token position, see the top of the file).
#pragma unroll
  for (int m = 16; m >= R; m /= 2) mine = MergeSummaries(mine, ShuffleXorSummary(mine, m));
  if (lane < R) warp_summaries[warp][lane] = mine;
  __syncthreads();

  // 5. Merge the warps in order (= token order) and store the tile summary.
  if (threadIdx.x < R && row0 + threadIdx.x < batch) {
    SampleSummary s = warp_summaries[0][threadIdx.x];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) s = MergeSummaries(s, warp_summaries[w][threadIdx.x]);
    tile_summaries[(row0 + threadIdx.x) * num_tiles + tile] = s;
  }
}

// ---- Launcher -----------------------------------------------------------------
struct Stage1Launch {
  const void* weight;
  const float* hidden;
  const RowParams* params;
  int64_t batch, valid_vocab, hidden_dim, num_chunks, num_tiles;
  bool vector_path, want_lse;
  const int32_t* draft_tokens;
  float* draft_logits;
  int64_t token_offset;
  SampleSummary* tile_summaries;
  unsigned blocks;
  size_t smem_bytes;
};

template <class W, int R, int kTile>
cudaError_t LaunchStage1(const Stage1Launch& l, cudaStream_t stream) {
  auto* kernel = &FusedSampleTileKernel<W, R, kTile>;
  // Past 48 KB of shared memory per block (static + dynamic) a kernel must opt
  // in to its dynamic part explicitly.
  if (l.smem_bytes + kStaticSharedBytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(l.smem_bytes));
    if (err != cudaSuccess) return err;
  }
  kernel<<<l.blocks, kThreads, l.smem_bytes, stream>>>(
      static_cast<const typename W::Storage*>(l.weight), l.hidden, l.params, l.batch,
      l.valid_vocab, l.hidden_dim, l.num_chunks, l.num_tiles, l.vector_path, l.want_lse,
      l.draft_tokens, l.draft_logits, l.token_offset, l.tile_summaries);
  return cudaGetLastError();
}

template <class W, int kTile>
cudaError_t LaunchStage1ForRows(int rows, const Stage1Launch& l, cudaStream_t stream) {
  switch (rows) {
    case 1: return LaunchStage1<W, 1, kTile>(l, stream);
    case 2: return LaunchStage1<W, 2, kTile>(l, stream);
    case 4: return LaunchStage1<W, 4, kTile>(l, stream);
    default: return LaunchStage1<W, 8, kTile>(l, stream);
  }
}

template <class W>
cudaError_t LaunchStage1ForTile(int tile, int rows, const Stage1Launch& l, cudaStream_t stream) {
  return tile == kCudaCoreSmallTile ? LaunchStage1ForRows<W, kCudaCoreSmallTile>(rows, l, stream)
                                    : LaunchStage1ForRows<W, kCudaCoreLargeTile>(rows, l, stream);
}

// One-row blocks of the large-tile kernel resident at once on `device`
// (blocks per SM times SMs): the wave size stage1_shape.h's rule reads.
// Depends on the head (W's type, hidden_dim) and the device only.
template <class W>
cudaError_t ResidentOneRowBlocks(int64_t hidden_dim, int device, int64_t* resident) {
  auto* kernel = &FusedSampleTileKernel<W, 1, kCudaCoreLargeTile>;
  const size_t smem_bytes = static_cast<size_t>(hidden_dim) * sizeof(float);
  if (smem_bytes + kStaticSharedBytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes));
    if (err != cudaSuccess) return err;
  }
  int per_sm = 0, sms = 0;
  cudaError_t err =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem_bytes);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  *resident = static_cast<int64_t>(per_sm) * sms;
  return err;
}

// ResidentOneRowBlocks per (device, dtype, hidden_dim), asked once per
// process: the answer never changes, and the occupancy query would otherwise
// cost host time before every launch. A process serves a few heads at most,
// so a short list under a mutex (LaunchFusedSample may run on many threads).
struct ResidentEntry {
  int device;
  CudaWeightDType dtype;
  int64_t hidden_dim;
  int64_t resident;
};
std::mutex& ResidentMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::vector<ResidentEntry>& ResidentCache() {
  static auto* cache = new std::vector<ResidentEntry>;
  return *cache;
}

// ResidentOneRowBlocks for the launch's head, from the cache or asked once.
cudaError_t CachedResidentBlocks(const FusedSampleArgs& args, int device, int64_t* resident) {
  {
    std::lock_guard<std::mutex> lock(ResidentMutex());
    for (const ResidentEntry& e : ResidentCache()) {
      if (e.device == device && e.dtype == args.weight_dtype && e.hidden_dim == args.hidden_dim) {
        *resident = e.resident;
        return cudaSuccess;
      }
    }
  }
  cudaError_t err = cudaSuccess;
  switch (args.weight_dtype) {
    case CudaWeightDType::kFloat32:
      err = ResidentOneRowBlocks<Fp32Weights>(args.hidden_dim, device, resident);
      break;
    case CudaWeightDType::kFloat16:
      err = ResidentOneRowBlocks<Fp16Weights>(args.hidden_dim, device, resident);
      break;
    case CudaWeightDType::kBFloat16:
      err = ResidentOneRowBlocks<Bf16Weights>(args.hidden_dim, device, resident);
      break;
  }
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(ResidentMutex());
  ResidentCache().push_back({device, args.weight_dtype, args.hidden_dim, *resident});
  return cudaSuccess;
}

// The launch's CUDA-core tile: as forced by args.cuda_core_tile, else by
// CudaCoreTileTokens (stage1_shape.h).
cudaError_t CudaCoreTile(const FusedSampleArgs& args, int device, int* tile) {
  if (args.cuda_core_tile != 0) {
    *tile = args.cuda_core_tile;
    return cudaSuccess;
  }
  const size_t elem_bytes = CudaWeightDTypeBytes(args.weight_dtype);
  if (static_cast<int64_t>(elem_bytes) * args.hidden_dim < kCudaCoreSmallTileMinRowBytes) {
    *tile = kCudaCoreLargeTile;  // short rows: no occupancy lookup
    return cudaSuccess;
  }
  int64_t resident = 0;
  const cudaError_t err = CachedResidentBlocks(args, device, &resident);
  if (err != cudaSuccess) return err;
  *tile = CudaCoreTileTokens(args.valid_vocab, args.hidden_dim, elem_bytes, resident);
  return cudaSuccess;
}

bool AlignedTo(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

}  // namespace

bool WgmmaStage1Available() {
#if FLASHSAMPLER_HAVE_CUTLASS
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    return false;
  }
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

size_t CudaWeightDTypeBytes(CudaWeightDType dtype) {
  switch (dtype) {
    case CudaWeightDType::kFloat32: return 4;
    case CudaWeightDType::kFloat16: return 2;
    case CudaWeightDType::kBFloat16: return 2;
  }
  return 0;
}

// Workspace layout: [batch][num_tiles] SampleSummary, sized for the small
// tiles (the most a launch can use), then (each from a 256-byte boundary)
// the WGMMA sampler's RowBestKeys, [batch] uint32, and the tensor-core
// path's H rounded to 16 bits, [RoundedHiddenRows(batch)][hidden_dim].
size_t TileSummaryBytes(int64_t batch, int64_t vocab) {
  const size_t bytes = static_cast<size_t>(batch) *
                       static_cast<size_t>(NumTiles(vocab, kCudaCoreSmallTile)) *
                       sizeof(SampleSummary);
  return (bytes + 255) / 256 * 256;
}

size_t RowBestKeyBytes(int64_t batch) {
  return (static_cast<size_t>(batch) * sizeof(uint32_t) + 255) / 256 * 256;
}

size_t FusedSampleWorkspaceBytes(int64_t batch, int64_t vocab, int64_t hidden_dim) {
  if (batch < 1 || batch > kMaxInt32 || vocab < 1 || vocab > kMaxInt32 || hidden_dim < 1 ||
      hidden_dim > kMaxInt32) {
    return 0;
  }
  return TileSummaryBytes(batch, vocab) + RowBestKeyBytes(batch) +
         static_cast<size_t>(RoundedHiddenRows(batch)) * static_cast<size_t>(hidden_dim) *
             sizeof(uint16_t);
}

namespace cuda_internal {

bool ChooseStage1(const FusedSampleArgs& args, Stage1Kernel requested, Stage1Choice* choice) {
  *choice = Stage1Choice{};
  switch (requested) {
    case Stage1Kernel::kAuto:
      if (!MmaStage1Serves(args)) return true;  // the CUDA-core kernel
      choice->family = Stage1Choice::kMmaSync;
#if FLASHSAMPLER_HAVE_CUTLASS
      // From kWgmmaMinAutoBatch rows the WGMMA kernel is the fastest stage 1
      // we have (against mma.sync 2-6% at 32 rows and more above, H200,
      // 2026-11-26); its outputs are those of mma.sync bit for bit
      // (fused_sample_sm90_test), so the switch changes no row. Which of
      // its schedules: fused_sample_sm90.cuh, above kWgmmaMinAutoBatch.
      if (args.batch >= kWgmmaMinAutoBatch && WgmmaStage1Eligible(args) && WgmmaStage1Available()) {
        choice->family = Stage1Choice::kWgmma;
        choice->wgmma_schedule = Stage1Kernel::kWgmmaSeparateEpilogue;
      }
#endif
      return true;
    case Stage1Kernel::kCudaCore:
      return true;
    case Stage1Kernel::kMmaSync:
      choice->family = Stage1Choice::kMmaSync;
      return MmaStage1Serves(args);
    case Stage1Kernel::kWgmma:
    case Stage1Kernel::kWgmmaOverlap:
    case Stage1Kernel::kWgmmaPingpong:
    case Stage1Kernel::kWgmmaSeparateEpilogue:
#if FLASHSAMPLER_HAVE_CUTLASS
      choice->family = Stage1Choice::kWgmma;
      choice->wgmma_schedule = requested;
      return WgmmaStage1Eligible(args) && WgmmaStage1Available();
#else
      return false;  // built without FLASHSAMPLER_CUTLASS
#endif
  }
  return false;  // a value outside the enum
}

}  // namespace cuda_internal

bool FusedSampleReadsHiddenInWeightDType(const FusedSampleArgs& args) {
  // The tensor-core families serve 16-bit weights only (ChooseStage1).
  cuda_internal::Stage1Choice choice;
  return cuda_internal::ChooseStage1(args, args.stage1, &choice) &&
         choice.family != cuda_internal::Stage1Choice::kCudaCore;
}

KernelStatus LaunchFusedSample(const FusedSampleArgs& args, cudaStream_t stream) {
  // ---- Arguments (nothing is enqueued when they are wrong).
  if (const KernelStatus s = cuda_internal::CheckSampleArgs(args, 16); s != KernelStatus::kOk) return s;
  const size_t elem_bytes = CudaWeightDTypeBytes(args.weight_dtype);
  if ((args.cuda_core_tile != 0 && args.cuda_core_tile != kCudaCoreSmallTile &&
       args.cuda_core_tile != kCudaCoreLargeTile) ||
      (args.mma_pipeline != MmaPipeline::kAuto && args.mma_pipeline != MmaPipeline::kShallow &&
       args.mma_pipeline != MmaPipeline::kDeep)) {
    return KernelStatus::kInvalidArgument;
  }
  if (args.workspace_bytes <
      FusedSampleWorkspaceBytes(args.batch, args.valid_vocab, args.hidden_dim)) {
    return KernelStatus::kInvalidArgument;
  }

  // ---- Which stage 1 (Stage1Kernel, ChooseStage1). A forced kernel whose
  // conditions do not hold is an argument error, never a silent fallback.
  cuda_internal::Stage1Choice choice;
  if (!cuda_internal::ChooseStage1(args, args.stage1, &choice)) return KernelStatus::kInvalidArgument;
  const bool mma_sync = choice.family == cuda_internal::Stage1Choice::kMmaSync;
  const bool wgmma = choice.family == cuda_internal::Stage1Choice::kWgmma;
  // Only the tensor-core path's first kernel reads H in the weights' dtype.
  if (args.hidden_in_weight_dtype.rows != nullptr && !mma_sync && !wgmma) return KernelStatus::kInvalidArgument;

  const bool want_lse = cuda_internal::WantsLogSumExp(args);
  SampleSummary* tile_summaries = static_cast<SampleSummary*>(args.workspace);
  cudaError_t err = cudaSuccess;

  // ---- Tensor-core stage 1 (fused_sample_mma.cu, or fused_sample_sm90.cu
  // from kWgmmaMinAutoBatch rows or on request) for 16-bit weights: W is
  // read once per 128 or 256 rows instead of once per 8 rows. Both write
  // 128-token tile summaries, merged by the same stage 2.
  if (mma_sync || wgmma) {
    unsigned char* const after_summaries =
        static_cast<unsigned char*>(args.workspace) + TileSummaryBytes(args.batch, args.valid_vocab);
    [[maybe_unused]] auto* row_best_keys = reinterpret_cast<uint32_t*>(after_summaries);
    auto* hidden_rounded =
        reinterpret_cast<unsigned short*>(after_summaries + RowBestKeyBytes(args.batch));
    const int64_t mma_tiles = NumTiles(args.valid_vocab, cuda_internal::kMmaTileVocab);
#if FLASHSAMPLER_HAVE_CUTLASS
    if (wgmma) {
      err = cuda_internal::LaunchWgmmaStage1(args, mma_tiles, want_lse, tile_summaries,
                                             hidden_rounded, stream, choice.wgmma_schedule,
                                             nullptr, row_best_keys);
    } else
#endif
    {
      err = cuda_internal::LaunchMmaStage1(args, mma_tiles, want_lse, tile_summaries,
                                           hidden_rounded, stream);
    }
    if (err != cudaSuccess) return StatusFromCuda(err);
    err = cuda_internal::LaunchMergeTileSummaries(tile_summaries, mma_tiles, args, stream);
    return StatusFromCuda(err);
  }

  // ---- Rows per block (R). The smallest power of two >= batch, at most 8, then
  // halved while the R fp32 rows exceed kPreferredRowBytes of shared memory.
  const size_t row_bytes = static_cast<size_t>(args.hidden_dim) * sizeof(float);
  int rows = 1;
  while (rows < kMaxRowChunk && rows < args.batch) rows *= 2;
  while (rows > 1 && rows * row_bytes > kPreferredRowBytes) rows /= 2;
  const size_t smem_bytes = rows * row_bytes;  // dynamic shared memory per block

  int device = 0;
  int max_smem_optin = 0;
  err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                 device);
  }
  if (err != cudaSuccess) return StatusFromCuda(err);
  if (smem_bytes + kStaticSharedBytes > static_cast<size_t>(max_smem_optin)) {
    return KernelStatus::kInvalidArgument;  // even one row does not fit one block
  }

  // ---- Tile: 64 or 128 tokens per block (stage1_shape.h: the rule, and
  // why either gives the same tokens).
  int tile = kCudaCoreLargeTile;
  err = CudaCoreTile(args, device, &tile);
  if (err != cudaSuccess) return StatusFromCuda(err);
  const int64_t num_tiles = NumTiles(args.valid_vocab, tile);

  // ---- Grid. One block per (tile, row chunk), numbered chunk-fastest so the
  // chunks of a tile run together (L2 reuse of its W rows). kThreads = 256
  // threads per block; at V = 151936 there are 1187 large tiles, enough blocks
  // to fill every SM several times over even at batch 1.
  const int64_t num_chunks = (args.batch + rows - 1) / rows;
  const int64_t blocks = num_tiles * num_chunks;
  if (blocks > kMaxInt32) return KernelStatus::kInvalidArgument;

  // The 16-byte path needs every W row to start 16-byte aligned: an aligned base
  // and a row length that is a whole number of 16-byte vectors.
  const bool vector_path =
      AlignedTo(args.weight, 16) && (static_cast<size_t>(args.hidden_dim) * elem_bytes) % 16 == 0;
  const Stage1Launch launch{args.weight,        args.hidden,         args.params,
                            args.batch,         args.valid_vocab,    args.hidden_dim,
                            num_chunks,         num_tiles,           vector_path,
                            want_lse,           args.draft_tokens,   args.draft_logprobs,
                            args.token_offset,  tile_summaries,      static_cast<unsigned>(blocks),
                            smem_bytes};
  switch (args.weight_dtype) {
    case CudaWeightDType::kFloat32:
      err = LaunchStage1ForTile<Fp32Weights>(tile, rows, launch, stream);
      break;
    case CudaWeightDType::kFloat16:
      err = LaunchStage1ForTile<Fp16Weights>(tile, rows, launch, stream);
      break;
    case CudaWeightDType::kBFloat16:
      err = LaunchStage1ForTile<Bf16Weights>(tile, rows, launch, stream);
      break;
  }
  if (err != cudaSuccess) return StatusFromCuda(err);

  // ---- Stage 2: one block per row merges its num_tiles summaries in a fixed order.
  err = cuda_internal::LaunchMergeTileSummaries(tile_summaries, num_tiles, args, stream);
  return StatusFromCuda(err);
}

}  // namespace flashsampler::kernels
