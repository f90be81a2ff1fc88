#include "tests/common/goodness_of_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "gtest/gtest.h"

namespace flashsampler::testing {

double ChiSquareQuantile(double df, double z) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

std::vector<double> SoftmaxOfScaled(const std::vector<float>& logits, int64_t valid, float scale) {
  std::vector<double> p(static_cast<size_t>(valid));
  double m = -INFINITY;
  for (int64_t v = 0; v < valid; ++v) {
    const float transformed = logits[v] * scale;
    p[v] = transformed;
    m = std::max(m, p[v]);
  }
  double sum = 0.0;
  for (double& x : p) sum += x = std::exp(x - m);
  for (double& x : p) x /= sum;
  return p;
}

FitSummary ExpectCountsMatch(const std::vector<int64_t>& counts, const std::vector<double>& probs,
                             double required_shift, double detectable_error) {
  constexpr double kMinBinExpected = 50.0;
  constexpr double kZThreshold = 5.0;
  constexpr double kChiSquareZ = 4.75;  // alpha ~ 1e-6
  FitSummary s;
  for (int64_t c : counts) s.samples += static_cast<double>(c);
  EXPECT_GT(s.samples, 0.0);
  for (size_t v = probs.size(); v < counts.size(); ++v) {
    EXPECT_EQ(counts[v], 0) << "token " << v << " has no probability but was sampled";
  }
  std::vector<double> bin_expected, bin_observed;
  double pool_e = 0.0, pool_o = 0.0;
  for (size_t v = 0; v < probs.size(); ++v) {
    const double e = s.samples * probs[v];
    const double o = v < counts.size() ? static_cast<double>(counts[v]) : 0.0;
    if (e >= kMinBinExpected) {
      bin_expected.push_back(e);
      bin_observed.push_back(o);
    } else {
      pool_e += e;
      pool_o += o;
      if (pool_e >= kMinBinExpected) {
        bin_expected.push_back(pool_e);
        bin_observed.push_back(pool_o);
        pool_e = pool_o = 0.0;
      }
    }
    if (probs[v] >= 0.05) {
      ++s.z_tested;
      const double sd = std::sqrt(e * (1.0 - probs[v]));
      EXPECT_GE(detectable_error * e / sd, required_shift)
          << "too few samples to catch a " << 100 * detectable_error << "% error in token " << v
          << " (p=" << probs[v] << ")";
      const double z = (o - e) / sd;
      s.max_abs_z = std::max(s.max_abs_z, std::fabs(z));
      EXPECT_LT(std::fabs(z), kZThreshold)
          << "token " << v << " p=" << probs[v] << " observed " << o << " expected " << e;
    }
  }
  if (pool_e > 0.0 || pool_o > 0.0) {
    if (bin_expected.empty()) {
      ADD_FAILURE() << "every token has an expected count below 50: too few samples";
      return s;
    }
    const auto smallest = std::min_element(bin_expected.begin(), bin_expected.end()) - bin_expected.begin();
    bin_expected[smallest] += pool_e;
    bin_observed[smallest] += pool_o;
  }
  EXPECT_GE(bin_expected.size(), 5u) << "too few bins for a chi-square test";
  if (bin_expected.size() < 2) return s;
  for (size_t i = 0; i < bin_expected.size(); ++i) {
    const double d = bin_observed[i] - bin_expected[i];
    s.chi2 += d * d / bin_expected[i];
  }
  s.degrees_of_freedom = static_cast<double>(bin_expected.size() - 1);
  s.chi2_threshold = ChiSquareQuantile(s.degrees_of_freedom, kChiSquareZ);
  EXPECT_LT(s.chi2, s.chi2_threshold) << "df=" << s.degrees_of_freedom;
  std::printf("chi2 = %.1f over %.0f dof (threshold %.1f), %d tokens z-tested (max |z| %.2f), N = %.0f\n",
              s.chi2, s.degrees_of_freedom, s.chi2_threshold, s.z_tested, s.max_abs_z, s.samples);
  return s;
}

}  // namespace flashsampler::testing
