// PhiloxNoiseWords: the noise words of 64 consecutive vocabulary indices at
// once, for the CPU sampler's hot loop.
//
// words[t] == NoiseBits(seed, offset, stream, 4 * first_block + t) for t in
// [0, 64), i.e. the 16 Philox4x32-10 blocks first_block .. first_block + 15 of
// the RNG contract (kernels/common/gumbel_noise.h), in token order. This is the
// same function as PhiloxNoiseBlock, restated with SIMD integer intrinsics so
// that several blocks run side by side (the scalar Philox is bound by its
// 32x32->64 multiplies: 20 per block). Implementations: SSE2 (every x86-64),
// AVX2 and AVX-512F (chosen at run time when the CPU has them), and the scalar
// contract elsewhere. philox_batch_test checks every available implementation bitwise
// against PhiloxNoiseBlock, including the published known-answer vectors.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

namespace flashsampler::kernels {

inline constexpr int kPhiloxBatchBlocks = 16;
inline constexpr int kPhiloxBatchWords = 4 * kPhiloxBatchBlocks;

// Ordered: each x86 level implies the ones before it.
enum class PhiloxBatchImpl { kScalar, kSse2, kAvx2, kAvx512 };

// The implementation PhiloxNoiseWords uses on this CPU.
PhiloxBatchImpl BestPhiloxBatchImpl();

// Whether `impl` can run on this CPU / build.
bool PhiloxBatchImplAvailable(PhiloxBatchImpl impl);

void PhiloxNoiseWords(uint64_t seed, uint64_t offset, uint32_t stream, uint32_t first_block,
                      uint32_t words[kPhiloxBatchWords]);

// One named implementation (for tests and benchmarks); `impl` must be available.
void PhiloxNoiseWordsWith(PhiloxBatchImpl impl, uint64_t seed, uint64_t offset, uint32_t stream,
                          uint32_t first_block, uint32_t words[kPhiloxBatchWords]);

}  // namespace flashsampler::kernels
