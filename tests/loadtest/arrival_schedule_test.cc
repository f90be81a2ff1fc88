#include "loadtest/arrival_schedule.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace flashsampler::load {
namespace {

TEST(ArrivalSchedule, ConstantRateIsKOverRateWithoutDrift) {
  ArrivalSchedule s(1000.0, Arrival::kConstant, 1);
  for (int k = 0; k < 100000; ++k) {
    const double t = s.Next();
    ASSERT_EQ(t, static_cast<double>(k) / 1000.0) << k;
  }
  ArrivalSchedule third(3.0, Arrival::kConstant, 1);
  for (int k = 0; k < 3000; ++k) third.Next();
  EXPECT_EQ(third.Next(), 1000.0);  // exactly 3000 / 3, no accumulated rounding
}

TEST(ArrivalSchedule, PoissonIsReproducibleAndStartsAtZero) {
  ArrivalSchedule a(500.0, Arrival::kPoisson, 42);
  ArrivalSchedule b(500.0, Arrival::kPoisson, 42);
  ArrivalSchedule c(500.0, Arrival::kPoisson, 43);
  EXPECT_EQ(a.Next(), 0.0);
  b.Next();
  c.Next();
  bool differs = false;
  double last = 0;
  for (int i = 0; i < 1000; ++i) {
    const double ta = a.Next();
    EXPECT_EQ(ta, b.Next());
    differs |= ta != c.Next();
    EXPECT_GE(ta, last);
    last = ta;
  }
  EXPECT_TRUE(differs);
}

// Gaps must be Exponential(rate): mean 1/rate, P(gap > 1/rate) = e^-1 and
// P(gap > 3/rate) = e^-3. With 10^6 gaps the standard errors are 0.1 % of the
// mean and under 0.05 percentage points, so a 1 % error in the rate or in the
// shape fails the 5-sigma bounds below.
TEST(ArrivalSchedule, PoissonGapsAreExponentialWithTheRate) {
  constexpr double kRate = 2500.0;
  constexpr int kGaps = 1000000;
  ArrivalSchedule s(kRate, Arrival::kPoisson, 7);
  double previous = s.Next();
  double sum = 0;
  int over_mean = 0;
  int over_three_means = 0;
  for (int i = 0; i < kGaps; ++i) {
    const double t = s.Next();
    const double gap = (t - previous) * kRate;  // in units of the mean gap
    previous = t;
    sum += gap;
    over_mean += gap > 1.0;
    over_three_means += gap > 3.0;
  }
  const double n = kGaps;
  EXPECT_NEAR(sum / n, 1.0, 5 * 1.0 / std::sqrt(n));
  const double p1 = std::exp(-1.0);
  const double p3 = std::exp(-3.0);
  EXPECT_NEAR(over_mean / n, p1, 5 * std::sqrt(p1 * (1 - p1) / n));
  EXPECT_NEAR(over_three_means / n, p3, 5 * std::sqrt(p3 * (1 - p3) / n));
}

TEST(ParseArrival, AcceptsTheTwoNames) {
  EXPECT_EQ(*ParseArrival("constant"), Arrival::kConstant);
  EXPECT_EQ(*ParseArrival("poisson"), Arrival::kPoisson);
  EXPECT_FALSE(ParseArrival("uniform").ok());
  EXPECT_FALSE(ParseArrival("").ok());
}

}  // namespace
}  // namespace flashsampler::load
