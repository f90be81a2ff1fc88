// SIMD restatements of Philox4x32-10 (see philox_batch.h). The constants are
// Random123's own macros, so the algorithm is defined in one place; the
// structure follows r123::Philox4x32: round 0 uses the key as given, each
// later round first bumps the key by (PHILOX_W32_0, PHILOX_W32_1), and a round
// maps (c0, c1, c2, c3) to (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1,
// lo(M0*c0)).
#include "kernels/cpu/philox_batch.h"

#include <Random123/philox.h>

#include "kernels/common/gumbel_noise.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FS_PHILOX_X86 1
#endif

namespace flashsampler::kernels {
namespace {

constexpr int kRounds = 10;

void ScalarWords(uint64_t seed, uint64_t offset, uint32_t stream, uint32_t first_block,
                 uint32_t* words) {
  for (int i = 0; i < kPhiloxBatchBlocks; ++i) {
    const auto block = PhiloxNoiseBlock(seed, offset, stream, first_block + i);
    for (int w = 0; w < 4; ++w) words[4 * i + w] = block.v[w];
  }
}

#if defined(FS_PHILOX_X86)

// Both SIMD versions keep every 32-bit counter word in the low half of a
// 64-bit lane. Then _mm_mul_epu32 yields the full 64-bit product M * c in
// place: its low half is lo(M * c) already where the next round wants it, and
// a 64-bit shift right by 32 gives hi(M * c). The upper halves carry garbage
// that mul_epu32 ignores and the final packing drops, so a round is two
// multiplies, two shifts and four XORs per register, with no shuffles.

// ---- SSE2: 2 blocks per register, 2 registers per word (4 blocks a group).

void Sse2Words(uint64_t seed, uint64_t offset, uint32_t stream, uint32_t first_block,
               uint32_t* words) {
  constexpr int kRegs = 2;
  constexpr int kGroupBlocks = 2 * kRegs;
  const __m128i m0 = _mm_set1_epi64x(PHILOX_M4x32_0);
  const __m128i m1 = _mm_set1_epi64x(PHILOX_M4x32_1);
  const __m128i low_mask = _mm_set1_epi64x(0xffffffffll);
  for (int group = 0; group < kPhiloxBatchBlocks / kGroupBlocks; ++group) {
    __m128i c0[kRegs], c1[kRegs], c2[kRegs], c3[kRegs];
    for (int r = 0; r < kRegs; ++r) {
      const uint32_t b = first_block + group * kGroupBlocks + 2 * r;
      c0[r] = _mm_set_epi64x(static_cast<uint32_t>(b + 1), b);
      c1[r] = _mm_set1_epi64x(stream);
      c2[r] = _mm_set1_epi64x(static_cast<uint32_t>(offset));
      c3[r] = _mm_set1_epi64x(static_cast<uint32_t>(offset >> 32));
    }
    uint32_t k0 = static_cast<uint32_t>(seed);
    uint32_t k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < kRounds; ++round) {
      if (round > 0) {
        k0 += PHILOX_W32_0;
        k1 += PHILOX_W32_1;
      }
      const __m128i vk0 = _mm_set1_epi64x(k0);
      const __m128i vk1 = _mm_set1_epi64x(k1);
      for (int r = 0; r < kRegs; ++r) {
        const __m128i p0 = _mm_mul_epu32(c0[r], m0);
        const __m128i p1 = _mm_mul_epu32(c2[r], m1);
        c0[r] = _mm_xor_si128(_mm_xor_si128(_mm_srli_epi64(p1, 32), c1[r]), vk0);
        c1[r] = p1;
        c2[r] = _mm_xor_si128(_mm_xor_si128(_mm_srli_epi64(p0, 32), c3[r]), vk1);
        c3[r] = p0;
      }
    }
    for (int r = 0; r < kRegs; ++r) {
      // [w0 w1] and [w2 w3] of each block as 64-bit lanes, then one block per
      // 128-bit store.
      const __m128i w01 = _mm_or_si128(_mm_and_si128(c0[r], low_mask), _mm_slli_epi64(c1[r], 32));
      const __m128i w23 = _mm_or_si128(_mm_and_si128(c2[r], low_mask), _mm_slli_epi64(c3[r], 32));
      __m128i* out = reinterpret_cast<__m128i*>(words + 4 * (group * kGroupBlocks + 2 * r));
      _mm_storeu_si128(out + 0, _mm_unpacklo_epi64(w01, w23));
      _mm_storeu_si128(out + 1, _mm_unpackhi_epi64(w01, w23));
    }
  }
}

// ---- AVX2: 4 blocks per register, 2 registers per word (8 blocks a group).

__attribute__((target("avx2"))) void Avx2Words(uint64_t seed, uint64_t offset, uint32_t stream,
                                               uint32_t first_block, uint32_t* words) {
  constexpr int kRegs = 2;
  constexpr int kGroupBlocks = 4 * kRegs;
  const __m256i m0 = _mm256_set1_epi64x(PHILOX_M4x32_0);
  const __m256i m1 = _mm256_set1_epi64x(PHILOX_M4x32_1);
  const __m256i iota = _mm256_setr_epi64x(0, 1, 2, 3);
  for (int group = 0; group < kPhiloxBatchBlocks / kGroupBlocks; ++group) {
    __m256i c0[kRegs], c1[kRegs], c2[kRegs], c3[kRegs];
    for (int r = 0; r < kRegs; ++r) {
      const uint32_t b = first_block + group * kGroupBlocks + 4 * r;
      // b + i wraps modulo 2^32 like the scalar counter; the upper half is ignored.
      c0[r] = _mm256_add_epi32(_mm256_set1_epi64x(b), iota);
      c1[r] = _mm256_set1_epi64x(stream);
      c2[r] = _mm256_set1_epi64x(static_cast<uint32_t>(offset));
      c3[r] = _mm256_set1_epi64x(static_cast<uint32_t>(offset >> 32));
    }
    uint32_t k0 = static_cast<uint32_t>(seed);
    uint32_t k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < kRounds; ++round) {
      if (round > 0) {
        k0 += PHILOX_W32_0;
        k1 += PHILOX_W32_1;
      }
      const __m256i vk0 = _mm256_set1_epi64x(k0);
      const __m256i vk1 = _mm256_set1_epi64x(k1);
      for (int r = 0; r < kRegs; ++r) {
        const __m256i p0 = _mm256_mul_epu32(c0[r], m0);
        const __m256i p1 = _mm256_mul_epu32(c2[r], m1);
        c0[r] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1[r]), vk0);
        c1[r] = p1;
        c2[r] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3[r]), vk1);
        c3[r] = p0;
      }
    }
    for (int r = 0; r < kRegs; ++r) {
      const __m256i w01 = _mm256_blend_epi32(c0[r], _mm256_slli_epi64(c1[r], 32), 0xaa);
      const __m256i w23 = _mm256_blend_epi32(c2[r], _mm256_slli_epi64(c3[r], 32), 0xaa);
      const __m256i b02 = _mm256_unpacklo_epi64(w01, w23);  // block 0 | block 2
      const __m256i b13 = _mm256_unpackhi_epi64(w01, w23);  // block 1 | block 3
      __m256i* out = reinterpret_cast<__m256i*>(words + 4 * (group * kGroupBlocks + 4 * r));
      _mm256_storeu_si256(out + 0, _mm256_permute2x128_si256(b02, b13, 0x20));  // blocks 0, 1
      _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(b02, b13, 0x31));  // blocks 2, 3
    }
  }
}

