// Tensor-core stage 1 of the fused sampler: the same per-(row, tile)
// SampleSummary as the CUDA-core stage 1 in fused_sample.cu, with the dot
// products formed by mma.sync.m16n8k16 (fp16 / bf16 inputs, fp32 accumulate).
//
// Two kernels share the scheme below and differ in how W reaches the tensor
// cores (both measured on H100, BENCHMARKS-style bench, D = 4096 / 8192):
//   - MmaStreamKernel (batch <= kStreamMaxBatch = 32, NB = 1, 2 or 4): W goes
//     straight from global memory into registers, 256 tokens per block;
//   - MmaRingKernel (batch > 32, NB = 8): the cp.async ring described next,
//     128 tokens per block.
// Ring kernel: block = 8 warps, one workspace tile of kMmaTileVocab = 128
// tokens and one chunk of NR = 8 * NB rows. Warp w owns the 16 tokens
// [16w, 16w + 16) of the tile as one m16 block (the A operand: W rows); the
// rows are the n8 blocks of the B operand. K advances in steps of 64:
//   - W: each thread copies its own 4 x 16 bytes of the step (cp.async, 16-byte,
//     L2 only) into a private slot of a kStages-deep shared-memory ring, so
//     kStages - 1 steps of W are in flight while the tensor cores work and no
//     barrier is needed for W; every W element crosses HBM once per row chunk;
//   - H: the chunk's fp32 rows of the step are loaded into registers one step
//     ahead, rounded to the weight dtype (exact when they are representable:
//     see fused_sample.h) and stored to a double-buffered shared array;
//   - mma: the K order inside a step is permuted identically for A and B
//     (thread (g, t) of the mma holds the 16 contiguous elements [16t, 16t + 16)
//     of the step for its W rows g and g + 8 and for its H row g), which lets
//     both operands come from 16-byte accesses; the dot product is the same sum
//     in a different fp32 order than the CUDA-core path.
//
// Epilogue: accumulator (token, row) -> RowSampler::Add (l' = TransformLogit(dot, scale), plus
// the row's Gumbel noise for sampled rows, folded with AddToken); per row the 8
// lanes holding a warp's 16 tokens are merged by a butterfly, and the 8 warps
// in token order into the tile's SampleSummary in the workspace. Stage 2
// (sample_reduce.cu) is shared with the CUDA-core path.
//
// Batches over the largest chunk (32 rows streaming, 64 ring): one block per
// (token block, row chunk), chunks fastest, so the later chunks of a token
// block find its W rows in L2.
#include "kernels/cuda/fused_sample_mma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "kernels/common/gumbel_noise.h"
#include "kernels/common/sample_summary.h"
#include "kernels/cuda/sample_reduce.cuh"

