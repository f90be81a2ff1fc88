// FixedOrderLogits: batch-invariant CPU logits (the order is the contract in
// fixed_order_logits.h).
//
// Why the variants agree bit for bit: each performs, for every (row, token),
// the same sequence of correctly rounded IEEE operations on the same operands:
// 16 chains of fma in increasing k (zero-padded tail: fma(0, 0, lane) adds an
// exact +0, as a 17th element of a padded row would), then the same adds in
// the same tree. fma(a, b, c) == fma(b, a, c) and x + y == y + x exactly, so
// operand order inside one operation does not matter; the grouping does, and
// it is fixed. Nothing here may be compiled with -ffast-math (it would let the
// compiler regroup the adds); the AVX2 path uses intrinsics, so no contraction
// or reassociation can change it either.
//
// Speed: the AVX2 micro-kernel keeps 2 rows x 3 tokens of dot products in 12
// accumulator registers (a lo/hi pair of 8 lanes each). Tokens are the outer
// loop: 3 rows of w stay in L1 while every row block of h streams past them
// from L2. W is read once per call whatever the batch (no packing copy, unlike
// sgemm): at one row, a decode step, it is 2x faster than OpenBLAS. At larger
// batches it is not blocked like a GEMM (h streams from L2 for every token
// block), and OpenBLAS stays ahead: measured on the 2-core machine (demo head
// V=32000 D=1024, 2 threads) 0.8x at B = 16 and 0.55x at B = 128. A 2 x 2
// block (fewer loads per fma) measured slower at B = 16 and the same at 128:
// the bound is the memory hierarchy, not the load ports. So the CPU backend
// uses it where asked (--batch_invariant), not by default.
#include "kernels/cpu/fixed_order_logits.h"

#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace flashsampler::kernels {
namespace {

constexpr int kLanes = kFixedOrderLanes;

// ---------------------------------------------------------------- scalar ----

// The 16-lane tree, shared by every variant's final step in spirit; the
// AVX2 path spells the same adds with vector instructions.
inline float LaneTree(float* lane) {
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int i = 0; i < width; ++i) lane[i] += lane[i + width];
  }
  return lane[0];
}

float ScalarDot(const float* a, const float* b, int64_t hidden) {
  float lane[kLanes];
  for (float& l : lane) l = 0.0f;
  const int64_t padded = (hidden + kLanes - 1) / kLanes * kLanes;
  for (int64_t k = 0; k < padded; ++k) {
    const float x = k < hidden ? a[k] : 0.0f;
    const float y = k < hidden ? b[k] : 0.0f;
    lane[k % kLanes] = std::fma(x, y, lane[k % kLanes]);
  }
  return LaneTree(lane);
}

void ScalarLogits(const float* h, int64_t rows, const float* w, int64_t n, int64_t hidden,
                  float* out) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t r = 0; r < rows; ++r) out[r * n + j] = ScalarDot(h + r * hidden, w + j * hidden, hidden);
  }
}

// ------------------------------------------------------------------ AVX2 ----
#if defined(__x86_64__)

#define FS_AVX2 __attribute__((target("avx2,fma")))

// Lanes 0-7 (lo) and 8-15 (hi) of one dot product's 16 chains.
struct LanePair {
  __m256 lo, hi;
};

// l_i + l_{i+8}, then + l_{i+4}, + l_{i+2}, l_0 + l_1: LaneTree's adds.
FS_AVX2 inline float ReduceLanes(LanePair p) {
  const __m256 s8 = _mm256_add_ps(p.lo, p.hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// Loads 8 floats at p, of which the first `valid` (0..8) are real and the
// rest read as +0 (the zero padding of the contract; nothing past the row is
// touched).
FS_AVX2 inline __m256 LoadPadded(const float* p, int64_t valid) {
  if (valid >= 8) return _mm256_loadu_ps(p);
  if (valid <= 0) return _mm256_setzero_ps();
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)), index);
  return _mm256_maskload_ps(p, mask);
}

