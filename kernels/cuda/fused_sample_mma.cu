// Tensor-core stage 1 of the fused sampler: the same per-(row, tile)
// SampleSummary as the CUDA-core stage 1 in fused_sample.cu, with the dot
// products formed by mma.sync.m16n8k16 (fp16 / bf16 inputs, fp32 accumulate).
// Notes on the design, the floor and every measured version:
// kernels/cuda/NOTES-fused.md.
//
// What it computes. logits^T [vocab, batch] = W [vocab, D] . Hr^T, where Hr is
// H rounded to the weight dtype (round to nearest even; exact when H is
// representable, the precondition of fused_sample.h), as a GEMM with
// M = vocabulary, N = batch rows, K = hidden_dim, whose output tile never
// leaves the chip: each accumulator (token, row) goes through RowSampler::Add
// (l' = TransformLogit(dot, scale), plus the row's Gumbel noise for sampled
// rows, folded with AddToken) and the block writes one SampleSummary per
// (row, 128-token tile) to the workspace. Stage 2 (sample_reduce.cu) is shared
// with the CUDA-core path.
//
// Why exact and batch-invariant. Every output element is the fp32 sum of its
// k16 products in increasing k, whatever the block shape (no split-K), so a
// row's logits do not depend on the batch it is in. Each tile's 128 tokens are
// folded by the same tree for every block shape (lane k adds tokens 4k..4k+3
// in order, then a butterfly over the 32 lanes): so logz rounds identically too.
//
// Two kernels:
//   1. ConvertHiddenKernel: H (fp32) -> Hr (16-bit) in the workspace, once per
//      launch (B * D * 6 bytes of traffic, a few microseconds), so the GEMM
//      blocks stream 16-bit H tiles like W tiles instead of converting H again
//      in every block; or CopyCheckedHiddenKernel, for H that arrives in the
//      weights' dtype (a copy and a check, B * D * 4 bytes).
//   2. MmaTileKernel<T, Cfg>: block = 8 warps, block tile = 128 tokens (one
//      workspace tile) x Cfg::kRows rows, K in steps of Cfg::kKStep (64 or 128):
//      - W and H tiles of a step go global -> shared with 16-byte cp.async
//        (L2 only), Cfg::kStages steps deep, so kStages - 1 steps of W are in
//        flight while the tensor cores work; one __syncthreads per step;
//      - shared tiles are rows of kKStep elements with the 16-byte chunks
//        XOR-swizzled by (row & 7), so cp.async stores and ldmatrix reads are
//        free of bank conflicts;
//      - warps are laid out kWarpsM x kWarpsN over the block tile; each warp
//        holds kMi m16 x kNi n8 accumulator blocks and loads its operands with
//        ldmatrix.x4 (W: A operand, row-major; H: B operand, "col" = rows of H);
//      - grid: one block per (tile, row chunk), chunks fastest, so the chunks
//        of a tile (batches over 128 rows) run together and re-read its W from L2;
//      - launched as a programmatic dependent of kernel 1: the first W steps
//        are requested before griddepcontrol.wait, H after it; stage 2 is in
//        turn launched as a dependent of this kernel;
//      - epilogue: the dot tile goes to shared memory (reusing the ring), then
//        one warp per row, 4 consecutive tokens per lane (one Philox block
//        gives their 4 noise words), RowSampler::AddFour, a butterfly merge.
//      - or (LaunchMmaLogits, the batch-invariant materialized paths) the dot
//        tile is written out as fp32 logits, one warp per row: the same dot
//        products the sampling epilogues fold, bit for bit.
#include "kernels/cuda/fused_sample_mma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "kernels/common/gumbel_noise.h"
#include "kernels/common/sample_summary.h"
#include "kernels/cuda/fused_controls.cuh"
#include "kernels/cuda/hidden_check.cuh"
#include "kernels/cuda/sample_reduce.cuh"
#include "kernels/cuda/stage1_shape.h"