namespace flashsampler::kernels::cuda_internal {
namespace {

constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaTileVocab = 128;                       // workspace tile (as fused_sample.cu)
static_assert(kMmaTileVocab == kMmaWarps * 16, "one m16 block of tokens per warp");
constexpr int kKStep = 64;                               // K elements per pipeline step
constexpr int kHStride = kKStep + 8;                     // padded smem H row (16-bit elements)
constexpr int kStages = 4;                               // W steps in the cp.async ring
constexpr int kWVecs = 4;                                // 16-byte W pieces per thread per step
constexpr int kMaxNBlocks = 8;                           // up to 64 rows per block

// Streaming kernel (first below): kMBlocks m16 blocks of tokens per warp.
constexpr int kMBlocks = 2;
constexpr int kStreamBlockVocab = kMmaWarps * 16 * kMBlocks;  // 256 tokens per block
constexpr int kTilesPerBlock = kStreamBlockVocab / kMmaTileVocab;
constexpr int kSubBlocksPerTile = kMmaTileVocab / 16;
static_assert(kStreamBlockVocab % kMmaTileVocab == 0, "a block holds whole tiles");
constexpr int64_t kStreamMaxBatch = 32;  // larger batches take the ring kernel

// Ring kernel (second below). Dynamic shared memory: the W ring, then the two H buffers. The warp
// summaries of the epilogue reuse the ring.
constexpr size_t kWRingBytes = size_t{kStages} * kWVecs * kMmaThreads * 16;
template <int NR>
constexpr size_t MmaSmemBytes() {
  return kWRingBytes + size_t{2} * NR * kHStride * sizeof(unsigned short);
}
static_assert(kWRingBytes >= sizeof(SampleSummary) * kMmaWarps * kMaxNBlocks * 8,
              "the warp summaries fit in the W ring");

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
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

struct Bf16Mma {
  __device__ static uint32_t Pack(float lo, float hi) {
    return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
  }
  __device__ static void Mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

struct Fp16Mma {
  __device__ static uint32_t Pack(float lo, float hi) {
    return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
           (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16);
  }
  __device__ static void Mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

// 32-bit word i (0..7) of 16 contiguous 16-bit elements held as two uint4.
__device__ __forceinline__ uint32_t Word(const uint4& lo, const uint4& hi, int i) {
  const uint4& v = i < 4 ? lo : hi;
  switch (i & 3) {
    case 0: return v.x;
    case 1: return v.y;
    case 2: return v.z;
    default: return v.w;
  }
}

// ---- Streaming kernel (batches up to kStreamMaxBatch) -----------------------
// W goes from global memory straight into registers (16-byte loads, one K
// step at a time), each warp owns kMBlocks = 2 m16 blocks (32 tokens), so a
// block covers kStreamBlockVocab = 256 tokens (two workspace tiles); H is
// staged per step in static shared memory. Block b: row chunk
// (b % num_chunks), rows [chunk * NR, chunk * NR + NR); token block
// (b / num_chunks), tokens [vblock * 256, vblock * 256 + 256). Measured faster
// than the ring kernel below for up to 32 rows, slower beyond.
template <class T, int NB>
__global__ void __launch_bounds__(kMmaThreads, 2)
    MmaStreamKernel(const unsigned short* __restrict__ weight, const float* __restrict__ hidden,
                  const RowParams* __restrict__ params, int64_t batch, int64_t valid_vocab,
                  int64_t hidden_dim, int64_t num_chunks, int64_t num_tiles, bool want_lse,
                  SampleSummary* __restrict__ tile_summaries) {
  constexpr int NR = NB * 8;
  __shared__ __align__(16) unsigned short h_smem[2][NR * kHStride];
  __shared__ SampleSummary sub_summaries[kMmaWarps * kMBlocks][NR];

  const int64_t chunk = blockIdx.x % num_chunks;
  const int64_t vblock = blockIdx.x / num_chunks;
  const int64_t row0 = chunk * NR;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int g = lane >> 2;  // mma group: W rows g, g + 8; H row g
  const int t = lane & 3;   // thread in group: K elements [16t, 16t + 16) of a step
  const int64_t tok0 = vblock * kStreamBlockVocab + warp * 16 * kMBlocks;

  const unsigned short* wrow[kMBlocks][2];
  bool wlive[kMBlocks][2];
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int64_t v = tok0 + mb * 16 + g + 8 * hh;
      wlive[mb][hh] = v < valid_vocab;
      wrow[mb][hh] = weight + (wlive[mb][hh] ? v : 0) * hidden_dim + 16 * t;
    }
  }

  float acc[kMBlocks][NB][4];
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mb][nb][q] = 0.0f;
    }
  }

  const int64_t num_steps = (hidden_dim + kKStep - 1) / kKStep;
  for (int64_t step = 0; step < num_steps; ++step) {
    const int64_t k0 = step * kKStep;
    // W: this thread's 16 elements of its 2 x kMBlocks rows (hidden_dim % 16
    // == 0, so a 16-element run is wholly inside or outside the row).
    const bool k_live = k0 + 16 * t < hidden_dim;
    uint4 w[kMBlocks][2][2];
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        if (wlive[mb][hh] && k_live) {
          const uint4* p = reinterpret_cast<const uint4*>(wrow[mb][hh] + k0);
          w[mb][hh][0] = __ldcg(p);
          w[mb][hh][1] = __ldcg(p + 1);
        } else {
          w[mb][hh][0] = make_uint4(0u, 0u, 0u, 0u);
          w[mb][hh][1] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
    // H: the chunk's rows, K step [k0, k0 + 64), rounded to the weight dtype
    // (zeros past the batch and past hidden_dim). Double-buffered: the buffer
    // written here was last read two steps ago, before the previous barrier.
    unsigned short* hb = h_smem[step & 1];
    for (int i = threadIdx.x; i < NR * (kKStep / 4); i += kMmaThreads) {
      const int r = i / (kKStep / 4);
      const int c4 = i % (kKStep / 4);
      const int64_t k = k0 + 4 * c4;
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (row0 + r < batch && k < hidden_dim) {
        x = __ldg(reinterpret_cast<const float4*>(hidden + (row0 + r) * hidden_dim + k));
      }
      *reinterpret_cast<uint2*>(hb + r * kHStride + 4 * c4) =
          make_uint2(T::Pack(x.x, x.y), T::Pack(x.z, x.w));
    }
    __syncthreads();
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      const uint4* hp = reinterpret_cast<const uint4*>(hb + (nb * 8 + g) * kHStride + 16 * t);
      const uint4 b_lo = hp[0];
      const uint4 b_hi = hp[1];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t b0 = Word(b_lo, b_hi, 2 * j);
        const uint32_t b1 = Word(b_lo, b_hi, 2 * j + 1);
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb) {
          T::Mma(acc[mb][nb], Word(w[mb][0][0], w[mb][0][1], 2 * j),
                 Word(w[mb][1][0], w[mb][1][1], 2 * j), Word(w[mb][0][0], w[mb][0][1], 2 * j + 1),
                 Word(w[mb][1][0], w[mb][1][1], 2 * j + 1), b0, b1);
        }
      }
    }
  }

  // Epilogue. acc[mb][nb][2 * hh + j] is (token tok0 + mb * 16 + g + 8 * hh,
  // row row0 + nb * 8 + 2t + j).
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int rloc = nb * 8 + 2 * t + j;
      const bool active = row0 + rloc < batch;
      const RowSampler row = RowSampler::Load(params, row0 + rloc, active);
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb) {
        SampleSummary s = EmptySampleSummary();
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int64_t v = tok0 + mb * 16 + g + 8 * hh;
          if (active && v < valid_vocab) row.Add(s, v, acc[mb][nb][2 * hh + j], want_lse);
        }
        // Lanes with the same t (g = 0..7) hold the 16 tokens of this sub-block.
