// Tests of kernels/cpu/philox_batch.h: every SIMD restatement of Philox4x32-10
// must equal the contract's PhiloxNoiseBlock bit for bit.
#include "kernels/cpu/philox_batch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "kernels/common/gumbel_noise.h"

namespace flashsampler::kernels {
namespace {

constexpr PhiloxBatchImpl kImpls[] = {PhiloxBatchImpl::kScalar, PhiloxBatchImpl::kSse2,
                                      PhiloxBatchImpl::kAvx2, PhiloxBatchImpl::kAvx512};

void ExpectMatchesContract(PhiloxBatchImpl impl, uint64_t seed, uint64_t offset,
                           uint32_t stream, uint32_t first_block) {
  uint32_t words[kPhiloxBatchWords];
  PhiloxNoiseWordsWith(impl, seed, offset, stream, first_block, words);
  for (int i = 0; i < kPhiloxBatchBlocks; ++i) {
    const auto block = PhiloxNoiseBlock(seed, offset, stream, first_block + i);
    for (int w = 0; w < 4; ++w) {
      ASSERT_EQ(words[4 * i + w], block.v[w])
          << "impl " << static_cast<int>(impl) << " block " << first_block + i << " word " << w;
    }
  }
}

TEST(PhiloxBatchTest, ScalarAndSse2AreAvailableOnX86) {
  EXPECT_TRUE(PhiloxBatchImplAvailable(PhiloxBatchImpl::kScalar));
#if defined(__x86_64__)
  EXPECT_TRUE(PhiloxBatchImplAvailable(PhiloxBatchImpl::kSse2));
#endif
  EXPECT_TRUE(PhiloxBatchImplAvailable(BestPhiloxBatchImpl()));
}

// Random123's known-answer vector 3 (counter 243f6a88 85a308d3 13198a2e
// 03707344, key a4093822 299f31d0 -> d16cfe09 94fdcceb 5001e420 24126ea1) read
// through the contract's layout, as block 0 of a batch and as block 7.
TEST(PhiloxBatchTest, KnownAnswerVector) {
  const uint64_t seed = 0x299f31d0a4093822ull;
  const uint64_t offset = 0x0370734413198a2eull;
  const uint32_t stream = 0x85a308d3u;
  const uint32_t block = 0x243f6a88u;
  const uint32_t expected[4] = {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u};
  for (PhiloxBatchImpl impl : kImpls) {
    if (!PhiloxBatchImplAvailable(impl)) continue;
    for (uint32_t at : {0u, 7u}) {
      uint32_t words[kPhiloxBatchWords];
      PhiloxNoiseWordsWith(impl, seed, offset, stream, block - at, words);
      for (int w = 0; w < 4; ++w) EXPECT_EQ(words[4 * at + w], expected[w]);
    }
  }
}

TEST(PhiloxBatchTest, EveryImplementationEqualsTheContract) {
  std::mt19937_64 rng(17);
  for (PhiloxBatchImpl impl : kImpls) {
    if (!PhiloxBatchImplAvailable(impl)) continue;
    for (int trial = 0; trial < 20000; ++trial) {
      const uint64_t seed = rng();
      const uint64_t offset = trial % 3 == 0 ? trial : rng();
      const uint32_t stream = static_cast<uint32_t>(rng());
      const uint32_t first_block = static_cast<uint32_t>(rng()) >> (trial % 8 ? 2 : 0);
      ExpectMatchesContract(impl, seed, offset, stream, first_block);
    }
    // Extremes: all-ones fields and block counters that wrap around 2^32.
    ExpectMatchesContract(impl, ~0ull, ~0ull, ~0u, ~0u - 5);
    ExpectMatchesContract(impl, 0, 0, 0, 0);
  }
  // The dispatching entry point too.
  uint32_t words[kPhiloxBatchWords];
  PhiloxNoiseWords(5, 6, 7, 8, words);
  for (int t = 0; t < kPhiloxBatchWords; ++t) EXPECT_EQ(words[t], NoiseBits(5, 6, 7, 32 + t));
}

}  // namespace
}  // namespace flashsampler::kernels