namespace flashsampler::kernels::cuda_internal {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTileTokens = kMmaTileVocab;  // 128: block tile M = one workspace tile
constexpr int kDotStride = kTileTokens + 4;  // floats per row of the epilogue's dot tile
static_assert(kTileTokens == 4 * 32, "the epilogue gives each lane 4 tokens of a tile");

// ---- Block shapes --------------------------------------------------------------
// kRows: batch rows per block (N). kWarpsM x kWarpsN = 8 warps. kStages: depth
// of the cp.async ring. kMinBlocks: blocks per SM the registers are capped for
// (the shared memory of kStages steps must allow it too: checked below).
// kKStep: K elements per step; 128 (256-byte runs of every W row per step)
// measured 3-5% faster than 64 (128-byte runs) for the W-bound shapes, which
// DRAM serves better in longer runs. Two stages suffice there: 2-3 blocks per
// SM each keep one 32 KB step in flight while computing the other (measured
// equal or faster than 3-4 stages of 64; NOTES-fused.md, v3).
template <int kRows_, int kWarpsM_, int kStages_, int kMinBlocks_, int kKStep_ = 64>
struct MmaConfig {
  static constexpr int kKStep = kKStep_;            // K elements per pipeline step
  static constexpr int kRowBytes = kKStep * 2;      // one shared tile row
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kRows = kRows_;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kWarps / kWarpsM_;
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kWarpTokens = kTileTokens / kWarpsM;  // warp tile M
  static constexpr int kWarpRows = kRows / kWarpsN;           // warp tile N
  static constexpr int kMi = kWarpTokens / 16;
  static constexpr int kNi = kWarpRows / 8;
  static constexpr int kWBytes = kTileTokens * kRowBytes;  // W bytes of one step
  static constexpr int kHBytes = kRows * kRowBytes;         // H bytes of one step
  static constexpr int kStageBytes = kWBytes + kHBytes;
  static constexpr size_t kSmemBytes = size_t{kStages} * kStageBytes;
  static_assert(kWarpsM * kWarpsN == kWarps, "8 warps");
  static_assert(kChunksPerRow >= 8 && kThreads % kChunksPerRow == 0 &&
                    (kThreads / kChunksPerRow) % 8 == 0,
                "a thread's copies share one chunk column and one swizzle phase");
  static_assert(kMi >= 1 && kWarpTokens % 16 == 0, "whole m16 blocks per warp");
  static_assert(kNi >= 1 && kWarpRows % 8 == 0, "whole n8 blocks per warp");
  static_assert(kNi == 1 || kNi % 2 == 0, "H fragments load two n8 blocks at a time");
  static_assert(kSmemBytes >= sizeof(float) * kDotStride * kRows,
                "the epilogue's dot tile fits in the ring");
  static_assert(kMinBlocks * (kSmemBytes + 1024) <= 227 * 1024 + 1024,
                "kMinBlocks blocks fit in an SM's shared memory");
};
//                        rows  warpsM stages minBlocks  smem/block
using Mma8 = MmaConfig<8, 8, 2, 3, 128>;     //  68 KB
using Mma16 = MmaConfig<16, 8, 2, 3, 128>;   //  72 KB
using Mma32 = MmaConfig<32, 8, 2, 2, 128>;   //  80 KB
using Mma64 = MmaConfig<64, 4, 2, 2, 128>;   //  96 KB
using Mma128 = MmaConfig<128, 2, 3, 2, 64>;  //  96 KB
// The deep pipeline for B <= 16 (stage1_shape.h, MmaDeepPipeline): one block
// per SM with three steps in flight instead of three blocks with one each.
using Mma8Deep = MmaConfig<8, 8, 4, 1, 128>;    // 136 KB
using Mma16Deep = MmaConfig<16, 8, 4, 1, 128>;  // 144 KB
static_assert(Mma8::kMinBlocks == 3 && Mma16::kMinBlocks == 3,
              "MmaDeepPipeline's wave is 3 blocks per SM");
// Larger batches take 128-row chunks: two blocks per SM, so one block's
// epilogue overlaps the other's main loop (a 256-row block would hold the SM
// alone), and the chunks of a tile, numbered next to each other, share its W
// through L2.

// Byte offset of 16-byte chunk `chunk` of tile row `row` in a shared tile of
// kRowBytes-byte rows (a multiple of 128): the chunk's low 3 bits are
// XOR-swizzled by the row's, so 8 consecutive rows' same chunk land in 8
// different bank groups.
template <int kRowBytes>
__device__ __forceinline__ uint32_t SwizzledOffset(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// ---- PTX wrappers -----------------------------------------------------------------
__device__ __forceinline__ void CpAsync16(uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}
__device__ __forceinline__ void LdMatrixX2(uint32_t (&r)[2], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr));
}

