// FixedOrderLogits: batch-invariant CPU logits (the order is the contract in
// fixed_order_logits.h: one fma chain per dot product, in increasing k).
//
// Why the variants agree bit for bit: for every (row, token) each performs the
// same correctly rounded fma(h_k, w_k, acc) for k = 0, 1, ... from acc = +0.
// The AVX2 variant vectorizes across 16 tokens of a panel (two registers of 8
// lanes, each lane its own chain) and across rows (one broadcast h_k per row),
// never across k; blocking k into chunks stores each chain to `out` and loads
// it back, which changes no bit. Nothing here may be compiled with
// -ffast-math (it would let the compiler split a chain). Every product is
// added by an explicit fma (std::fma, _mm256_fmadd_ps): GCC contracts a
// separate multiply and add into an fma when it likes (-ffp-contract=fast is
// its default), so the kernel never writes one.
//
// 16-bit panels (bf16, fp16) go through the same micro-kernels: a k step of
// 16 tokens is loaded as 32 bytes and widened to fp32 in registers (the
// format's Avx2Panel / Avx512Panel loader), then multiplied exactly as an
// fp32 k step. Each widening is exact and each token's value meets its own
// token's chain, so every fma sees the operands of the fp32 kernel on the
// widened head:
//   scalar    Bf16ToFloat / Fp16ToFloat (kernels/common/half_precision.h)
//   AVX2      bf16: one 256-bit load; a 32-bit lane holds tokens 2i (low half)
//             and 2i + 1 (high half), so a shift left by 16 gives the even
//             tokens and an AND with 0xffff0000 the odd ones: 3 instructions
//             for 16 tokens. The chains are kept in that even/odd order and
//             put back in token order only when they are stored (and taken
//             out of it when a k block resumes them): moves, no arithmetic.
//             fp16: F16C vcvtph2ps, 8 tokens per instruction (exact for
//             every fp16 value, subnormals included; it never rounds).
//   AVX-512   bf16: vpmovzxwd (16 x 16 -> 32 bits) and a shift by 16;
//             fp16: vcvtph2ps zmm. Token order throughout.
// The memory layout is the same for all three types (2 bytes an element for
// 16-bit panels), so PackTokenPanels and PanelColumn serve them all.
//
// Speed (fp32 panels; 2-core AMD EPYC, Zen 3, one thread, a 1024-token tile, D = 1024):
// 89-95 GFLOP/s from 6 to 128 rows, against OpenBLAS sgemm's 26-80 on the
// same tile (so 1.1x at 128 rows, 1.6x at 16, 3.6x at 6, 4.6x at 1: sgemm
// packs W on every call). The AVX2 micro-kernel holds 6 rows x 16 tokens in
// 12 accumulators, plus 2 registers of W and 1 broadcast: 15 of the 16 ymm
// registers; per k step it issues 12 fma for 8 loads, so it is fma-bound. The
// AVX-512 one holds 12 rows x 2 panels in 24 zmm accumulators (24 fma for 14
// loads). Blocking k by 512 keeps a row block's slice of h and a panel's
// slice of W in L1/L2: at D = 4096 and 128 rows it took the AVX2 kernel from
// 65 to 84 GFLOP/s.
// bf16 panels on the same machine (flashsampler-kernel-bench
// --weight_dtype=bf16, 2026-11-26, a noisy shared host) gain where few rows
// share each load of W (so, we infer, reading W bounds them). V = 128,
// D = 4096 (1 MiB of bf16 panels, 2 MiB of fp32: both larger than a core's
// 512 KiB L2), one row, one thread: 23-26 us against 42-46 us for fp32
// panels; V = 32000, D = 1024, one row, a 1024-token tile: 0.12 ms against
// 0.20. From 64 rows on the kernel is fma-bound and the two are within the
// noise of each other.
//
// Highway or intrinsics: a Highway version (libhwy-dev 1.0.3, foreach_target
// + HWY_DYNAMIC_DISPATCH, written and run on the dev machine, not kept; its
// AVX2 target gave the contract's bits) needs one micro-kernel template
// instead of our two, but still per-target row blocks under
// #if HWY_TARGET, the foreach_target re-inclusion, and a new dependency.
// And it breaks the contract on its own: on targets without FMA (SSE4,
// forced with SetSupportedTargetsForTest) hn::MulAdd is a multiply and an
// add, two roundings, and 54% of the logits differed from the fma chain; so
// those targets must be disabled and our std::fma scalar variant kept anyway.
// The intrinsics version says exactly which instruction runs: it stays.
#include "kernels/cpu/fixed_order_logits.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "kernels/common/half_precision.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace flashsampler::kernels {
namespace {

constexpr int64_t kPanel = kTokenPanelWidth;

// Where W[token][0] is in the panel layout; W[token][k] is kPanel * k further.
inline int64_t PanelColumn(int64_t token, int64_t hidden) {
  return (token / kPanel) * hidden * kPanel + token % kPanel;
}

// The panel element types: storage and the exact widening to fp32 (the
// scalar kernel's; the SIMD loaders below must agree with it bit for bit).
struct Fp32Panels {
  using Element = float;
  static float Widen(float w) { return w; }
};
struct Bf16Panels {
  using Element = uint16_t;
  static float Widen(uint16_t w) { return Bf16ToFloat(w); }
};
struct Fp16Panels {
  using Element = uint16_t;
  static float Widen(uint16_t w) { return Fp16ToFloat(w); }
};

// ---------------------------------------------------------------- scalar ----

template <typename Format>
void ScalarLogits(const float* h, int64_t rows, const typename Format::Element* panels,
                  int64_t token0, int64_t n, int64_t hidden, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = h + r * hidden;
    for (int64_t j = 0; j < n; ++j) {
      const typename Format::Element* w = panels + PanelColumn(token0 + j, hidden);
      float acc = 0.0f;
      for (int64_t k = 0; k < hidden; ++k) {
        acc = std::fma(row[k], Format::Widen(w[k * kPanel]), acc);
      }
      out[r * n + j] = acc;
    }
  }
}

