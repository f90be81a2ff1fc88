// Tests of kernels/common/sample_summary.h: the one merge every reduction uses.
#include "kernels/common/sample_summary.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace flashsampler {
namespace {

SampleSummary Winner(float score, int32_t index, float logit = 0.0f) {
  return SampleSummary{score, index, logit, -INFINITY, 0.0f};
}

// The summary of logits[begin, end) with given scores, computed as a tile does.
SampleSummary SliceSummary(const std::vector<float>& logits, const std::vector<float>& scores,
                           int begin, int end) {
  SampleSummary s = EmptySampleSummary();
  for (int i = begin; i < end; ++i) {
    if (ScoreBeats(scores[i], i, s.best_score, s.best_index)) {
      s.best_score = scores[i];
      s.best_index = i;
      s.best_logit = logits[i];
    }
  }
  if (begin < end) {
    float m = -INFINITY;
    for (int i = begin; i < end; ++i) m = std::max(m, logits[i]);
    float sum = 0.0f;
    for (int i = begin; i < end; ++i) sum += expf(logits[i] - m);
    s.max_logit = m;
    s.sum_exp = sum;
  }
  return s;
}

void ExpectSameWinner(const SampleSummary& a, const SampleSummary& b) {
  EXPECT_EQ(a.best_index, b.best_index);
  EXPECT_EQ(a.best_score, b.best_score);
  EXPECT_EQ(a.best_logit, b.best_logit);
}

TEST(SampleSummaryTest, ScoreBeats) {
  EXPECT_TRUE(ScoreBeats(2.0f, 5, 1.0f, 3));
  EXPECT_FALSE(ScoreBeats(1.0f, 3, 2.0f, 5));
  EXPECT_TRUE(ScoreBeats(1.0f, 3, 1.0f, 5));   // tie: lower index wins
  EXPECT_FALSE(ScoreBeats(1.0f, 5, 1.0f, 3));
  EXPECT_FALSE(ScoreBeats(1.0f, 3, 1.0f, 3));  // strict
  EXPECT_FALSE(ScoreBeats(100.0f, -1, 1.0f, 3));  // an empty side never beats
  EXPECT_TRUE(ScoreBeats(-INFINITY, 7, 100.0f, -1));  // anything valid beats empty
  EXPECT_FALSE(ScoreBeats(-INFINITY, -1, -INFINITY, -1));
}

TEST(SampleSummaryTest, EmptyIsTheIdentity) {
  const SampleSummary e = EmptySampleSummary();
  EXPECT_EQ(e.best_index, -1);
  EXPECT_EQ(e.max_logit, -INFINITY);
  EXPECT_EQ(e.sum_exp, 0.0f);

  const SampleSummary ee = MergeSummaries(e, e);
  EXPECT_EQ(ee.best_index, -1);
  EXPECT_EQ(ee.max_logit, -INFINITY);
  EXPECT_EQ(ee.sum_exp, 0.0f);  // no exp(-inf - -inf) = NaN

  const SampleSummary a{3.5f, 17, 1.25f, 2.0f, 4.5f};
  for (const SampleSummary& m : {MergeSummaries(a, e), MergeSummaries(e, a)}) {
    ExpectSameWinner(m, a);
    EXPECT_EQ(m.max_logit, a.max_logit);
    EXPECT_EQ(m.sum_exp, a.sum_exp);
  }
}

TEST(SampleSummaryTest, TieGoesToTheLowerIndexInEitherOrder) {
  const SampleSummary lo = Winner(1.5f, 10, 0.25f);
  const SampleSummary hi = Winner(1.5f, 900, 0.75f);
  ExpectSameWinner(MergeSummaries(lo, hi), lo);
  ExpectSameWinner(MergeSummaries(hi, lo), lo);
}

// The winner of a merge is independent of order and grouping, ties included.
TEST(SampleSummaryTest, WinnerIsCommutativeAndAssociative) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> score(0, 3);  // few values: many ties
  std::uniform_int_distribution<int> index(-1, 50);
  for (int trial = 0; trial < 20000; ++trial) {
    SampleSummary s[3];
    for (auto& x : s) {
      const int i = index(rng);
      x = i < 0 ? EmptySampleSummary() : Winner(static_cast<float>(score(rng)), i, i * 0.5f);
    }
    ExpectSameWinner(MergeSummaries(s[0], s[1]), MergeSummaries(s[1], s[0]));
    ExpectSameWinner(MergeSummaries(MergeSummaries(s[0], s[1]), s[2]),
                     MergeSummaries(s[0], MergeSummaries(s[1], s[2])));
    ExpectSameWinner(MergeSummaries(MergeSummaries(s[0], s[1]), s[2]),
                     MergeSummaries(MergeSummaries(s[2], s[0]), s[1]));
  }
}

