#include "loadtest/latency_stats.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace flashsampler::load {
namespace {

std::vector<double> OneTo(int n) {
  std::vector<double> v(n);
  std::iota(v.begin(), v.end(), 1.0);
  return v;
}

TEST(Percentile, IsNearestRank) {
  const std::vector<double> v = OneTo(100);
  EXPECT_EQ(Percentile(v, 0), 1);
  EXPECT_EQ(Percentile(v, 1), 1);
  EXPECT_EQ(Percentile(v, 1.5), 2);
  EXPECT_EQ(Percentile(v, 50), 50);
  EXPECT_EQ(Percentile(v, 50.1), 51);
  EXPECT_EQ(Percentile(v, 90), 90);
  EXPECT_EQ(Percentile(v, 99), 99);
  EXPECT_EQ(Percentile(v, 99.9), 100);
  EXPECT_EQ(Percentile(v, 100), 100);
  // 99.9 % of 1000 is exactly rank 999, despite 99.9 not being exact in binary.
  EXPECT_EQ(Percentile(OneTo(1000), 99.9), 999);
  EXPECT_EQ(Percentile(OneTo(1000), 99), 990);
  EXPECT_EQ(Percentile({42.0}, 0), 42);
  EXPECT_EQ(Percentile({42.0}, 99.9), 42);
  EXPECT_EQ(Percentile({1.0, 2.0}, 50), 1);
  EXPECT_EQ(Percentile({1.0, 2.0}, 51), 2);
}

TEST(Summarize, SortsACopyAndReportsEveryField) {
  std::vector<double> v = OneTo(1000);
  std::shuffle(v.begin(), v.end(), std::mt19937(3));
  const LatencySummary s = Summarize(v);
  EXPECT_EQ(s.count, 1000);
  EXPECT_DOUBLE_EQ(s.mean_us, 500.5);
  EXPECT_EQ(s.p50_us, 500);
  EXPECT_EQ(s.p90_us, 900);
  EXPECT_EQ(s.p99_us, 990);
  EXPECT_EQ(s.p999_us, 999);
  EXPECT_EQ(s.max_us, 1000);
  const LatencySummary empty = Summarize({});
  EXPECT_EQ(empty.count, 0);
  EXPECT_EQ(empty.max_us, 0);
}

TEST(LogHistogram, BucketsAreContiguousAndHoldEverySampleOnce) {
  std::vector<double> v = {0.5, 1.0, 9.99, 10.0, 10.0, 123.0, 5000.0, 5000.0};
  const std::vector<HistogramBucket> h = LogHistogram(v, 10);
  ASSERT_FALSE(h.empty());
  EXPECT_EQ(h.front().lower_us, 0.0);
  int64_t total = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    total += h[i].count;
    EXPECT_LT(h[i].lower_us, h[i].upper_us);
    if (i > 0) {
      EXPECT_DOUBLE_EQ(h[i].lower_us, h[i - 1].upper_us);
      // Ten buckets per decade: each edge is 10^(1/10) times the last.
      if (h[i].lower_us >= 1.0) {
        EXPECT_NEAR(h[i].upper_us / h[i].lower_us, std::pow(10.0, 0.1), 1e-9);
      }
    }
  }
  EXPECT_EQ(total, static_cast<int64_t>(v.size()));
  for (const double x : v) {
    const auto it = std::find_if(h.begin(), h.end(), [x](const HistogramBucket& b) {
      return b.lower_us <= x && x < b.upper_us * (1 + 1e-12);
    });
    ASSERT_NE(it, h.end()) << x;
  }
  // 10.0 sits on an edge: it opens the bucket [10, 12.59), it does not close [7.94, 10).
  const auto ten = std::find_if(h.begin(), h.end(), [](const HistogramBucket& b) {
    return std::abs(b.lower_us - 10.0) < 1e-9;
  });
  ASSERT_NE(ten, h.end());
  EXPECT_EQ(ten->count, 2);
  EXPECT_EQ(h.back().count, 2);  // the two 5000 µs samples end the histogram
  EXPECT_TRUE(LogHistogram({}, 10).empty());
}

TEST(LogHistogram, StartsAtThePowerOfTenBelowTheSmallestSample) {
  const std::vector<HistogramBucket> h = LogHistogram({250.0, 260.0}, 10);
  ASSERT_FALSE(h.empty());
  EXPECT_NEAR(h.front().lower_us, 100.0, 1e-9);
  EXPECT_GT(h.back().upper_us, 260.0);
  EXPECT_EQ(h.size(), 5u);  // [100, 125.9) ... [251.2, 316.2)
  EXPECT_NEAR(LogHistogram({1.0}, 10).front().lower_us, 1.0, 1e-12);
}

}  // namespace
}  // namespace flashsampler::load