struct Bf16Mma {
  // Exponent bits of a 16-bit value that is infinite or NaN when all set.
  static constexpr uint32_t kNonFiniteExponent = 0x7f80u;
  __device__ static uint32_t Pack(float lo, float hi) {
    return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
  }
  __device__ static void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

struct Fp16Mma {
  static constexpr uint32_t kNonFiniteExponent = 0x7c00u;
  __device__ static uint32_t Pack(float lo, float hi) {
    return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
           (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16);
  }
  __device__ static void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// ---- Kernel 1: H -> Hr ------------------------------------------------------------
// The element of H that Hr's element i (a multiple of 8) holds, or -1 for a
// zero. Hr row `at` holds row chunk * chunk_rows + within of H, where at =
// chunk * block_rows + within (HiddenChunks), or zeros where within >=
// chunk_rows or that row is past the batch; the identity layout skips the
// divisions.
__device__ __forceinline__ int64_t HiddenSourceOf(int64_t i, int64_t batch, int64_t hidden_dim,
                                                  int64_t chunk_rows, int64_t block_rows) {
  if (chunk_rows != block_rows) {
    const int64_t at = i / hidden_dim;
    const int64_t within = at % block_rows;
    const int64_t row = at / block_rows * chunk_rows + within;
    return within < chunk_rows && row < batch ? row * hidden_dim + i % hidden_dim : -1;
  }
  return i < batch * hidden_dim ? i : -1;
}

// 8 elements of Hr per thread: two float4 loads, one 16-byte store
// (hidden_dim % 16 == 0, so the 8 lie in one row), laid out by
// HiddenSourceOf. Launched as a programmatic dependent of whatever kernel
// precedes it on the stream (the serving engine's widening lets it be
// scheduled early): it waits for that kernel's
// writes before touching memory, and so for every earlier operation on the
// stream. Only then does it let stage 1 be scheduled: stage 1 reads the
// params, draft tokens and H of earlier operations (a widening may write the
// params) after a wait that covers this kernel alone, so none of them may
// still be running when stage 1 starts.
template <class T>
__global__ void __launch_bounds__(256)
    ConvertHiddenKernel(const float* __restrict__ hidden, int64_t batch, int64_t hidden_dim,
                        int64_t chunk_rows, int64_t block_rows, int64_t filled,
                        unsigned short* __restrict__ hidden_rounded,
                        uint32_t* __restrict__ zero_words) {
  GridDependencyWait();
  AllowDependentLaunch();  // stage 1 may start streaming W meanwhile
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // batch words; the grid has filled / 8 >= batch * hidden_dim / 8 threads.
  if (zero_words != nullptr && thread < batch) zero_words[thread] = 0u;
  const int64_t i = thread * 8;
  if (i >= filled) return;
  const int64_t from = HiddenSourceOf(i, batch, hidden_dim, chunk_rows, block_rows);
  if (from < 0) {
    *reinterpret_cast<uint4*>(hidden_rounded + i) = make_uint4(0, 0, 0, 0);
    return;
  }
  const float4 a = __ldg(reinterpret_cast<const float4*>(hidden + from));
  const float4 b = __ldg(reinterpret_cast<const float4*>(hidden + from + 4));
  *reinterpret_cast<uint4*>(hidden_rounded + i) =
      make_uint4(T::Pack(a.x, a.y), T::Pack(a.z, a.w), T::Pack(b.x, b.y), T::Pack(b.z, b.w));
}

// Kernel 1 for H already in the weights' 16-bit dtype
// (FusedSampleArgs::hidden_in_weight_dtype): the same layout and the same
// place in the stream as ConvertHiddenKernel, with a copy where that kernel
// rounds (a 16-bit value rounds to itself, so Hr holds the same bits either
// way), and with the serving engine's widening kernel's other two jobs
// (hidden_check.h): each element's check (all-ones exponent: infinite or
// NaN; a 16-bit value in the weights' dtype cannot leave their range), with
// the smallest bad index of H reported to the host by the last block, and
// the ride-along copy. The ride is made after GridDependencyWait (the launch
// before may still read what it overwrites, the params), and every thread of
// stage 1 that reads it waits for this grid first (mma.sync: every thread;
// WGMMA: the producer and each folding thread, FoldTile). Every thread reaches
// the report (it has a __syncthreads): no early return.
template <class T>
__global__ void __launch_bounds__(256)
    CopyCheckedHiddenKernel(const unsigned short* __restrict__ rows, int64_t batch, int64_t hidden_dim,
                            int64_t chunk_rows, int64_t block_rows, int64_t filled,
                            unsigned short* __restrict__ hidden_rounded, uint32_t* __restrict__ zero_words,
                            FirstBadToHost report, const uint32_t* ride_src, uint32_t* ride_dst,
                            int64_t ride_words) {
  GridDependencyWait();
  AllowDependentLaunch();
  CopyRideAlong(ride_src, ride_dst, ride_words);
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (zero_words != nullptr && thread < batch) zero_words[thread] = 0u;
  const int64_t i = thread * 8;
  if (i < filled) {
    const int64_t from = HiddenSourceOf(i, batch, hidden_dim, chunk_rows, block_rows);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (from >= 0) {
      v = __ldg(reinterpret_cast<const uint4*>(rows + from));
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      int bad_at = 8;  // the first of the 8 that is refused
#pragma unroll
      for (int j = 7; j >= 0; --j) {
        const uint32_t bits = (words[j / 2] >> (16 * (j % 2))) & 0xffffu;
        if ((bits & T::kNonFiniteExponent) == T::kNonFiniteExponent) bad_at = j;
      }
      if (bad_at < 8) atomicMin(report.first_bad, static_cast<unsigned long long>(from + bad_at));
    }
    *reinterpret_cast<uint4*>(hidden_rounded + i) = v;
  }
  ReportWhenLast(report.first_bad, report.blocks_done, report.first_bad_host);
}

// ---- Kernel 2: the GEMM with the sampling epilogue ---------------------------------
// What the block does with its dot tile (the main loop is the same for all):
enum class MmaEpilogue {
  kSample,      // the plain sampler's tile summaries
  kControlled,  // the fused controlled path's (fused_controls.cuh)
  kLogits,      // the dots themselves, as fp32 logits (LaunchMmaLogits)
};

// Block b: row chunk (b % num_chunks), rows [chunk * kRows, chunk * kRows + kRows);
// tile (b / num_chunks), tokens [tile * 128, tile * 128 + 128). Writes
// tile_summaries[row * num_tiles + tile] for each of its rows < batch, or
// (kLogits) logits[row * logits_ld + token] for its rows < batch and tokens
// < valid_vocab.
template <class T, class Cfg, MmaEpilogue kEpilogue>
__global__ void __launch_bounds__(kThreads, Cfg::kMinBlocks)
    MmaTileKernel(const unsigned short* __restrict__ weight,
                  const unsigned short* __restrict__ hidden_rounded,
                  const RowParams* __restrict__ params, int64_t batch, int64_t valid_vocab,
                  int64_t hidden_dim, int64_t num_chunks, int64_t num_tiles, bool want_lse,
                  const int32_t* __restrict__ draft_tokens, float* __restrict__ draft_logits,
                  int64_t token_offset, SampleSummary* __restrict__ tile_summaries,
                  MmaControls ctl, float* __restrict__ logits, int64_t logits_ld) {
  constexpr int kRows = Cfg::kRows, kStages = Cfg::kStages, kMi = Cfg::kMi, kNi = Cfg::kNi;
  extern __shared__ __align__(128) unsigned char mma_smem[];
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(mma_smem));