// ---- AVX-512: 8 blocks per register, 2 registers per word (all 16 blocks).
// GCC 12's AVX-512 intrinsics trip a false -Wuninitialized on their internal
// _mm512_undefined_epi32() (GCC bug 105593, fixed in GCC 13); silence it here only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

__attribute__((target("avx512f"))) void Avx512Words(uint64_t seed, uint64_t offset,
                                                    uint32_t stream, uint32_t first_block,
                                                    uint32_t* words) {
  constexpr int kRegs = 2;
  const __m512i m0 = _mm512_set1_epi64(PHILOX_M4x32_0);
  const __m512i m1 = _mm512_set1_epi64(PHILOX_M4x32_1);
  const __m512i iota = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  __m512i c0[kRegs], c1[kRegs], c2[kRegs], c3[kRegs];
  for (int r = 0; r < kRegs; ++r) {
    c0[r] = _mm512_add_epi32(_mm512_set1_epi64(first_block + 8u * r), iota);
    c1[r] = _mm512_set1_epi64(stream);
    c2[r] = _mm512_set1_epi64(static_cast<uint32_t>(offset));
    c3[r] = _mm512_set1_epi64(static_cast<uint32_t>(offset >> 32));
  }
  uint32_t k0 = static_cast<uint32_t>(seed);
  uint32_t k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) {
      k0 += PHILOX_W32_0;
      k1 += PHILOX_W32_1;
    }
    const __m512i vk0 = _mm512_set1_epi64(k0);
    const __m512i vk1 = _mm512_set1_epi64(k1);
    for (int r = 0; r < kRegs; ++r) {
      const __m512i p0 = _mm512_mul_epu32(c0[r], m0);
      const __m512i p1 = _mm512_mul_epu32(c2[r], m1);
      c0[r] = _mm512_xor_si512(_mm512_xor_si512(_mm512_srli_epi64(p1, 32), c1[r]), vk0);
      c1[r] = p1;
      c2[r] = _mm512_xor_si512(_mm512_xor_si512(_mm512_srli_epi64(p0, 32), c3[r]), vk1);
      c3[r] = p0;
    }
  }
  const __m512i first_half = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i second_half = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int r = 0; r < kRegs; ++r) {
    const __m512i w01 = _mm512_mask_blend_epi32(0xaaaa, c0[r], _mm512_slli_epi64(c1[r], 32));
    const __m512i w23 = _mm512_mask_blend_epi32(0xaaaa, c2[r], _mm512_slli_epi64(c3[r], 32));
    const __m512i even = _mm512_unpacklo_epi64(w01, w23);  // blocks 0 | 2 | 4 | 6
    const __m512i odd = _mm512_unpackhi_epi64(w01, w23);   // blocks 1 | 3 | 5 | 7
    uint32_t* out = words + 32 * r;
    _mm512_storeu_si512(out, _mm512_permutex2var_epi64(even, first_half, odd));
    _mm512_storeu_si512(out + 16, _mm512_permutex2var_epi64(even, second_half, odd));
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // FS_PHILOX_X86

PhiloxBatchImpl DetectBest() {
#if defined(FS_PHILOX_X86)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return PhiloxBatchImpl::kAvx512;
  if (__builtin_cpu_supports("avx2")) return PhiloxBatchImpl::kAvx2;
  return PhiloxBatchImpl::kSse2;
#else
  return PhiloxBatchImpl::kScalar;
#endif
}

}  // namespace

