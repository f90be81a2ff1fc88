// Tests of kernels/cpu/gumbel_bucket_bound.h: the pruning bound must hold for
// every noise word, with this build's libm, or pruning would not be exact.
#include "kernels/cpu/gumbel_bucket_bound.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/common/gumbel_noise.h"

namespace flashsampler::kernels {
namespace {

// Exhaustive: GumbelFromBits depends on r >> 8 only, so the 2^24 words k << 8
// cover all 2^32 inputs.
TEST(GumbelBucketBoundTest, BoundsEveryCell) {
  const GumbelBucketBound bound;
  for (uint32_t k = 0; k < (1u << 24); ++k) {
    const uint32_t r = k << 8;
    ASSERT_LE(GumbelFromBits(r), bound(r)) << "k=" << k;
    ASSERT_LE(GumbelFromBits(r | 0xffu), bound(r | 0xffu)) << "k=" << k;
  }
}

// The bound is tight enough to prune: within 1e-3 (relative) of the bucket's
// largest value, never above kGumbelMax, and only the top bucket exceeds 5.6.
TEST(GumbelBucketBoundTest, IsTightAndMonotone) {
  const GumbelBucketBound bound;
  float prev = -INFINITY;
  for (uint32_t j = 0; j < GumbelBucketBound::kBuckets; ++j) {
    const uint32_t top = (j << 24) | 0x00ffffffu;
    const float b = bound(j << 24);
    EXPECT_EQ(b, bound(top));
    EXPECT_GE(b, prev);
    EXPECT_LE(b - GumbelFromBits(top), 1e-3f * std::max(1.0f, std::fabs(b)));
    EXPECT_LE(b, kGumbelMax);
    if (j < 255) {
      EXPECT_LT(b, 5.6f) << j;
    }
    prev = b;
  }
  EXPECT_EQ(bound(0xffffffffu), kGumbelMax);
  // below_top_bound() covers every word outside the top bucket.
  EXPECT_EQ(GumbelBucketBound::kTopBucketFirstWord, 0xff000000u);
  EXPECT_EQ(bound.below_top_bound(), bound(0xfeffffffu));
  EXPECT_GE(bound.below_top_bound(), GumbelFromBits(0xfeffffffu));
  EXPECT_LT(bound.below_top_bound(), bound(0xff000000u));
}

}  // namespace
}  // namespace flashsampler::kernels
