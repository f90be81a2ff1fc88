// Hand-computed cases for the float64 reference of the sampling controls, so
// the reference the sampler tests trust is itself checked.
#include "tests/common/controls_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace flashsampler::testing {
namespace {

// Probabilities proportional to exp(l) over the listed tokens, 0 elsewhere.
std::vector<double> Softmax(const std::vector<double>& l, const std::vector<int>& kept, size_t v) {
  std::vector<double> p(v, 0.0);
  double s = 0;
  for (int i : kept) s += std::exp(l[i]);
  for (int i : kept) p[i] = std::exp(l[i]) / s;
  return p;
}

void ExpectProbs(const ReferenceResult& r, const std::vector<double>& want) {
  ASSERT_EQ(r.probs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(r.probs[i], want[i], 1e-12) << "token " << i;
}

const std::vector<float> kRaw = {2.0f, 1.0f, 0.0f, -1.0f, 1.0f};

TEST(ControlsReference, NoControlsIsSoftmaxOverTemperature) {
  const ReferenceResult r = ReferenceControlledDistribution(kRaw, 5, 2.0f, RowControls{});
  ExpectProbs(r, Softmax({1.0, 0.5, 0.0, -0.5, 0.5}, {0, 1, 2, 3, 4}, 5));
  double s = 0;
  for (double x : {1.0, 0.5, 0.0, -0.5, 0.5}) s += std::exp(x);
  EXPECT_NEAR(r.logz, std::log(s), 1e-12);
}

TEST(ControlsReference, TopKBreaksTiesTowardTheLowerId) {
  RowControls c;
  c.top_k = 2;  // tokens 1 and 4 tie at 1.0: token 1 is kept
  ExpectProbs(ReferenceControlledDistribution(kRaw, 5, 1.0f, c),
              Softmax({2, 1, 0, -1, 1}, {0, 1}, 5));
}

TEST(ControlsReference, TopPKeepsTheShortestPrefixReachingP) {
  // Sorted: 0 (e^2), 1 (e), 4 (e), 2 (1), 3 (e^-1); total 14.193.
  // Mass before token 4: (e^2 + e) / total = 0.712 < 0.75, so 4 is kept;
  // before token 2 it is 0.904 >= 0.75.
  RowControls c;
  c.top_p = 0.75f;
  ExpectProbs(ReferenceControlledDistribution(kRaw, 5, 1.0f, c),
              Softmax({2, 1, 0, -1, 1}, {0, 1, 4}, 5));
}

TEST(ControlsReference, MinPIsRelativeToTheLargestProbability) {
  RowControls c;
  c.min_p = 0.3f;  // exp(1 - 2) = 0.37 kept, exp(0 - 2) = 0.135 removed
  ExpectProbs(ReferenceControlledDistribution(kRaw, 5, 1.0f, c),
              Softmax({2, 1, 0, -1, 1}, {0, 1, 4}, 5));
}

TEST(ControlsReference, PenaltiesBiasAndMasksFollowVllm) {
  RowControls c;
  c.logit_bias = {{2, 1.5f}};
  c.banned_token_ids = {3};
  c.allowed_bitmask = {0b10111u};  // token 3 also disallowed here
  c.repetition_penalty = 2.0f;
  c.presence_penalty = 0.25f;
  c.frequency_penalty = 0.5f;
  c.prompt_token_ids = {1};
  c.output_token_ids = {0, 0, 2};
  // token 0: 2 / 2 - 0.5 * 2 - 0.25 = -0.25; token 1: 1 / 2 = 0.5;
  // token 2: (0 + 1.5) / 2 - 0.5 - 0.25 = 0; token 4: 1 (untouched).
  ExpectProbs(ReferenceControlledDistribution(kRaw, 5, 1.0f, c),
              Softmax({-0.25, 0.5, 0.0, 0.0, 1.0}, {0, 1, 2, 4}, 5));
  // Non-positive logits are multiplied: token 3 at -1 with a repetition
  // penalty becomes -2 when allowed.
  RowControls d;
  d.repetition_penalty = 2.0f;
  d.output_token_ids = {3};
  const ReferenceResult r = ReferenceControlledDistribution(kRaw, 5, 1.0f, d);
  EXPECT_DOUBLE_EQ(r.logits[3], -2.0);
}

TEST(ControlsReference, FilterOrderIsMinPThenTopKThenTopP) {
  RowControls c;
  c.min_p = 0.3f;  // keeps 0, 1, 4
  c.top_k = 2;     // keeps 0, 1
  c.top_p = 0.5f;  // e^2 / (e^2 + e) = 0.73 >= 0.5: keeps 0
  ExpectProbs(ReferenceControlledDistribution(kRaw, 5, 1.0f, c), Softmax({2, 1, 0, -1, 1}, {0}, 5));
}

}  // namespace
}  // namespace flashsampler::testing
