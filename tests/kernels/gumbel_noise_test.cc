// Tests of kernels/common/gumbel_noise.h: the RNG contract.
//
// The pinned values below were computed once, independently of this code base,
// with a ~30-line pure-Python Philox4x32-10 written from the algorithm's
// description (Salmon et al., SC'11: multipliers 0xD2511F53 / 0xCD9E8D57, key
// bumps 0x9E3779B9 / 0xBB67AE85), which itself reproduces Random123's
// published known-answer vectors (kPhiloxKat). The float64 reference values of
// g come from the same script (Python's math.log / math.log1p on the exact
// cell centre u). So a change of round count, key schedule, counter/key layout,
// word selection or the u -> g transform breaks these tests.
#include "kernels/common/gumbel_noise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <climits>
#include <random>
#include <vector>

namespace flashsampler {
namespace {

// Random123 tests/kat_vectors (github.com/DEShawResearch/random123), the three
// "philox4x32 10" lines: counter (4 words), key (2 words), expected (4 words).
struct PhiloxKat {
  uint32_t ctr[4];
  uint32_t key[2];
  uint32_t expected[4];
};
constexpr PhiloxKat kPhiloxKat[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

// The key and counter of the contract, assembled from a KAT line.
uint64_t SeedOf(const PhiloxKat& k) { return (uint64_t{k.key[1]} << 32) | k.key[0]; }
uint64_t OffsetOf(const PhiloxKat& k) { return (uint64_t{k.ctr[3]} << 32) | k.ctr[2]; }

// The error scale of g: 1 fp32 ulp of max(|g|, 1). Near g = 0 (E = -log u
// near 1) g = -log E inherits E's absolute rounding of ~2^-24, so the error is
// absolute there, not relative to the tiny g.
double FloatUlp(double x) {
  return std::ldexp(1.0, std::ilogb(static_cast<float>(std::max(std::fabs(x), 1.0))) - 23);
}

// float64 reference of the transform, on the exact cell centre u.
double ReferenceGumbel(uint32_t r) {
  const uint32_t k = r >> 8;
  const double u = (k + 0.5) * 0x1p-24;
  const double one_minus_u = (((1u << 24) - 1u - k) + 0.5) * 0x1p-24;
  const double e = k < (1u << 23) ? -std::log(u) : -std::log1p(-one_minus_u);
  return -std::log(e);
}

TEST(GumbelNoiseTest, PhiloxMatchesRandom123KnownAnswers) {
  for (const PhiloxKat& kat : kPhiloxKat) {
    r123::Philox4x32 philox;
    const r123::Philox4x32::ctr_type ctr = {{kat.ctr[0], kat.ctr[1], kat.ctr[2], kat.ctr[3]}};
    const r123::Philox4x32::key_type key = {{kat.key[0], kat.key[1]}};
    const auto out = philox(ctr, key);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(out.v[w], kat.expected[w]) << "word " << w;
  }
}

// The KAT lines read through the contract's layout: counter = {block, stream,
// offset_lo, offset_hi}, key = {seed_lo, seed_hi}.
TEST(GumbelNoiseTest, NoiseBlockLayoutMatchesKnownAnswers) {
  for (const PhiloxKat& kat : kPhiloxKat) {
    const auto out = PhiloxNoiseBlock(SeedOf(kat), OffsetOf(kat), kat.ctr[1], kat.ctr[0]);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(out.v[w], kat.expected[w]) << "word " << w;
  }
  // KAT 3's block 0x243f6a88 is a reachable block (< 2^30): vocab indices
  // 4 * block + w select word w.
  const PhiloxKat& kat = kPhiloxKat[2];
  for (uint32_t w = 0; w < 4; ++w) {
    const uint32_t vocab_index = kat.ctr[0] * 4u + w;
    EXPECT_EQ(NoiseBits(SeedOf(kat), OffsetOf(kat), kat.ctr[1], vocab_index), kat.expected[w]);
  }
  // KAT 1: everything zero is vocab indices 0..3 of seed 0, offset 0, stream 0.
  for (uint32_t w = 0; w < 4; ++w) EXPECT_EQ(NoiseBits(0, 0, 0, w), kPhiloxKat[0].expected[w]);
}

// Each part of the tuple lands in its own counter / key word.
TEST(GumbelNoiseTest, EachTupleFieldSelectsItsWord) {
  const uint64_t seed = 0x0123456789abcdefull;
  const uint64_t offset = 0xfedcba9876543210ull;
  const uint32_t stream = 0xdeadbeefu;
  const uint32_t index = 0x12345679u;
  r123::Philox4x32 philox;
  const auto expected = philox({{index >> 2, stream, 0x76543210u, 0xfedcba98u}},
                               {{0x89abcdefu, 0x01234567u}});
  EXPECT_EQ(NoiseBits(seed, offset, stream, index), expected.v[index & 3]);
  // The four indices of one block share one Philox call, in word order.
  for (uint32_t w = 0; w < 4; ++w) {
    EXPECT_EQ(NoiseBits(seed, offset, stream, (index & ~3u) + w), expected.v[w]);
  }
  // Flipping any single field changes the word.
  const uint32_t base = NoiseBits(seed, offset, stream, index);
  EXPECT_NE(NoiseBits(seed ^ 1, offset, stream, index), base);
  EXPECT_NE(NoiseBits(seed ^ (1ull << 32), offset, stream, index), base);
  EXPECT_NE(NoiseBits(seed, offset ^ 1, stream, index), base);
  EXPECT_NE(NoiseBits(seed, offset ^ (1ull << 32), stream, index), base);
  EXPECT_NE(NoiseBits(seed, offset, stream ^ 1, index), base);
  EXPECT_NE(NoiseBits(seed, offset, stream, index ^ 4), base);
}

// Pinned (seed, offset, stream, index) -> r, and the float64 g of that r, both
// from the independent Python script.
struct PinnedNoise {
  uint64_t seed, offset;
  uint32_t stream, index;
  uint32_t bits;
  double g;
};
constexpr PinnedNoise kPinned[] = {
    {0x0, 0x0, 0x0, 0, 0x6627e8d5, 0.0848201968},
    {0x1, 0x0, 0x0, 0, 0xe3e80670, 2.15207547},
    {42, 7, 3, 12345, 0xd83caba5, 1.77902616},
    {0x0123456789abcdefull, 0xfedcba9876543210ull, 0xdeadbeef, 2147483646, 0x29c43322,
     -0.595029812},
    {0xffffffffffffffffull, 0xffffffffffffffffull, 0xffffffff, 2147483647, 0x37ec6926,
     -0.419494916},
    {123456789, 1000, 5, 31999, 0xd81e9ae6, 1.77581285},
};

TEST(GumbelNoiseTest, PinnedValues) {
  for (const PinnedNoise& p : kPinned) {
    EXPECT_EQ(NoiseBits(p.seed, p.offset, p.stream, p.index), p.bits) << "index " << p.index;
    const float g = GumbelNoise(p.seed, p.offset, p.stream, p.index);
    // Two logs of fp32, each within ~1 ulp, plus the 9-digit pinned value.
    EXPECT_NEAR(g, p.g, 4 * FloatUlp(p.g)) << "index " << p.index;
    EXPECT_EQ(g, GumbelFromBits(p.bits));
  }
  // The transform's fixed points, pinned from the same script.
  EXPECT_NEAR(GumbelFromBits(0x00000000u), -2.8523629, 4 * FloatUlp(2.85));
  EXPECT_NEAR(GumbelFromBits(0x000000ffu), -2.8523629, 4 * FloatUlp(2.85));
  EXPECT_NEAR(GumbelFromBits(0x00000100u), -2.78686552, 4 * FloatUlp(2.78));
  EXPECT_NEAR(GumbelFromBits(0x7fffffffu), 0.366512835, 4 * FloatUlp(0.366));
  EXPECT_NEAR(GumbelFromBits(0x80000000u), 0.366513007, 4 * FloatUlp(0.366));
  EXPECT_NEAR(GumbelFromBits(0xfffffeffu), 16.2300672, 4 * FloatUlp(16.2));
  EXPECT_NEAR(GumbelFromBits(0xffffff00u), 17.3286795, 4 * FloatUlp(17.3));
  EXPECT_NEAR(GumbelFromBits(0xffffffffu), 17.3286795, 4 * FloatUlp(17.3));
}

// Only the top 24 bits matter (k = r >> 8).
TEST(GumbelNoiseTest, LowByteIsIgnored) {
  for (uint32_t r : {0x00000000u, 0x12345600u, 0x80000000u, 0xffffff00u}) {
    for (uint32_t low = 0; low < 256; ++low) EXPECT_EQ(GumbelFromBits(r | low), GumbelFromBits(r));
  }
}

// Exhaustive over the extreme words (r < 2^16 and r >= 2^32 - 2^16, i.e. the
// 256 lowest and 256 highest cells with all their low bytes): u is never 0 or
// 1 (E finite and > 0), g is finite, within [-2.8524, kGumbelMax] and close to
// the float64 transform of the exact cell centre.
TEST(GumbelNoiseTest, ExtremeWordsAreFiniteAndBounded) {
  auto check = [](uint32_t r) {
    const float e = ExponentialFromBits(r);
    const float g = GumbelFromBits(r);
    ASSERT_TRUE(std::isfinite(e) && e > 0.0f) << std::hex << r;
    ASSERT_TRUE(std::isfinite(g)) << std::hex << r;
    ASSERT_LE(g, kGumbelMax) << std::hex << r;
    ASSERT_GE(g, -2.8524f) << std::hex << r;
    const double ref = ReferenceGumbel(r);
    ASSERT_NEAR(g, ref, 4 * FloatUlp(ref)) << std::hex << r;
  };
  for (uint32_t r = 0; r < (1u << 16); ++r) check(r);
  for (uint32_t r = 0xffffffffu - 0xffffu;; ++r) {
    check(r);
    if (r == 0xffffffffu) break;
  }
}

// Exhaustive over all 2^24 cells (one r per cell; the low byte is ignored):
// finite, bounded, within a few ulp of float64, and non-decreasing in k up to
// that accuracy (exactly monotone with glibc's logf / log1pf; nothing relies on
// more than the tolerance, see gumbel_bucket_bound.h).
TEST(GumbelNoiseTest, AllCellsFiniteBoundedMonotone) {
  float prev = -INFINITY;
  float max_g = -INFINITY;
  double max_abs_err_ulps = 0.0;
  for (uint32_t k = 0; k < (1u << 24); ++k) {
    const uint32_t r = k << 8;
    const float g = GumbelFromBits(r);
    ASSERT_TRUE(std::isfinite(g)) << k;
    ASSERT_GE(g, prev - 2 * FloatUlp(g)) << "not monotone at k=" << k;
    prev = g;
    max_g = std::max(max_g, g);
    if ((k & 255) == 0 || k >= (1u << 24) - 4096) {  // a sample, and all top cells
      const double ref = ReferenceGumbel(r);
      max_abs_err_ulps = std::max(max_abs_err_ulps, std::fabs(g - ref) / FloatUlp(ref));
    }
  }
  EXPECT_LE(max_g, kGumbelMax);
  EXPECT_GT(max_g, 17.328f);  // kGumbelMax is tight: the margin is ~1e-3
  EXPECT_LE(max_abs_err_ulps, 4.0);
}

// GumbelLeadingOnesBound bounds every cell (pruning with it is exact only if
// it does), and it is tight enough to prune: within ln 2 + 2^-10 of the
// largest g of its leading-ones class from one leading one on, and it grows
// with the class.
TEST(GumbelNoiseTest, LeadingOnesBoundHoldsForEveryCell) {
  for (uint32_t k = 0; k < (1u << 24); ++k) {
    const uint32_t r = k << 8;
    const float g = GumbelFromBits(r);
    ASSERT_LE(g, GumbelLeadingOnesBound(r)) << "k=" << k;
    ASSERT_EQ(GumbelLeadingOnesBound(r), GumbelLeadingOnesBound(r | 0xffu)) << "k=" << k;
  }
  float prev = -INFINITY;
  for (int n = 0; n <= 24; ++n) {
    // The largest word with exactly n leading ones (all ones for n = 24).
    const uint32_t top = n >= 24 ? 0xffffffffu : ~(0x80000000u >> n);
    const float bound = GumbelLeadingOnesBound(top);
    EXPECT_GT(bound, prev) << n;
    prev = bound;
    EXPECT_GE(bound, GumbelFromBits(top)) << n;
    if (n >= 1) {
      EXPECT_LE(bound - GumbelFromBits(top), 0.6931472f + 0x1p-10f + 1e-5f) << n;
    }
  }
  EXPECT_GE(GumbelLeadingOnesBound(0xffffffffu), kGumbelMax - 1e-3f);
  EXPECT_EQ(GumbelLeadingOnesBound(0xffffff00u), GumbelLeadingOnesBound(0xffffffffu));
}

// The device's form of the bound (GumbelBoundFromTopZero of the highest
// zero bit of r) gives GumbelLeadingOnesBound's bits in every leading-ones
// class, and on words within each class.
TEST(GumbelNoiseTest, TheDevicesBoundFormGivesTheSameBits) {
  const auto top_zero = [](uint32_t r) { return r == 0xffffffffu ? -1 : 31 - __builtin_clz(~r); };
  std::mt19937 gen(11);
  for (int n = 0; n <= 32; ++n) {
    // Exactly n leading ones, then (n < 32) a zero, then random bits.
    const uint32_t ones = n == 0 ? 0u : n >= 32 ? 0xffffffffu : ~(0xffffffffu >> n);
    for (int trial = 0; trial < 1000; ++trial) {
      const uint32_t rest = n >= 31 ? 0u : static_cast<uint32_t>(gen()) & (0x7fffffffu >> n);
      const uint32_t r = ones | rest;
      ASSERT_EQ(std::bit_cast<uint32_t>(GumbelBoundFromTopZero(top_zero(r))),
                std::bit_cast<uint32_t>(GumbelLeadingOnesBound(r)))
          << "n=" << n << " r=" << r;
    }
  }
}

// The empirical distribution of g over many tuples is Gumbel(0, 1):
// Kolmogorov-Smirnov against F(x) = exp(-exp(-x)) and the first two moments.
TEST(GumbelNoiseTest, EmpiricalDistributionIsGumbel) {
  constexpr int kN = 1 << 20;
  std::vector<double> g;
  g.reserve(kN);
  // Mix seeds, offsets, streams and indices so every field feeds the sample.
  for (int i = 0; i < kN; ++i) {
    const uint64_t seed = 0x5eed0000ull + (i & 7);
    const uint64_t offset = (i >> 3) & 15;
    const uint32_t stream = (i >> 7) & 31;
    const uint32_t index = static_cast<uint32_t>(i >> 12) * 977u;
    g.push_back(GumbelNoise(seed, offset, stream, index));
  }
  double mean = 0.0;
  for (double x : g) mean += x;
  mean /= kN;
  double var = 0.0;
  for (double x : g) var += (x - mean) * (x - mean);
  var /= (kN - 1);
  constexpr double kEulerGamma = 0.57721566490153286;
  const double kVariance = M_PI * M_PI / 6.0;
  // Standard errors: sd/sqrt(N) = 1.25e-3 for the mean; the variance's is
  // sqrt((mu4 - sigma^4) / N) with mu4 = 5.4 sigma^4 -> ~3.4e-3. 5 sigma.
  EXPECT_NEAR(mean, kEulerGamma, 5 * std::sqrt(kVariance / kN));
  EXPECT_NEAR(var, kVariance, 5 * std::sqrt(4.4 * kVariance * kVariance / kN));

  std::sort(g.begin(), g.end());
  double d = 0.0;
  for (int i = 0; i < kN; ++i) {
    const double f = std::exp(-std::exp(-g[i]));
    d = std::max({d, f - static_cast<double>(i) / kN, static_cast<double>(i + 1) / kN - f});
  }
  // KS critical value at alpha = 1e-4: sqrt(-ln(alpha / 2) / 2) / sqrt(N) = 2.23 / sqrt(N).
  EXPECT_LT(d, 2.23 / std::sqrt(static_cast<double>(kN)));
}

// The acceptance stream of speculative verification: word 0 of the block at
// counter word 0 = 0xFFFFFFFF. Pinned words from the same independent Python
// Philox; the last line is Random123's KAT 2 (all-ones counter and key), read
// through the acceptance layout. u is the exact cell centre in double.
struct PinnedAccept {
  uint64_t seed, offset;
  uint32_t stream;
  uint32_t bits;
};
constexpr PinnedAccept kPinnedAccept[] = {
    {0x0, 0x0, 0x0, 0xc5b20a9d},
    {42, 7, 3, 0xe5f70efd},
    {0x0123456789abcdefull, 0xfedcba9876543210ull, 5, 0x321c31f8},
    {0xffffffffffffffffull, 0xffffffffffffffffull, 0xffffffff, 0x408f276d},
};

TEST(GumbelNoiseTest, VerifyAcceptUniformPinnedValues) {
  EXPECT_EQ(kPinnedAccept[3].bits, kPhiloxKat[1].expected[0]);
  for (const PinnedAccept& p : kPinnedAccept) {
    const double u = VerifyAcceptUniform(p.seed, p.offset, p.stream);
    EXPECT_EQ(u, (static_cast<double>(p.bits >> 8) + 0.5) * 0x1p-24) << std::hex << p.bits;
    EXPECT_EQ(PhiloxNoiseBlock(p.seed, p.offset, p.stream, kVerifyAcceptBlock).v[0], p.bits);
  }
  EXPECT_DOUBLE_EQ(VerifyAcceptUniform(0, 0, 0), 0.7722479403018951);
  EXPECT_DOUBLE_EQ(VerifyAcceptUniform(42, 7, 3), 0.8983010351657867);
}

// The acceptance block is unreachable for noise: the largest vocabulary index
// (INT32_MAX) uses block 2^29 - 1. And the uniform changes with each field.
TEST(GumbelNoiseTest, VerifyAcceptStreamIsDisjointFromNoise) {
  EXPECT_LT(static_cast<uint32_t>(INT32_MAX) >> 2, kVerifyAcceptBlock);
  const double base = VerifyAcceptUniform(7, 11, 13);
  EXPECT_NE(VerifyAcceptUniform(8, 11, 13), base);
  EXPECT_NE(VerifyAcceptUniform(7, 12, 13), base);
  EXPECT_NE(VerifyAcceptUniform(7, 11, 14), base);
  EXPECT_NE(VerifyAcceptUniform(7, 11 + (1ull << 32), 13), base);
}

// u is a uniform on (0, 1): never 0 or 1, mean 1/2, and P(u < p) = p (KS).
TEST(GumbelNoiseTest, VerifyAcceptUniformIsUniform) {
  constexpr int kN = 200000;
  std::vector<double> u(kN);
  for (int i = 0; i < kN; ++i) {
    u[i] = VerifyAcceptUniform(1234, static_cast<uint64_t>(i), static_cast<uint32_t>(i % 3));
    ASSERT_GT(u[i], 0.0);
    ASSERT_LT(u[i], 1.0);
  }
  std::sort(u.begin(), u.end());
  double d = 0.0;
  for (int i = 0; i < kN; ++i) {
    d = std::max({d, u[i] - static_cast<double>(i) / kN, static_cast<double>(i + 1) / kN - u[i]});
  }
  EXPECT_LT(d, 2.23 / std::sqrt(static_cast<double>(kN)));  // KS, alpha = 1e-4
  // Extreme cells: r = 0 and r = 2^32 - 1 give 2^-25 and 1 - 2^-25 exactly.
  EXPECT_EQ((static_cast<double>(0u >> 8) + 0.5) * 0x1p-24, 0x1p-25);
  EXPECT_EQ((static_cast<double>(0xffffffffu >> 8) + 0.5) * 0x1p-24, 1.0 - 0x1p-25);
}

}  // namespace
}  // namespace flashsampler