#pragma unroll
        for (int m = 4; m <= 16; m *= 2) s = MergeSummaries(s, ShuffleXorSummary(s, m));
        if (g == 0) sub_summaries[warp * kMBlocks + mb][rloc] = s;
      }
    }
  }
  __syncthreads();

  // Merge each tile's 8 sub-blocks in token order and store the tile summary.
  for (int i = threadIdx.x; i < kTilesPerBlock * NR; i += kMmaThreads) {
    const int tl = i / NR;
    const int r = i % NR;
    const int64_t tile = vblock * kTilesPerBlock + tl;
    if (row0 + r >= batch || tile >= num_tiles) continue;
    SampleSummary s = sub_summaries[tl * kSubBlocksPerTile][r];
#pragma unroll
    for (int q = 1; q < kSubBlocksPerTile; ++q) {
      s = MergeSummaries(s, sub_summaries[tl * kSubBlocksPerTile + q][r]);
    }
    tile_summaries[(row0 + r) * num_tiles + tile] = s;
  }
}

// ---- Ring kernel (batches over kStreamMaxBatch) -------------------------------
// W through the per-thread cp.async ring, one 128-token tile per block (see
// the top of the file). Block b: row chunk (b % num_chunks), rows
// [chunk * NR, chunk * NR + NR); tile (b / num_chunks), tokens
// [tile * 128, tile * 128 + 128).
template <class T, int NB>
__global__ void __launch_bounds__(kMmaThreads, 2)
    MmaRingKernel(const unsigned short* __restrict__ weight, const float* __restrict__ hidden,
                  const RowParams* __restrict__ params, int64_t batch, int64_t valid_vocab,
                  int64_t hidden_dim, int64_t num_chunks, int64_t num_tiles, bool want_lse,
                  SampleSummary* __restrict__ tile_summaries) {
  constexpr int NR = NB * 8;
  constexpr int kHVecs = NR * (kKStep / 4);  // float4s of H per step
  constexpr int kHPerThread = (kHVecs + kMmaThreads - 1) / kMmaThreads;
  extern __shared__ uint4 mma_smem[];
  uint4* w_ring = mma_smem;  // [kStages][kWVecs][kMmaThreads]
  unsigned short* h_smem = reinterpret_cast<unsigned short*>(mma_smem + kStages * kWVecs * kMmaThreads);

  const int64_t chunk = blockIdx.x % num_chunks;
  const int64_t tile = blockIdx.x / num_chunks;
  const int64_t row0 = chunk * NR;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int g = lane >> 2;  // mma group: W rows g, g + 8; H row g
  const int t = lane & 3;   // thread in group: K elements [16t, 16t + 16) of a step
  const int64_t tok0 = tile * kMmaTileVocab + warp * 16;

  // This thread's W pieces: rows g and g + 8, elements [16t, 16t + 16) of a
  // step (dead rows point at row 0 and copy zeros).
  const unsigned short* wrow[2];
  bool wlive[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int64_t v = tok0 + g + 8 * hh;
    wlive[hh] = v < valid_vocab;
    wrow[hh] = weight + (wlive[hh] ? v : 0) * hidden_dim + 16 * t;
  }
  const int64_t num_steps = (hidden_dim + kKStep - 1) / kKStep;
  auto issue_w = [&](int64_t step) {
    if (step < num_steps) {
      const int64_t k0 = step * kKStep;
      const bool k_live = k0 + 16 * t < hidden_dim;  // hidden_dim % 16 == 0
      uint4* slot = w_ring + (step % kStages) * kWVecs * kMmaThreads + threadIdx.x;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const bool live = wlive[hh] && k_live;
        const unsigned short* src = live ? wrow[hh] + k0 : wrow[hh];
        CpAsync16(slot + (2 * hh) * kMmaThreads, src, live);
        CpAsync16(slot + (2 * hh + 1) * kMmaThreads, src + 8, live);
      }
    }
    CpAsyncCommit();  // possibly empty: keeps one group per step
  };

  // H of one step into registers (zeros past the batch and past hidden_dim).
  float4 hreg[kHPerThread];
  auto load_h = [&](int64_t step) {
    const int64_t k0 = step * kKStep;
#pragma unroll
    for (int q = 0; q < kHPerThread; ++q) {
      const int i = static_cast<int>(threadIdx.x) + q * kMmaThreads;
      const int r = i / (kKStep / 4);
      const int64_t k = k0 + 4 * (i % (kKStep / 4));
      hreg[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i < kHVecs && row0 + r < batch && k < hidden_dim) {
        hreg[q] = __ldg(reinterpret_cast<const float4*>(hidden + (row0 + r) * hidden_dim + k));
      }
    }
  };

  float acc[NB][4];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[nb][q] = 0.0f;
  }

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_w(s);
  load_h(0);
  for (int64_t step = 0; step < num_steps; ++step) {
    issue_w(step + kStages - 1);
    // H of this step into its buffer, rounded to the weight dtype. The buffer
    // was last read two steps ago, before the previous barrier.
    unsigned short* hb = h_smem + (step & 1) * NR * kHStride;
#pragma unroll
    for (int q = 0; q < kHPerThread; ++q) {
      const int i = static_cast<int>(threadIdx.x) + q * kMmaThreads;
      if (i < kHVecs) {
        const int r = i / (kKStep / 4);
        const int c4 = i % (kKStep / 4);
        *reinterpret_cast<uint2*>(hb + r * kHStride + 4 * c4) =
            make_uint2(T::Pack(hreg[q].x, hreg[q].y), T::Pack(hreg[q].z, hreg[q].w));
      }
    }
    if (step + 1 < num_steps) load_h(step + 1);  // in flight during the mma below
    CpAsyncWait<kStages - 1>();  // this thread's W pieces of `step` have landed
    __syncthreads();             // every thread's H of `step` is stored

    const uint4* slot = w_ring + (step % kStages) * kWVecs * kMmaThreads + threadIdx.x;
    const uint4 w0_lo = slot[0 * kMmaThreads], w0_hi = slot[1 * kMmaThreads];  // row g
    const uint4 w1_lo = slot[2 * kMmaThreads], w1_hi = slot[3 * kMmaThreads];  // row g + 8
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      const uint4* hp = reinterpret_cast<const uint4*>(hb + (nb * 8 + g) * kHStride + 16 * t);
      const uint4 b_lo = hp[0];
      const uint4 b_hi = hp[1];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        T::Mma(acc[nb], Word(w0_lo, w0_hi, 2 * j), Word(w1_lo, w1_hi, 2 * j),
               Word(w0_lo, w0_hi, 2 * j + 1), Word(w1_lo, w1_hi, 2 * j + 1),
               Word(b_lo, b_hi, 2 * j), Word(b_lo, b_hi, 2 * j + 1));
      }
    }
  }
  CpAsyncWait<0>();  // only empty groups remain; the ring is reused below
  __syncthreads();
  SampleSummary* warp_summaries = reinterpret_cast<SampleSummary*>(w_ring);  // [kMmaWarps][NR]

  // Epilogue. acc[nb][2 * hh + j] is (token tok0 + g + 8 * hh, row
  // row0 + nb * 8 + 2t + j).
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int rloc = nb * 8 + 2 * t + j;
      const bool active = row0 + rloc < batch;
      const RowSampler row = RowSampler::Load(params, row0 + rloc, active);
      SampleSummary s = EmptySampleSummary();
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int64_t v = tok0 + g + 8 * hh;
        if (active && v < valid_vocab) row.Add(s, v, acc[nb][2 * hh + j], want_lse);
      }
      // Lanes with the same t (g = 0..7) hold the warp's 16 tokens of this row.