// ------------------------------------------------- blocked SIMD driver ----
//
// One pass of an ISA's micro-kernels: rows of h (at stride ldh) against
// `panels` consecutive panel slices (at stride panel_stride elements) of kc k
// steps, into chains at c[r * ldc + t] (t < 16 * panels), started from +0
// (resume false) or continued.
template <typename E>
using PanelSliceFn = void (*)(const float* h, int64_t rows, int64_t ldh, const E* panel,
                              int64_t panel_stride, int panels, int64_t kc, float* c, int64_t ldc,
                              bool resume);

template <typename E>
struct SimdKernel {
  PanelSliceFn<E> slice;
  int row_block;   // rows per micro-tile
  int max_panels;  // consecutive panels one call may take
};

constexpr int kMaxRowBlock = 12;

// A micro-tile: MR rows (MR and the panel count are its template arguments)
// against consecutive panel slices at stride panel_stride.
template <typename E>
using MicroTileFn = void (*)(const float* h, int64_t ldh, const E* panel, int64_t panel_stride,
                             int64_t kc, float* c, int64_t ldc, bool resume);

// One row block against `panels` panels: Group (NP panels at a time), then
// Single (one panel) for what is left.
template <typename E, MicroTileFn<E> Group, int NP, MicroTileFn<E> Single>
void PanelGroups(const float* h, int64_t ldh, const E* panel, int64_t panel_stride, int panels,
                 int64_t kc, float* c, int64_t ldc, bool resume) {
  int q = 0;
  for (; q + NP <= panels; q += NP) {
    Group(h, ldh, panel + q * panel_stride, panel_stride, kc, c + q * kPanel, ldc, resume);
  }
  for (; q < panels; ++q) {
    Single(h, ldh, panel + q * panel_stride, panel_stride, kc, c + q * kPanel, ldc, resume);
  }
}

constexpr int64_t kKBlock = 512;  // k per pass over the tile