// R rows x T tokens of dot products; rows h[r * hidden], tokens w[t * hidden].
template <int R, int T>
FS_AVX2 void Avx2Block(const float* h, const float* w, int64_t hidden, float* out, int64_t ldo) {
  LanePair acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  }
  const int64_t full = hidden / kLanes * kLanes;
  int64_t k = 0;
  for (; k < full; k += kLanes) {
    __m256 hv[R];
    for (int r = 0; r < R; ++r) hv[r] = _mm256_loadu_ps(h + r * hidden + k);
    for (int t = 0; t < T; ++t) {
      const __m256 wv = _mm256_loadu_ps(w + t * hidden + k);
      for (int r = 0; r < R; ++r) acc[r][t].lo = _mm256_fmadd_ps(hv[r], wv, acc[r][t].lo);
    }
    for (int r = 0; r < R; ++r) hv[r] = _mm256_loadu_ps(h + r * hidden + k + 8);
    for (int t = 0; t < T; ++t) {
      const __m256 wv = _mm256_loadu_ps(w + t * hidden + k + 8);
      for (int r = 0; r < R; ++r) acc[r][t].hi = _mm256_fmadd_ps(hv[r], wv, acc[r][t].hi);
    }
  }
  if (k < hidden) {  // the zero-padded last group of 16
    const int64_t rest = hidden - k;
    for (int t = 0; t < T; ++t) {
      const __m256 wlo = LoadPadded(w + t * hidden + k, rest);
      const __m256 whi = LoadPadded(w + t * hidden + k + 8, rest - 8);
      for (int r = 0; r < R; ++r) {
        const __m256 hlo = LoadPadded(h + r * hidden + k, rest);
        const __m256 hhi = LoadPadded(h + r * hidden + k + 8, rest - 8);
        acc[r][t].lo = _mm256_fmadd_ps(hlo, wlo, acc[r][t].lo);
        acc[r][t].hi = _mm256_fmadd_ps(hhi, whi, acc[r][t].hi);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) out[r * ldo + t] = ReduceLanes(acc[r][t]);
  }
}

// Row blocks of 2 (then 1) under token blocks of T.
template <int T>
FS_AVX2 void Avx2TokenBlock(const float* h, int64_t rows, const float* w, int64_t hidden,
                            float* out, int64_t ldo) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) Avx2Block<2, T>(h + r * hidden, w, hidden, out + r * ldo, ldo);
  if (r < rows) Avx2Block<1, T>(h + r * hidden, w, hidden, out + r * ldo, ldo);
}

FS_AVX2 void Avx2Logits(const float* h, int64_t rows, const float* w, int64_t n, int64_t hidden,
                        float* out) {
  int64_t j = 0;
  for (; j + 3 <= n; j += 3) Avx2TokenBlock<3>(h, rows, w + j * hidden, hidden, out + j, n);
  if (n - j == 2) Avx2TokenBlock<2>(h, rows, w + j * hidden, hidden, out + j, n);
  if (n - j == 1) Avx2TokenBlock<1>(h, rows, w + j * hidden, hidden, out + j, n);
}

#undef FS_AVX2
#endif  // __x86_64__

}  // namespace

DotIsa BestDotIsa() {
#if defined(__x86_64__)
  static const DotIsa best = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                                 ? DotIsa::kAvx2
                                 : DotIsa::kScalar;
  return best;
#else
  return DotIsa::kScalar;
#endif
}

const char* DotIsaName(DotIsa isa) { return isa == DotIsa::kAvx2 ? "avx2" : "scalar"; }

void FixedOrderLogits(const float* h, int64_t rows, const float* w, int64_t n, int64_t hidden,
                      float* out, DotIsa isa) {
#if defined(__x86_64__)
  if (isa == DotIsa::kAvx2) {
    Avx2Logits(h, rows, w, n, hidden, out);
    return;
  }
#endif
  ScalarLogits(h, rows, w, n, hidden, out);
}

}  // namespace flashsampler::kernels
