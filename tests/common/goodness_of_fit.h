// Goodness of fit of sampled token counts against float64 reference
// probabilities: the one statistical check every sampler test (CPU and GPU)
// uses, so all backends are held to the same standard.
//
// ExpectCountsMatch runs two tests on N = sum(counts) samples:
//  - chi-square over bins of expected count >= 50 (tokens with smaller expected
//    counts are pooled in index order until a pool reaches 50; a last partial
//    pool joins the smallest bin), failing above the chi-square quantile at
//    alpha ~ 1e-6 (Wilson-Hilferty, z = 4.75);
//  - a z-test on every token with p >= 0.05, failing at |z| > 5.
// Power: a relative error r (`detectable_error`, 2% by default) in a token of
// probability p shifts its count by z = r sqrt(N p / (1 - p)). The check
// asserts that this is at least `required_shift` for every z-tested token, so
// a test with too few samples fails instead of passing vacuously. Seeds are fixed in the callers, so the
// outcome is deterministic.
//
// Thread safety: pure functions reporting through GoogleTest assertions.
#pragma once

#include <cstdint>
#include <vector>

namespace flashsampler::testing {

struct FitSummary {
  double samples = 0;
  double chi2 = 0;
  double degrees_of_freedom = 0;
  double chi2_threshold = 0;
  int z_tested = 0;
  double max_abs_z = 0;
};

// Upper quantile of chi-square(df) at the standard-normal quantile z.
double ChiSquareQuantile(double df, double z);

// `probs` are the reference probabilities of the tokens (summing to 1); counts
// of tokens beyond probs.size() must be zero.
FitSummary ExpectCountsMatch(const std::vector<int64_t>& counts, const std::vector<double>& probs,
                             double required_shift = 6.0, double detectable_error = 0.02);

// float64 softmax of fp32 transformed logits logits[v] * scale (one fp32
// multiply, as every backend forms them), over the first `valid` tokens.
std::vector<double> SoftmaxOfScaled(const std::vector<float>& logits, int64_t valid, float scale);

}  // namespace flashsampler::testing