// Panels wholly inside [token0, token0 + n) write their chains straight into
// `out` (row stride n), k block by k block, so one block of h and one slice
// of a panel are reused from cache. A panel the range cuts (at most the first
// and the last) runs row block by row block into a scratch tile, and only its
// tokens in range are copied out.
template <typename E>
[[maybe_unused]] void BlockedLogits(const SimdKernel<E>& kernel, const float* h, int64_t rows,
                                   const E* panels, int64_t token0, int64_t n, int64_t hidden,
                                   float* out) {
  const int64_t end = token0 + n;
  const int64_t first_panel = token0 / kPanel;
  const int64_t end_panel = (end + kPanel - 1) / kPanel;
  const int64_t panel_stride = hidden * kPanel;
  auto whole = [&](int64_t p) { return p * kPanel >= token0 && (p + 1) * kPanel <= end; };
  for (int64_t k0 = 0; k0 < hidden; k0 += kKBlock) {
    const int64_t kc = std::min(kKBlock, hidden - k0);
    for (int64_t p = first_panel; p < end_panel;) {
      if (!whole(p)) {
        ++p;
        continue;
      }
      int np = 1;
      while (np < kernel.max_panels && p + np < end_panel && whole(p + np)) ++np;
      kernel.slice(h + k0, rows, hidden, panels + p * panel_stride + k0 * kPanel, panel_stride, np,
                   kc, out + (p * kPanel - token0), n, k0 > 0);
      p += np;
    }
  }
  int64_t cut[2];
  int cuts = 0;
  if (!whole(first_panel)) cut[cuts++] = first_panel;
  if (end_panel - 1 != first_panel && !whole(end_panel - 1)) cut[cuts++] = end_panel - 1;
  for (int i = 0; i < cuts; ++i) {
    const int64_t p = cut[i];
    const int64_t lo = std::max(token0, p * kPanel), hi = std::min(end, (p + 1) * kPanel);
    for (int64_t r0 = 0; r0 < rows; r0 += kernel.row_block) {
      const int64_t mr = std::min<int64_t>(kernel.row_block, rows - r0);
      alignas(64) float tile[kMaxRowBlock * kPanel];
      for (int64_t k0 = 0; k0 < hidden; k0 += kKBlock) {
        kernel.slice(h + r0 * hidden + k0, mr, hidden, panels + p * panel_stride + k0 * kPanel,
                     panel_stride, 1, std::min(kKBlock, hidden - k0), tile, kPanel, k0 > 0);
      }
      for (int64_t r = 0; r < mr; ++r) {
        for (int64_t t = lo; t < hi; ++t) {
          out[(r0 + r) * n + (t - token0)] = tile[r * kPanel + t % kPanel];
        }
      }
    }
  }
}

#if defined(__x86_64__)
// ------------------------------------------------------------------ AVX2 ----

#define FS_AVX2 __attribute__((target("avx2,fma,f16c")))

// A panel format on AVX2: a k step's 16 tokens as two fp32 registers (a, b),
// and where each token's chain lives: Load widens a k step into (a, b);
// LoadChains / StoreChains move 16 chains between c[0, 16) (token order) and
// (a, b). fp32 and fp16 keep token order (a: tokens 0-7, b: 8-15).
template <typename Format>
struct Avx2Panel;

template <>
struct Avx2Panel<Fp32Panels> {
  FS_AVX2 static void Load(const float* w, __m256& a, __m256& b) {
    a = _mm256_loadu_ps(w);
    b = _mm256_loadu_ps(w + 8);
  }
  FS_AVX2 static void LoadChains(const float* c, __m256& a, __m256& b) { Load(c, a, b); }
  FS_AVX2 static void StoreChains(float* c, __m256 a, __m256 b) {
    _mm256_storeu_ps(c, a);
    _mm256_storeu_ps(c + 8, b);
  }
};

template <>
struct Avx2Panel<Fp16Panels> : Avx2Panel<Fp32Panels> {
  FS_AVX2 static void Load(const uint16_t* w, __m256& a, __m256& b) {
    a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 8)));
  }
};

