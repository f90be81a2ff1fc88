// The RNG contract: Gumbel noise as a pure function of
// (seed, offset, stream, vocab_index), identical on host and device.
//
//   Philox4x32-10, key = {seed_lo, seed_hi},
//   counter = {vocab_index >> 2, stream, offset_lo, offset_hi},
//   r = word (vocab_index & 3) of the output block,
//   u = ((r >> 8) + 0.5) * 2^-24,  g = -log(-log(u))   (all fp32).
//
// Why this gives exact, reproducible sampling: argmax_i (l_i / T + g_i) over
// i.i.d. Gumbel(0, 1) noise is distributed as softmax(l / T). Because the noise
// of a token depends only on the row's (seed, offset, stream) and the token's
// global id, a row's sample does not depend on batch composition, tile size,
// thread count, shard count or backend (up to fp32 rounding of the logits).
//
// Numerics: k = r >> 8 has 24 bits and the +0.5 centres each of the 2^24
// cells, so u lies in [2^-25, 1 - 2^-25]: never 0 (log 0 = -inf) and never 1
// (-log 1 = 0 would make g = +inf). fp32 cannot hold every such u: in [0.5, 1)
// its spacing is 2^-24, so k + 0.5 would round and the top cell would become
// exactly 1. We therefore never form u in the upper half. There we compute
// E = -log(u) as -log1p(-(1 - u)), where 1 - u = (2^24 - 1 - k + 0.5) * 2^-24
// needs only 24 bits and is exact; in the lower half u itself is exact. So E is
// -log of the exact cell centre to within logf's ulp, including the tiny E of
// the top cells that produce the largest (winning) noise values, and g = -log E
// lies in [-2.8524, 17.3287]. kGumbelMax bounds it from above.
//
// Speculative verification (VerifyAcceptUniform below) draws its acceptance
// uniforms from the same Philox key on a counter that no noise word can use:
// counter word 0 = 0xFFFFFFFF, while noise uses vocab_index >> 2 <= 2^29 - 1
// (vocab_index <= INT32_MAX). The two streams are therefore disjoint, so a
// row's acceptance test is independent of its own (and every other) noise.
//
// Thread safety: pure functions, callable concurrently from anywhere.
#pragma once

// Device code: Random123's mulhilo32 from CUDA's __umulhi (its
// R123_USE_MULHILO32_MULHI_INTRIN template, which R123_USE_64BIT's 64-bit
// product takes precedence over). The same 32 x 32 -> 64 products, so the
// same words; ptxas made the 64-bit form 82 instructions a Philox4x32-10
// block (18 of them dead adds of a zero upper word) and makes this 58
// (SASS of the sm_90a fold, NOTES-fused.md v34). Only Philox4x32 is used on
// the device, so no 64-bit Random123 type is lost. Random123 must come in
// through this header first in device code (it does: kernels/ includes it
// nowhere else in .cu files); otherwise the choice is Random123's default,
// which gives the same words, only slower.
#if defined(__CUDA_ARCH__) && !defined(R123_USE_64BIT) && !defined(R123_USE_MULHILO32_MULHI_INTRIN)
#define R123_USE_64BIT 0
#define R123_USE_MULHILO32_MULHI_INTRIN 1
#define R123_MULHILO32_MULHI_INTRIN __umulhi
#endif
#include <Random123/philox.h>

#include <cmath>
#include <cstdint>

#include "kernels/common/host_device.h"