// Merging the slices of any partition, in any order, gives the winner of the
// whole vector; the log-sum-exp matches float64 to fp32 accuracy.
TEST(SampleSummaryTest, PartitionsAgreeWithWholeVectorAndFloat64) {
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::uniform_int_distribution<int> coarse(0, 5);
  constexpr int kN = 3000;
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> logits(kN), scores(kN);
    for (int i = 0; i < kN; ++i) {
      logits[i] = normal(rng);
      scores[i] = trial % 2 ? static_cast<float>(coarse(rng)) : logits[i] + normal(rng);
    }
    const SampleSummary whole = SliceSummary(logits, scores, 0, kN);

    // A random partition into slices (some empty), merged left to right and in
    // a shuffled order.
    std::vector<int> cuts = {0, kN};
    std::uniform_int_distribution<int> cut(0, kN);
    for (int c = 0; c < 20; ++c) cuts.push_back(cut(rng));
    std::sort(cuts.begin(), cuts.end());
    std::vector<SampleSummary> slices;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      slices.push_back(SliceSummary(logits, scores, cuts[c], cuts[c + 1]));
    }
    SampleSummary in_order = EmptySampleSummary();
    for (const auto& s : slices) in_order = MergeSummaries(in_order, s);
    std::shuffle(slices.begin(), slices.end(), rng);
    SampleSummary shuffled = EmptySampleSummary();
    for (const auto& s : slices) shuffled = MergeSummaries(shuffled, s);
    ExpectSameWinner(in_order, whole);
    ExpectSameWinner(shuffled, whole);

    double m = -INFINITY;
    for (float l : logits) m = std::max(m, static_cast<double>(l));
    double sum = 0.0;
    for (float l : logits) sum += std::exp(l - m);
    const double logz = m + std::log(sum);
    // fp32 sums of up to kN terms: relative error <= kN * 2^-24 ~ 2e-4 in the
    // worst case, ~sqrt(kN) * 2^-24 ~ 3e-6 typically; 2e-5 absolute on log Z.
    EXPECT_NEAR(SummaryLogZ(in_order), logz, 2e-5 * std::max(1.0, std::fabs(logz)));
    EXPECT_NEAR(SummaryLogZ(shuffled), logz, 2e-5 * std::max(1.0, std::fabs(logz)));
    EXPECT_EQ(in_order.max_logit, static_cast<float>(m));
  }
}

// Slices whose maxima are far apart: the smaller one underflows to 0 cleanly.
TEST(SampleSummaryTest, LogSumExpWithDistantMaxima) {
  const SampleSummary a{0.0f, 1, 0.0f, 0.0f, 1.0f};        // log Z = 0
  const SampleSummary b{0.0f, 2, 0.0f, -1000.0f, 1.0f};    // log Z = -1000
  EXPECT_EQ(SummaryLogZ(MergeSummaries(a, b)), 0.0f);
  EXPECT_EQ(SummaryLogZ(MergeSummaries(b, a)), 0.0f);
  const SampleSummary c{0.0f, 3, 0.0f, 80.0f, 2.0f};       // log Z = 80 + log 2
  EXPECT_NEAR(SummaryLogZ(MergeSummaries(a, c)), 80.0 + std::log(2.0), 1e-5);
  // Equal maxima add.
  EXPECT_NEAR(SummaryLogZ(MergeSummaries(a, a)), std::log(2.0), 1e-7);
}

}  // namespace
}  // namespace flashsampler