// bf16: a holds the even tokens 0, 2, .., 14 and b the odd ones 1, 3, .., 15
// (lane i: tokens 2i and 2i + 1), the order the shift / AND widening gives.
template <>
struct Avx2Panel<Bf16Panels> {
  FS_AVX2 static void Load(const uint16_t* w, __m256& a, __m256& b) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    a = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    b = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  // c: tokens 0-7 in lo, 8-15 in hi. shuffle_ps picks within 128-bit halves:
  // (0 2 8 10 | 4 6 12 14); swapping the middle 64-bit pairs sorts it.
  FS_AVX2 static void LoadChains(const float* c, __m256& a, __m256& b) {
    const __m256 lo = _mm256_loadu_ps(c), hi = _mm256_loadu_ps(c + 8);
    constexpr int kSortPairs = _MM_SHUFFLE(3, 1, 2, 0);
    a = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))), kSortPairs));
    b = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))), kSortPairs));
  }
  // The inverse: unpacklo / unpackhi interleave within 128-bit halves,
  // (0 1 2 3 | 8 9 10 11) and (4 5 6 7 | 12 13 14 15); then join the halves.
  FS_AVX2 static void StoreChains(float* c, __m256 a, __m256 b) {
    const __m256 u = _mm256_unpacklo_ps(a, b), v = _mm256_unpackhi_ps(a, b);
    _mm256_storeu_ps(c, _mm256_permute2f128_ps(u, v, 0x20));
    _mm256_storeu_ps(c + 8, _mm256_permute2f128_ps(u, v, 0x31));
  }
};

// MR rows x NP panels of 16 tokens (two 8-lane registers per row and panel).
// Few rows take several panels at once: a chain advances one fma per k step,
// and an fma waits for the previous one (4 cycles on Zen 3), so one row
// against one panel (2 chains) would leave the fma units idle; 1 row x 4
// panels keeps 8 chains in flight.
template <typename Format, int MR, int NP>
FS_AVX2 void Avx2MicroTile(const float* h, int64_t ldh, const typename Format::Element* panel,
                           int64_t panel_stride, int64_t kc, float* c, int64_t ldc, bool resume) {
  using P = Avx2Panel<Format>;
  __m256 a[MR][NP], b[MR][NP];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      if (resume) {
        P::LoadChains(c + r * ldc + q * kPanel, a[r][q], b[r][q]);
      } else {
        a[r][q] = b[r][q] = _mm256_setzero_ps();
      }
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      __m256 w_a, w_b;
      P::Load(panel + q * panel_stride + k * kPanel, w_a, w_b);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m256 hk = _mm256_broadcast_ss(h + r * ldh + k);
        a[r][q] = _mm256_fmadd_ps(hk, w_a, a[r][q]);
        b[r][q] = _mm256_fmadd_ps(hk, w_b, b[r][q]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) P::StoreChains(c + r * ldc + q * kPanel, a[r][q], b[r][q]);
  }
}

// Row blocks of 6 x 1 panel: 12 accumulators + 2 of W + 1 broadcast = 15 of
// the 16 ymm registers (bf16 adds its mask constant: 16). A last block of 1
// or 2 rows takes 4 or 2 panels at a time (8 accumulators).
template <typename Format, int MR, int NP>
constexpr auto Avx2Panels = PanelGroups<typename Format::Element, Avx2MicroTile<Format, MR, NP>,
                                        NP, Avx2MicroTile<Format, MR, 1>>;

constexpr int kAvx2RowBlock = 6;
constexpr int kAvx2MaxPanels = 4;
static_assert(kAvx2RowBlock <= kMaxRowBlock);

template <typename Format>
FS_AVX2 void Avx2PanelSlice(const float* h, int64_t rows, int64_t ldh,
                            const typename Format::Element* panel, int64_t panel_stride,
                            int panels, int64_t kc, float* c, int64_t ldc, bool resume) {
  for (int64_t r0 = 0; r0 < rows; r0 += kAvx2RowBlock) {
    const float* hb = h + r0 * ldh;
    float* cb = c + r0 * ldc;
    const auto args = std::make_tuple(hb, ldh, panel, panel_stride, panels, kc, cb, ldc, resume);
    switch (std::min<int64_t>(kAvx2RowBlock, rows - r0)) {
      case 6: std::apply(Avx2Panels<Format, 6, 1>, args); break;
      case 5: std::apply(Avx2Panels<Format, 5, 1>, args); break;
      case 4: std::apply(Avx2Panels<Format, 4, 1>, args); break;
      case 3: std::apply(Avx2Panels<Format, 3, 1>, args); break;
      case 2: std::apply(Avx2Panels<Format, 2, 2>, args); break;
      default: std::apply(Avx2Panels<Format, 1, kAvx2MaxPanels>, args); break;
    }
  }
}

