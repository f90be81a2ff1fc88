// The goodness-of-fit check itself: it passes counts drawn from the reference,
// and fails on a 2% error in a likely token, on a missing token, on samples of
// impossible tokens and on too few samples.
#include "tests/common/goodness_of_fit.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace flashsampler::testing {
namespace {

std::vector<double> Probs() {
  // Eight likely tokens and a long tail, like the sampler tests.
  std::vector<float> logits(300);
  for (int v = 0; v < 300; ++v) logits[v] = v < 8 ? 2.0f - 0.1f * v : -3.0f - 0.01f * v;
  return SoftmaxOfScaled(logits, 300, 1.0f);
}

// Multinomial counts of n draws from p, by a fixed-seed generator.
std::vector<int64_t> Draw(const std::vector<double>& p, int64_t n, uint32_t seed) {
  std::mt19937_64 gen(seed);
  std::discrete_distribution<int> dist(p.begin(), p.end());
  std::vector<int64_t> counts(p.size(), 0);
  for (int64_t i = 0; i < n; ++i) ++counts[dist(gen)];
  return counts;
}

constexpr int64_t kN = int64_t{1} << 21;

// The failure messages ExpectCountsMatch reports, captured instead of failing.
std::string Failures(const std::vector<int64_t>& counts, const std::vector<double>& p) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    ExpectCountsMatch(counts, p);
  }
  std::string all;
  for (int i = 0; i < results.size(); ++i) all += results.GetTestPartResult(i).message();
  return all;
}

using ::testing::HasSubstr;

TEST(GoodnessOfFit, AcceptsSamplesFromTheReference) {
  const std::vector<double> p = Probs();
  EXPECT_EQ(Failures(Draw(p, kN, 1), p), "");
  FitSummary s = ExpectCountsMatch(Draw(p, kN, 1), p);
  EXPECT_EQ(s.samples, static_cast<double>(kN));
  EXPECT_GT(s.z_tested, 0);
  EXPECT_GT(s.degrees_of_freedom, 10);
}

TEST(GoodnessOfFit, RejectsATwoPercentErrorInALikelyToken) {
  const std::vector<double> p = Probs();
  ASSERT_GE(p[3], 0.05);
  std::vector<double> biased = p;
  biased[3] *= 1.02;
  // Keep the sum at 1 by taking the excess evenly from the tail.
  double tail = 0;
  for (size_t v = 8; v < p.size(); ++v) tail += p[v];
  for (size_t v = 8; v < p.size(); ++v) biased[v] -= p[v] / tail * (p[3] * 0.02);
  const std::vector<int64_t> counts = Draw(biased, kN, 2);
  const std::string failures = Failures(counts, p);
  EXPECT_THAT(failures, HasSubstr("token 3 p="));  // the z-test names it
  EXPECT_THAT(failures, HasSubstr("df="));         // and the chi-square fails too
}

TEST(GoodnessOfFit, RejectsImpossibleTokensAndTooFewSamples) {
  const std::vector<double> p = Probs();
  std::vector<int64_t> counts = Draw(p, kN, 3);
  counts.push_back(1);  // a token with no probability was sampled
  EXPECT_THAT(Failures(counts, p), HasSubstr("has no probability"));
  // One likely token (p ~ 0.33): 20000 samples cannot resolve a 2% error in it.
  std::vector<float> logits(300, -5.0f);
  logits[0] = 0.0f;
  const std::vector<double> one_likely = SoftmaxOfScaled(logits, 300, 1.0f);
  EXPECT_THAT(Failures(Draw(one_likely, 20000, 4), one_likely), HasSubstr("too few samples"));
}

}  // namespace
}  // namespace flashsampler::testing