namespace flashsampler {

// Upper bound of GumbelFromBits over all 2^32 inputs: the largest value is
// -log(-log1p(-2^-25)) = 17.32868 (r >= 2^32 - 256); the margin covers a 1-ulp
// difference between host and device logf. A token whose transformed logit plus
// kGumbelMax is below the best score so far cannot win, whatever its noise.
inline constexpr float kGumbelMax = 17.3300f;

// The four 32-bit words of Philox block `block` = vocab_index >> 2.
FS_HOST_DEVICE FS_FORCE_INLINE r123::Philox4x32::ctr_type PhiloxNoiseBlock(
    uint64_t seed, uint64_t offset, uint32_t stream, uint32_t block) {
  r123::Philox4x32 philox;
  r123::Philox4x32::ctr_type ctr = {{block, stream, static_cast<uint32_t>(offset),
                                     static_cast<uint32_t>(offset >> 32)}};
  r123::Philox4x32::key_type key = {
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
  return philox(ctr, key);
}

// The raw 32-bit noise word of one vocabulary index.
FS_HOST_DEVICE FS_FORCE_INLINE uint32_t NoiseBits(uint64_t seed, uint64_t offset,
                                                  uint32_t stream, uint32_t vocab_index) {
  return PhiloxNoiseBlock(seed, offset, stream, vocab_index >> 2).v[vocab_index & 3];
}

// E = -log(u) > 0 for u = ((r >> 8) + 0.5) * 2^-24, without rounding u (see the
// header comment): logf of the exact u in the lower half, log1pf of the exact
// 1 - u in the upper half.
FS_HOST_DEVICE FS_FORCE_INLINE float ExponentialFromBits(uint32_t r) {
  const uint32_t k = r >> 8;
  if (k < (1u << 23)) {
    return -logf((static_cast<float>(k) + 0.5f) * 0x1p-24f);
  }
  const float one_minus_u = (static_cast<float>((1u << 24) - 1u - k) + 0.5f) * 0x1p-24f;
  return -log1pf(-one_minus_u);
}

// Gumbel(0, 1) from one noise word: g = -log(-log u), fp32, IEEE logf/log1pf
// (never fast approximations), so host and device agree to logf's last ulp.
FS_HOST_DEVICE FS_FORCE_INLINE float GumbelFromBits(uint32_t r) {
  return -logf(ExponentialFromBits(r));
}

// An upper bound of GumbelFromBits(r) with no logarithm: the GPU epilogue's
// pruning test (a token whose fl(l' + bound) is below a score already seen
// cannot win, so its two logs are skipped; fused_sample_sm90.cu).
//
// Let n = the number of leading one bits of r, capped at 24. For n < 24 the
// bit after them is zero, so k = r >> 8 <= 2^24 - 2^(23 - n) - 1 and
// u <= 1 - 2^-(n+1) - 2^-25; then E = -log u > -log(1 - 2^-(n+1)) > 2^-(n+1)
// (since -log(1 - x) > x), and g = -log E < (n + 1) ln 2. For n = 24 (the
// top cell) g = -log(-log1p(-2^-25)) < 25 ln 2. In fp32, GumbelFromBits is
// within a few 1e-6 of the real g (each log within ~1 ulp, on exact
// arguments; host libm or CUDA's logf/log1pf alike), and the bound adds
// 2^-10, so the computed noise never exceeds it. Within a cell the bound is
// at most ln 2 + 2^-10 above the largest g (n >= 1), which is all pruning
// needs: a typical token sits many units below the row's best score.
// gumbel_noise_test checks it over all 2^24 cells with the host's libm.
// GumbelLeadingOnesBound from f = the index of the highest set bit of ~r
// (31 - clz(~r); -1 for r = 2^32 - 1), in fewer instructions: the device's
// form (the fused samplers evaluate it for every token). The same bits:
// n + 1 = min(clz(~r), 24) + 1 = 32 - m with m = max(f, 7), and
// fma(32 - m, ln 2, 2^-10) = fma(m, -ln 2, 32 ln 2 + 2^-10) round the same
// real number once, since the constant is exact in fp32 (32 ln 2 and 2^-10
// are multiples of 2^-19 below 2^5). gumbel_noise_test checks every class.
FS_HOST_DEVICE FS_FORCE_INLINE float GumbelBoundFromTopZero(int f) {
  constexpr float kBoundAt32 = 32.0f * 0.693147182f + 0x1p-10f;  // exact
  return fmaf(static_cast<float>(f > 7 ? f : 7), -0.693147182f, kBoundAt32);
}

FS_HOST_DEVICE FS_FORCE_INLINE float GumbelLeadingOnesBound(uint32_t r) {
#if defined(__CUDA_ARCH__)
  return GumbelBoundFromTopZero(31 - __clz(~r));
#else
  const int ones = r == 0xffffffffu ? 32 : __builtin_clz(~r);
  const int n = ones < 24 ? ones : 24;
  // 0.693147182f is ln 2 rounded up; the fma's rounding is far below 2^-10.
  return fmaf(static_cast<float>(n + 1), 0.693147182f, 0x1p-10f);
#endif
}

FS_HOST_DEVICE FS_FORCE_INLINE float GumbelNoise(uint64_t seed, uint64_t offset,
                                                 uint32_t stream, uint32_t vocab_index) {
  return GumbelFromBits(NoiseBits(seed, offset, stream, vocab_index));
}

// Counter word 0 of the acceptance stream: never vocab_index >> 2.
inline constexpr uint32_t kVerifyAcceptBlock = 0xFFFFFFFFu;

// The acceptance uniform of speculative verification for the position whose
// RowParams are (seed, offset, stream) (the position's own offset, i.e. the
// sequence's offset + j): word 0 of Philox4x32-10(key = seed,
// counter = {0xFFFFFFFF, stream, offset_lo, offset_hi}), and
// u = ((r >> 8) + 0.5) * 2^-24, in double so the 25-bit cell centre is exact
// (fp32 would round the top cell to 1). u lies in [2^-25, 1 - 2^-25].
//
// The draft token x is accepted iff u < p(x) (p = exp(draft_logprob) in
// double). Strict < is the right test: for u uniform on (0, 1), P(u < p) = p;
// over the 2^24 cell centres P(u < p) is within 2^-25 of p, and because u is
// never 0 or 1, p = 0 (x outside the support, e.g. filtered out) never accepts
// and p = 1 always accepts, exactly.
FS_HOST_DEVICE FS_FORCE_INLINE double VerifyAcceptUniform(uint64_t seed, uint64_t offset,
                                                          uint32_t stream) {
  const uint32_t r = PhiloxNoiseBlock(seed, offset, stream, kVerifyAcceptBlock).v[0];
  return (static_cast<double>(r >> 8) + 0.5) * 0x1p-24;
}

}  // namespace flashsampler