PhiloxBatchImpl BestPhiloxBatchImpl() {
  static const PhiloxBatchImpl best = DetectBest();
  return best;
}

bool PhiloxBatchImplAvailable(PhiloxBatchImpl impl) {
  switch (impl) {
    case PhiloxBatchImpl::kScalar: return true;
    case PhiloxBatchImpl::kSse2:
    case PhiloxBatchImpl::kAvx2:
    case PhiloxBatchImpl::kAvx512:
      return static_cast<int>(impl) <= static_cast<int>(BestPhiloxBatchImpl());
  }
  return false;
}

void PhiloxNoiseWordsWith(PhiloxBatchImpl impl, uint64_t seed, uint64_t offset, uint32_t stream,
                          uint32_t first_block, uint32_t words[kPhiloxBatchWords]) {
  switch (impl) {
#if defined(FS_PHILOX_X86)
    case PhiloxBatchImpl::kAvx512: return Avx512Words(seed, offset, stream, first_block, words);
    case PhiloxBatchImpl::kAvx2: return Avx2Words(seed, offset, stream, first_block, words);
    case PhiloxBatchImpl::kSse2: return Sse2Words(seed, offset, stream, first_block, words);
#endif
    default: return ScalarWords(seed, offset, stream, first_block, words);
  }
}

void PhiloxNoiseWords(uint64_t seed, uint64_t offset, uint32_t stream, uint32_t first_block,
                      uint32_t words[kPhiloxBatchWords]) {
  PhiloxNoiseWordsWith(BestPhiloxBatchImpl(), seed, offset, stream, first_block, words);
}

}  // namespace flashsampler::kernels