  const int64_t chunk = blockIdx.x % num_chunks;
  const int64_t tile = blockIdx.x / num_chunks;
  const int64_t row0 = chunk * kRows;
  const int64_t tok0 = tile * kTileTokens;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int warp_m = warp % Cfg::kWarpsM;  // warps along M are neighbours
  const int warp_n = warp / Cfg::kWarpsM;
  const int64_t num_steps = (hidden_dim + Cfg::kKStep - 1) / Cfg::kKStep;

  // One step's copies. W: 128 rows x kChunksPerRow chunks; thread i copies
  // chunk column c = i % kChunksPerRow of rows i / kChunksPerRow + q * kRowStep.
  // H: kRows rows, the same way. Dead rows (past valid_vocab or the batch) and
  // chunks past hidden_dim (hidden_dim % 16 == 0: a chunk is wholly inside or
  // outside) copy zeros from a valid address. Offsets are formed once here.
  constexpr int kCpr = Cfg::kChunksPerRow;
  constexpr int kRowStep = kThreads / kCpr;
  constexpr int kWCopies = kTileTokens / kRowStep;
  constexpr int kHCopies = (kRows + kRowStep - 1) / kRowStep;
  const int copy_col = static_cast<int>(threadIdx.x) % kCpr;
  const int copy_row = static_cast<int>(threadIdx.x) / kCpr;
  const uint32_t copy_dst = SwizzledOffset<Cfg::kRowBytes>(copy_row, copy_col);
  const int64_t row_step_elems = int64_t{kRowStep} * hidden_dim;
  const int64_t w_first = (tok0 + copy_row) * hidden_dim + copy_col * 8;
  const int64_t h_first = (row0 + copy_row) * hidden_dim + copy_col * 8;
  uint32_t w_live = 0, h_live = 0;  // bit q: copy q's row exists
#pragma unroll
  for (int q = 0; q < kWCopies; ++q) {
    if (tok0 + copy_row + q * kRowStep < valid_vocab) w_live |= 1u << q;
  }
#pragma unroll
  for (int q = 0; q < kHCopies; ++q) {
    if (copy_row + q * kRowStep < kRows && row0 + copy_row + q * kRowStep < batch) h_live |= 1u << q;
  }
  auto issue_w = [&](int64_t step) {
    if (step < num_steps) {
      const uint32_t stage = smem_base + static_cast<uint32_t>((step % kStages) * Cfg::kStageBytes);
      const int64_t k0 = step * Cfg::kKStep;
      const bool k_live = k0 + copy_col * 8 < hidden_dim;
#pragma unroll
      for (int q = 0; q < kWCopies; ++q) {
        const bool live = k_live && ((w_live >> q) & 1u);
        const unsigned short* src = live ? weight + (w_first + q * row_step_elems + k0) : weight;
        CpAsync16(stage + copy_dst + q * kRowStep * Cfg::kRowBytes, src, live);
      }
    }
  };
  auto issue_h = [&](int64_t step) {
    if (step < num_steps) {
      const uint32_t stage = smem_base + static_cast<uint32_t>((step % kStages) * Cfg::kStageBytes);
      const int64_t k0 = step * Cfg::kKStep;
      const bool k_live = k0 + copy_col * 8 < hidden_dim;
#pragma unroll
      for (int q = 0; q < kHCopies; ++q) {
        if (kRows % kRowStep == 0 || copy_row + q * kRowStep < kRows) {
          const bool live = k_live && ((h_live >> q) & 1u);
          const unsigned short* src =
              live ? hidden_rounded + (h_first + q * row_step_elems + k0) : hidden_rounded;
          CpAsync16(stage + Cfg::kWBytes + copy_dst + q * kRowStep * Cfg::kRowBytes, src, live);
        }
      }
    }
  };

