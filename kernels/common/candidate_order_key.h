// The canonical order of candidates (l' descending, token id ascending:
// kernels/cpu/candidate_sampler.h's CandidateBefore) as integers, and the
// completeness rule of a top-k merged from per-tile candidate lists. Shared by
// the fused controlled CUDA path (kernels/cuda/fused_controls.cuh,
// fused_controlled_sample.cu) and its host tests, so the rule the kernel
// applies is the one tested exhaustively on the CPU.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/host_device.h"

namespace flashsampler {

// Order-preserving bits of a finite float: a > b as floats iff the bits
// compare so as unsigned. -0 maps to +0's bits, since -0 == +0 as floats;
// every finite value maps above 0 (-FLT_MAX to 0x00800000).
FS_HOST_DEVICE FS_FORCE_INLINE uint32_t OrderedFloatBits(float x) {
  const float y = x == 0.0f ? 0.0f : x;
#if defined(__CUDA_ARCH__)
  const uint32_t u = __float_as_uint(y);
#else
  uint32_t u;
  std::memcpy(&u, &y, sizeof u);
#endif
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

// The float whose OrderedFloatBits are `bits` (+0 for the bits of -0).
FS_HOST_DEVICE FS_FORCE_INLINE float FloatOfOrderedBits(uint32_t bits) {
  const uint32_t u = (bits & 0x80000000u) != 0u ? (bits & 0x7fffffffu) : ~bits;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// 64-bit key of a candidate with finite logit and id >= 0: larger = earlier
// in the canonical order; distinct candidates have distinct keys, and every
// key is > 0, so 0 can stand for "no candidate".
FS_HOST_DEVICE FS_FORCE_INLINE uint64_t CandidateOrderKey(float logit, int32_t id) {
  return (static_cast<uint64_t>(OrderedFloatBits(logit)) << 32) |
         (0xffffffffu - static_cast<uint32_t>(id));
}

// Completeness of a top-k merged from tiles. Each tile wrote its best
// m = min(k, capacity) candidates; the top-k found is the best k of the
// candidates of the k tiles with the best heads (kth_key: the k-th found, or 0
// when fewer than k were found). The found set is the row's true top-k unless
// some selected tile is full (it wrote m slots and m < k) and its last written
// candidate ranks strictly before the k-th found: only then can an unwritten
// token of that tile belong to the true top-k. (If that token x belonged to
// it while missing from the found set, some found y would not, and
// key(last) > key(x) > key(y) >= kth_key.) A last candidate equal to the k-th
// found leaves nothing unwritten above it.
FS_HOST_DEVICE FS_FORCE_INLINE bool TileMayHoldMoreOfTopK(bool tile_full, int m, int k,
                                                        uint64_t last_key, uint64_t kth_key) {
  return tile_full && m < k && last_key > kth_key;
}

}  // namespace flashsampler