#undef FS_AVX2

// --------------------------------------------------------------- AVX-512 ----

#define FS_AVX512 __attribute__((target("avx512f")))

// A panel format on AVX-512: a k step's 16 tokens as one fp32 register, in
// token order. The 16-bit loaders use the zero-masked intrinsics with every
// lane selected (the same instructions): GCC 12's unmasked ones start from
// _mm512_undefined_*, which -Wmaybe-uninitialized reports (GCC bug 105593).
constexpr __mmask16 kAllLanes = 0xffff;

template <typename Format>
struct Avx512Panel;

template <>
struct Avx512Panel<Fp32Panels> {
  FS_AVX512 static __m512 Load(const float* w) { return _mm512_loadu_ps(w); }
};

template <>
struct Avx512Panel<Bf16Panels> {
  FS_AVX512 static __m512 Load(const uint16_t* w) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    const __m512i wide = _mm512_maskz_cvtepu16_epi32(kAllLanes, x);
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAllLanes, wide, 16));
  }
};

template <>
struct Avx512Panel<Fp16Panels> {
  FS_AVX512 static __m512 Load(const uint16_t* w) {
    return _mm512_maskz_cvtph_ps(kAllLanes,
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  }
};

// MR rows x NP panels (one 16-lane register per row and panel).
template <typename Format, int MR, int NP>
FS_AVX512 void Avx512MicroTile(const float* h, int64_t ldh, const typename Format::Element* panel,
                               int64_t panel_stride, int64_t kc, float* c, int64_t ldc,
                               bool resume) {
  __m512 acc[MR][NP];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      acc[r][q] = resume ? _mm512_loadu_ps(c + r * ldc + q * kPanel) : _mm512_setzero_ps();
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    __m512 w[NP];
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      w[q] = Avx512Panel<Format>::Load(panel + q * panel_stride + k * kPanel);
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 hk = _mm512_set1_ps(h[r * ldh + k]);
#pragma GCC unroll 4
      for (int q = 0; q < NP; ++q) acc[r][q] = _mm512_fmadd_ps(hk, w[q], acc[r][q]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) _mm512_storeu_ps(c + r * ldc + q * kPanel, acc[r][q]);
  }
}

// Row blocks of 12 x 2 panels: 24 accumulators + 2 of W + 1 broadcast = 27
// of the 32 zmm registers; 24 fma for 14 loads per k step. A last block of
// at most 3 rows takes 4 panels at a time (<= 12 accumulators), for the
// same reason as on AVX2: enough chains in flight.
template <typename Format, int MR, int NP>
constexpr auto Avx512Panels = PanelGroups<typename Format::Element,
                                          Avx512MicroTile<Format, MR, NP>, NP,
                                          Avx512MicroTile<Format, MR, 1>>;

constexpr int kAvx512RowBlock = 12;
constexpr int kAvx512MaxPanels = 4;
static_assert(kAvx512RowBlock <= kMaxRowBlock);

template <typename Format>
FS_AVX512 void Avx512PanelSlice(const float* h, int64_t rows, int64_t ldh,
                                const typename Format::Element* panel, int64_t panel_stride,
                                int panels, int64_t kc, float* c, int64_t ldc, bool resume) {
  for (int64_t r0 = 0; r0 < rows; r0 += kAvx512RowBlock) {
    const auto args = std::make_tuple(h + r0 * ldh, ldh, panel, panel_stride, panels, kc,
                                      c + r0 * ldc, ldc, resume);
    switch (std::min<int64_t>(kAvx512RowBlock, rows - r0)) {
      case 12: std::apply(Avx512Panels<Format, 12, 2>, args); break;
      case 11: std::apply(Avx512Panels<Format, 11, 2>, args); break;
      case 10: std::apply(Avx512Panels<Format, 10, 2>, args); break;
      case 9: std::apply(Avx512Panels<Format, 9, 2>, args); break;
      case 8: std::apply(Avx512Panels<Format, 8, 2>, args); break;
      case 7: std::apply(Avx512Panels<Format, 7, 2>, args); break;
      case 6: std::apply(Avx512Panels<Format, 6, 2>, args); break;
      case 5: std::apply(Avx512Panels<Format, 5, 2>, args); break;
      case 4: std::apply(Avx512Panels<Format, 4, 2>, args); break;
      case 3: std::apply(Avx512Panels<Format, 3, 4>, args); break;
      case 2: std::apply(Avx512Panels<Format, 2, 4>, args); break;
      default: std::apply(Avx512Panels<Format, 1, kAvx512MaxPanels>, args); break;
    }
  }
}