  float acc[kMi][kNi][4];
#pragma unroll
  for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
    for (int ni = 0; ni < kNi; ++ni) {
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;
    }
  }

  // ldmatrix row addresses of this lane. A (x4): matrices (tokens 0-7, k lo),
  // (8-15, lo), (0-7, hi), (8-15, hi) = a0..a3 of m16n8k16. B (x4): (rows 0-7,
  // k lo), (0-7, hi), (8-15, lo), (8-15, hi) = b0, b1 of two n8 blocks.
  const int a_row = warp_m * Cfg::kWarpTokens + (lane & 15);
  const int a_chunk = lane >> 4;
  const int b_row = warp_n * Cfg::kWarpRows + (lane & 7) + ((lane >> 4) << 3);
  const int b_chunk = (lane >> 3) & 1;

#pragma unroll
  // Prologue: W of the first kStages - 1 steps needs nothing from the H
  // conversion kernel, so it is requested before waiting for that kernel.
  // Group 0 then holds W of all those steps and H of step 0, group s only H
  // of step s: waiting for group s still covers everything step s reads.
  for (int s = 0; s < kStages - 1; ++s) issue_w(s);
  GridDependencyWait();  // Hr is written
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    issue_h(s);
    CpAsyncCommit();
  }
  for (int64_t step = 0; step < num_steps; ++step) {
    CpAsyncWait<kStages - 2>();  // this thread's copies of `step` have landed
    __syncthreads();             // everyone's have; everyone is done with step - 1
    issue_w(step + kStages - 1);  // into the slot step - 1 used
    issue_h(step + kStages - 1);
    CpAsyncCommit();  // possibly empty: one group per step keeps the wait count right
    const uint32_t w_tile = smem_base + static_cast<uint32_t>((step % kStages) * Cfg::kStageBytes);
    const uint32_t h_tile = w_tile + Cfg::kWBytes;
#pragma unroll
    for (int kk = 0; kk < Cfg::kKStep / 16; ++kk) {
      uint32_t a[kMi][4];
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi) {
        LdMatrixX4(a[mi], w_tile + SwizzledOffset<Cfg::kRowBytes>(a_row + mi * 16, 2 * kk + a_chunk));
      }
      uint32_t b[kNi][2];
      if constexpr (kNi == 1) {
        LdMatrixX2(b[0], h_tile + SwizzledOffset<Cfg::kRowBytes>(b_row, 2 * kk + b_chunk));
      } else {
#pragma unroll
        for (int np = 0; np < kNi / 2; ++np) {
          uint32_t r[4];
          LdMatrixX4(r, h_tile + SwizzledOffset<Cfg::kRowBytes>(b_row + np * 16, 2 * kk + b_chunk));
          b[2 * np][0] = r[0];
          b[2 * np][1] = r[1];
          b[2 * np + 1][0] = r[2];
          b[2 * np + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
        for (int ni = 0; ni < kNi; ++ni) T::Mma(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
      }
    }
  }
  AllowDependentLaunch();  // stage 2 may be scheduled; it waits for our writes
  CpAsyncWait<0>();  // only empty groups remain; the ring is reused below
  __syncthreads();

  // Epilogue, 1: the accumulators to shared memory as logits [kRows][128 + 4]
  // (fp32 dots, before the scale). acc[mi][ni][2 * hh + j] is token
  // warp_m * kWarpTokens + 16 * mi + g + 8 * hh, row warp_n * kWarpRows +
  // 8 * ni + 2t + j of the block tile. The +4 padding spreads a warp's stores
  // over all 32 banks and keeps rows 16-byte aligned.
  float* dots = reinterpret_cast<float*>(mma_smem);
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
    for (int ni = 0; ni < kNi; ++ni) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int token = warp_m * Cfg::kWarpTokens + 16 * mi + g + 8 * (q >> 1);
        const int rloc = warp_n * Cfg::kWarpRows + 8 * ni + 2 * t + (q & 1);
        dots[rloc * kDotStride + token] = acc[mi][ni][q];
      }
    }
  }
  __syncthreads();

  // Epilogue, 2 (logits): one warp per row, lane j stores tokens j, j + 32,
  // j + 64, j + 96, so each store instruction writes 128 contiguous bytes
  // (any logits_ld: no vector alignment is assumed). The values are the
  // accumulators as they are: no scale, no transform.
  if constexpr (kEpilogue == MmaEpilogue::kLogits) {
    for (int r = warp; r < kRows; r += kWarps) {
      if (row0 + r >= batch) break;  // uniform across the warp
      float* out = logits + (row0 + r) * logits_ld + tok0;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int j = lane + 32 * q;
        if (tok0 + j < valid_vocab) out[j] = dots[r * kDotStride + j];
      }
    }
  } else if constexpr (kEpilogue == MmaEpilogue::kControlled) {
    // Epilogue, 2 (controlled): fused_controls.cuh, one warp per row as below.
    for (int r = warp; r < kRows; r += kWarps) {
      if (row0 + r >= batch) break;  // uniform across the warp
      ControlledTileRow(ctl, params, row0 + r, dots + r * kDotStride, tok0, token_offset,
                        valid_vocab, num_tiles, tile, lane, tile_summaries);
    }
  } else {
    // Epilogue, 2: one warp per row, lane k takes the 4 consecutive tokens
    // [4k, 4k + 4) of the tile (one Philox block for all four), then a butterfly
    // merges the 32 lanes. The same shape for every block configuration, so a
    // row's summary (logz rounding included) does not depend on the batch.
    for (int r = warp; r < kRows; r += kWarps) {
      if (row0 + r >= batch) break;  // uniform across the warp
      const RowSampler row =
          RowSampler::Load(params, row0 + r, true, draft_tokens, draft_logits, token_offset);
      const float4 d = *reinterpret_cast<const float4*>(dots + r * kDotStride + 4 * lane);
      SampleSummary s = EmptySampleSummary();
      row.AddFour(s, tok0 + 4 * lane, d, valid_vocab, want_lse);
#pragma unroll
      for (int m = 16; m >= 1; m /= 2) s = MergeSummaries(s, ShuffleXorSummary(s, m));
      if (lane == 0) tile_summaries[(row0 + r) * num_tiles + tile] = s;
    }
  }
}