#pragma unroll
      for (int m = 4; m <= 16; m *= 2) s = MergeSummaries(s, ShuffleXorSummary(s, m));
      if (g == 0) warp_summaries[warp * NR + rloc] = s;
    }
  }
  __syncthreads();

  // Merge the 8 warps in token order and store the tile summary.
  if (threadIdx.x < NR && row0 + threadIdx.x < batch) {
    const int r = static_cast<int>(threadIdx.x);
    SampleSummary s = warp_summaries[r];
#pragma unroll
    for (int w = 1; w < kMmaWarps; ++w) s = MergeSummaries(s, warp_summaries[w * NR + r]);
    tile_summaries[(row0 + r) * num_tiles + tile] = s;
  }
}

template <class T, int NB>
cudaError_t LaunchStream(const FusedSampleArgs& a, int64_t num_tiles, bool want_lse,
                   SampleSummary* tile_summaries, cudaStream_t stream) {
  constexpr int NR = NB * 8;
  const int64_t num_chunks = (a.batch + NR - 1) / NR;
  const int64_t vblocks = (num_tiles + kTilesPerBlock - 1) / kTilesPerBlock;
  const int64_t blocks = vblocks * num_chunks;
  if (blocks > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
  MmaStreamKernel<T, NB><<<static_cast<unsigned>(blocks), kMmaThreads, 0, stream>>>(
      static_cast<const unsigned short*>(a.weight), a.hidden, a.params, a.batch, a.valid_vocab,
      a.hidden_dim, num_chunks, num_tiles, want_lse, tile_summaries);
  return cudaGetLastError();
}

template <class T, int NB>
cudaError_t LaunchRing(const FusedSampleArgs& a, int64_t num_tiles, bool want_lse,
                   SampleSummary* tile_summaries, cudaStream_t stream) {
  constexpr int NR = NB * 8;
  constexpr size_t kSmem = MmaSmemBytes<NR>();
  const int64_t num_chunks = (a.batch + NR - 1) / NR;
  const int64_t blocks = num_tiles * num_chunks;
  if (blocks > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
  auto* kernel = &MmaRingKernel<T, NB>;
  const cudaError_t err = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(blocks), kMmaThreads, kSmem, stream>>>(
      static_cast<const unsigned short*>(a.weight), a.hidden, a.params, a.batch, a.valid_vocab,
      a.hidden_dim, num_chunks, num_tiles, want_lse, tile_summaries);
  return cudaGetLastError();
}

template <class T>
cudaError_t LaunchForBatch(const FusedSampleArgs& a, int64_t num_tiles, bool want_lse,
                           SampleSummary* tile_summaries, cudaStream_t stream) {
  if (a.batch <= 8) return LaunchStream<T, 1>(a, num_tiles, want_lse, tile_summaries, stream);
  if (a.batch <= 16) return LaunchStream<T, 2>(a, num_tiles, want_lse, tile_summaries, stream);
  static_assert(kStreamMaxBatch == 32, "the streaming kernel's largest chunk");
  if (a.batch <= kStreamMaxBatch) {
    return LaunchStream<T, 4>(a, num_tiles, want_lse, tile_summaries, stream);
  }
  return LaunchRing<T, kMaxNBlocks>(a, num_tiles, want_lse, tile_summaries, stream);
}

}  // namespace

bool MmaStage1Eligible(const FusedSampleArgs& args) {
  const bool half = args.weight_dtype == CudaWeightDType::kBFloat16 ||
                    args.weight_dtype == CudaWeightDType::kFloat16;
  return half && args.batch >= kMmaMinBatch && args.hidden_dim % 16 == 0 &&
         reinterpret_cast<uintptr_t>(args.weight) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(args.hidden) % 16 == 0;
}

cudaError_t LaunchMmaStage1(const FusedSampleArgs& args, int64_t num_tiles, bool want_lse,
                            SampleSummary* tile_summaries, cudaStream_t stream) {
  if (args.weight_dtype == CudaWeightDType::kFloat16) {
    return LaunchForBatch<Fp16Mma>(args, num_tiles, want_lse, tile_summaries, stream);
  }
  return LaunchForBatch<Bf16Mma>(args, num_tiles, want_lse, tile_summaries, stream);
}

}  // namespace flashsampler::kernels::cuda_internal