#undef FS_AVX512
#endif  // __x86_64__

// ---------------------------------------------------------------- dispatch --

template <typename Format>
void LogitsOf(const float* h, int64_t rows, const void* panels, int64_t token0, int64_t n,
              int64_t hidden, float* out, DotIsa isa) {
  using E = typename Format::Element;
  const E* w = static_cast<const E*>(panels);
#if defined(__x86_64__)
  if (isa == DotIsa::kAvx512) {
    BlockedLogits<E>({Avx512PanelSlice<Format>, kAvx512RowBlock, kAvx512MaxPanels}, h, rows, w,
                     token0, n, hidden, out);
    return;
  }
  if (isa == DotIsa::kAvx2) {
    BlockedLogits<E>({Avx2PanelSlice<Format>, kAvx2RowBlock, kAvx2MaxPanels}, h, rows, w, token0,
                     n, hidden, out);
    return;
  }
#endif
  ScalarLogits<Format>(h, rows, w, token0, n, hidden, out);
}

template <typename E>
void PackPanels(const E* rows, int64_t first_token, int64_t count, int64_t hidden, E* panels) {
  for (int64_t i = 0; i < count; ++i) {
    E* dst = panels + PanelColumn(first_token + i, hidden);
    const E* src = rows + i * hidden;
    for (int64_t k = 0; k < hidden; ++k) dst[k * kPanel] = src[k];
  }
}

}  // namespace

int64_t TokenPanelElements(int64_t vocab, int64_t hidden) {
  return (vocab + kPanel - 1) / kPanel * kPanel * hidden;
}

void PackTokenPanels(const float* rows, int64_t first_token, int64_t count, int64_t hidden,
                     float* panels) {
  PackPanels(rows, first_token, count, hidden, panels);
}

void PackTokenPanels(const uint16_t* rows, int64_t first_token, int64_t count, int64_t hidden,
                     uint16_t* panels) {
  PackPanels(rows, first_token, count, hidden, panels);
}

bool DotIsaSupported(DotIsa isa) {
  switch (isa) {
    case DotIsa::kScalar:
      return true;
#if defined(__x86_64__)
    case DotIsa::kAvx2: {
      // F16C from CPUID leaf 1 (clang's __builtin_cpu_supports does not know
      // "f16c"); the OS saves ymm state if it reports AVX2.
      unsigned eax, ebx, ecx, edx;
      const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    }
    case DotIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
#endif
    default:
      return false;
  }
}

DotIsa BestDotIsa() {
  static const DotIsa best = DotIsaSupported(DotIsa::kAvx512) ? DotIsa::kAvx512
                             : DotIsaSupported(DotIsa::kAvx2) ? DotIsa::kAvx2
                                                              : DotIsa::kScalar;
  return best;
}

const char* DotIsaName(DotIsa isa) {
  switch (isa) {
    case DotIsa::kAvx2: return "avx2";
    case DotIsa::kAvx512: return "avx512";
    default: return "scalar";
  }
}

void FixedOrderLogits(const float* h, int64_t rows, TokenPanels panels, int64_t token0, int64_t n,
                      int64_t hidden, float* out, DotIsa isa) {
  if (rows <= 0 || n <= 0 || hidden <= 0) return;
  switch (panels.type) {
    case PanelType::kFloat32:
      LogitsOf<Fp32Panels>(h, rows, panels.data, token0, n, hidden, out, isa);
      return;
    case PanelType::kBFloat16:
      LogitsOf<Bf16Panels>(h, rows, panels.data, token0, n, hidden, out, isa);
      return;
    case PanelType::kFloat16:
      LogitsOf<Fp16Panels>(h, rows, panels.data, token0, n, hidden, out, isa);
      return;
  }
}

}  // namespace flashsampler::kernels