// ---- Launcher ----------------------------------------------------------------------
// What a launch writes besides the plain sampler's tile summaries: the
// controlled path's (controls set) or the logits (logits set), never both.
struct MmaOutputs {
  const MmaControls* controls = nullptr;
  float* logits = nullptr;
  int64_t logits_ld = 0;
};

// Grid: num_tiles * ceil(batch / kRows) blocks of kThreads = 256 threads,
// kSmemBytes = kStages * (128 + kRows) * 2 * kKStep bytes of dynamic shared
// memory each (table above). At V = 151936 there are 1187 tiles: 2.99 waves
// of 3 blocks per SM on 132 SMs for 8 and 16 rows, 4.5 waves of 2 for 32..128.
// Where 3 blocks per SM would end in a last wave at most a third full (rows
// >= 7168), 8 and 16 rows take the deep configs: DeepPipeline below.
template <class T, class Cfg>
cudaError_t LaunchTiles(const FusedSampleArgs& a, const unsigned short* hidden_rounded,
                        int64_t num_tiles, bool want_lse, SampleSummary* tile_summaries,
                        cudaStream_t stream, MmaOutputs out) {
  const int64_t num_chunks = (a.batch + Cfg::kRows - 1) / Cfg::kRows;
  const int64_t blocks = num_tiles * num_chunks;
  if (blocks > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
  const MmaControls* controls = out.controls;
  auto* kernel = out.logits != nullptr  ? &MmaTileKernel<T, Cfg, MmaEpilogue::kLogits>
                 : controls != nullptr ? &MmaTileKernel<T, Cfg, MmaEpilogue::kControlled>
                                       : &MmaTileKernel<T, Cfg, MmaEpilogue::kSample>;
  const cudaError_t err =
      OptInDynamicSharedMemory(reinterpret_cast<const void*>(kernel), static_cast<int>(Cfg::kSmemBytes));
  if (err != cudaSuccess) return err;
  // Programmatic dependent launch: blocks may start while the H conversion
  // still runs (they wait for it before reading Hr).
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = DependentLaunch(
      dim3(static_cast<unsigned>(blocks)), dim3(kThreads), Cfg::kSmemBytes, stream, &attribute);
  return cudaLaunchKernelEx(&config, kernel, static_cast<const unsigned short*>(a.weight),
                            hidden_rounded, a.params, a.batch, a.valid_vocab, a.hidden_dim,
                            num_chunks, num_tiles, want_lse, a.draft_tokens, a.draft_logprobs,
                            a.token_offset, tile_summaries,
                            controls != nullptr ? *controls : MmaControls{}, out.logits,
                            out.logits_ld);
}

// Whether a launch of at most 16 rows takes the deep pipeline: as forced by
// a.mma_pipeline, else by MmaDeepPipeline (stage1_shape.h) for the plain
// sampler. The fused controlled epilogue keeps the default (not measured).
cudaError_t DeepPipeline(const FusedSampleArgs& a, int64_t num_tiles, const MmaControls* c,
                         bool* deep) {
  *deep = a.mma_pipeline == MmaPipeline::kDeep;
  if (a.mma_pipeline != MmaPipeline::kAuto || c != nullptr || a.hidden_dim < kMmaDeepMinHidden) {
    return cudaSuccess;  // no device query where the rule cannot pick deep
  }
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  *deep = err == cudaSuccess && MmaDeepPipeline(num_tiles, a.hidden_dim, sms);
  return err;
}

template <class T>
cudaError_t LaunchConvertHidden(const FusedSampleArgs& a, unsigned short* hidden_rounded,
                                cudaStream_t stream, const HiddenChunks& layout,
                                uint32_t* zero_words = nullptr) {
  if (layout.chunk_rows < 1 || layout.chunk_rows > layout.block_rows ||
      layout.num_chunks * layout.chunk_rows < a.batch) {
    return cudaErrorInvalidValue;
  }
  // One thread per 8 elements of Hr (a 16-byte store): the grid covers the
  // filled rows, which a multiple of 16 elements each.
  const int64_t filled = layout.rows_filled() * a.hidden_dim;
  const int64_t convert_blocks = (filled / 8 + 255) / 256;
  if (convert_blocks > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config =
      DependentLaunch(dim3(static_cast<unsigned>(convert_blocks)), dim3(256), 0, stream, &attribute);
  const HiddenInWeightDType& in = a.hidden_in_weight_dtype;
  if (in.rows != nullptr) {
    const auto* ride_src = static_cast<const uint32_t*>(in.ride.src);
    auto* ride_dst = static_cast<uint32_t*>(in.ride.dst);
    const int64_t ride_words = static_cast<int64_t>(in.ride.bytes / 4);
    return cudaLaunchKernelEx(&config, CopyCheckedHiddenKernel<T>, static_cast<const unsigned short*>(in.rows),
                              a.batch, a.hidden_dim, layout.chunk_rows, layout.block_rows, filled,
                              hidden_rounded, zero_words, in.report, ride_src, ride_dst, ride_words);
  }
  return cudaLaunchKernelEx(&config, ConvertHiddenKernel<T>, a.hidden, a.batch, a.hidden_dim,
                            layout.chunk_rows, layout.block_rows, filled, hidden_rounded, zero_words);
}

template <class T>
cudaError_t LaunchForBatch(const FusedSampleArgs& a, unsigned short* hidden_rounded,
                           int64_t num_tiles, bool want_lse, SampleSummary* tile_summaries,
                           cudaStream_t stream, MmaOutputs c) {
  cudaError_t err = LaunchConvertHidden<T>(a, hidden_rounded, stream, HiddenChunks::Identity(a.batch));
  if (err != cudaSuccess) return err;
  // The smallest block that holds the batch; above 128 rows, chunks of 128.
  const unsigned short* hr = hidden_rounded;
  if (a.batch <= 16) {
    bool deep = false;
    err = DeepPipeline(a, num_tiles, c.controls, &deep);
    if (err != cudaSuccess) return err;
    if (a.batch <= 8) {
      return deep ? LaunchTiles<T, Mma8Deep>(a, hr, num_tiles, want_lse, tile_summaries, stream, c)
                  : LaunchTiles<T, Mma8>(a, hr, num_tiles, want_lse, tile_summaries, stream, c);
    }
    return deep ? LaunchTiles<T, Mma16Deep>(a, hr, num_tiles, want_lse, tile_summaries, stream, c)
                : LaunchTiles<T, Mma16>(a, hr, num_tiles, want_lse, tile_summaries, stream, c);
  }
  if (a.batch <= 32) return LaunchTiles<T, Mma32>(a, hr, num_tiles, want_lse, tile_summaries, stream, c);
  if (a.batch <= 64) return LaunchTiles<T, Mma64>(a, hr, num_tiles, want_lse, tile_summaries, stream, c);
  return LaunchTiles<T, Mma128>(a, hr, num_tiles, want_lse, tile_summaries, stream, c);
}

}  // namespace

bool MmaStage1Serves(const FusedSampleArgs& args) {
  const bool half = args.weight_dtype == CudaWeightDType::kBFloat16 ||
                    args.weight_dtype == CudaWeightDType::kFloat16;
  return half && args.hidden_dim % 16 == 0 &&
         reinterpret_cast<uintptr_t>(args.weight) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(args.hidden) % 16 == 0;
}

cudaError_t LaunchRoundHidden(const FusedSampleArgs& args, unsigned short* hidden_rounded,
                              cudaStream_t stream, const HiddenChunks& layout,
                              uint32_t* zero_words) {
  return args.weight_dtype == CudaWeightDType::kFloat16
             ? LaunchConvertHidden<Fp16Mma>(args, hidden_rounded, stream, layout, zero_words)
             : LaunchConvertHidden<Bf16Mma>(args, hidden_rounded, stream, layout, zero_words);
}

cudaError_t LaunchMmaStage1(const FusedSampleArgs& args, int64_t num_tiles, bool want_lse,
                            SampleSummary* tile_summaries, unsigned short* hidden_rounded,
                            cudaStream_t stream, const MmaControls* controls) {
  MmaOutputs out;
  out.controls = controls;
  if (args.weight_dtype == CudaWeightDType::kFloat16) {
    return LaunchForBatch<Fp16Mma>(args, hidden_rounded, num_tiles, want_lse, tile_summaries,
                                   stream, out);
  }
  return LaunchForBatch<Bf16Mma>(args, hidden_rounded, num_tiles, want_lse, tile_summaries,
                                 stream, out);
}

cudaError_t LaunchMmaLogits(const FusedSampleArgs& args, float* logits, int64_t logits_ld,
                            unsigned short* hidden_rounded, cudaStream_t stream) {
  if (logits == nullptr || logits_ld < args.valid_vocab) return cudaErrorInvalidValue;
  const int64_t num_tiles = (args.valid_vocab + kTileTokens - 1) / kTileTokens;
  MmaOutputs out;
  out.logits = logits;
  out.logits_ld = logits_ld;
  if (args.weight_dtype == CudaWeightDType::kFloat16) {
    return LaunchForBatch<Fp16Mma>(args, hidden_rounded, num_tiles, false, nullptr, stream, out);
  }
  return LaunchForBatch<Bf16Mma>(args, hidden_rounded, num_tiles, false, nullptr, stream, out);
}

}  // namespace flashsampler::kernels::cuda_internal
