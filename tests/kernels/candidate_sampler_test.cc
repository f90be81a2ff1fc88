// Tests of kernels/cpu/candidate_sampler.h: outcomes, that any superset of
// the top-k gives the result of the full candidate list, greedy rows, and the
// filters' edge rules (top_p keeps at least one token; top_p = 1 and
// min_p = 0 keep everything).
#include "kernels/cpu/candidate_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

namespace flashsampler::kernels {
namespace {

std::vector<Candidate> RandomCandidates(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<Candidate> c;
  for (int i = 0; i < n; ++i) c.push_back(Candidate{normal(rng), i});
  return c;
}

struct Out {
  int32_t token = -1;
  float logz = 0, logprob = 0;
  RowSampleDetail detail;
};

KernelStatus Finish(std::vector<Candidate> c, const RowParams& p, const RowControls& rc, Out* out,
                    const float* raw = nullptr, int64_t v = 0) {
  return SampleFromCandidates(&c, p, rc, raw, v, {&out->token, &out->logz, &out->logprob, &out->detail});
}

TEST(SampleFromCandidates, EmptyIsFailedPreconditionAndRawModeNeedsTheRow) {
  Out out;
  EXPECT_EQ(Finish({}, RowParams{}, RowControls{}, &out), KernelStatus::kFailedPrecondition);
  RowControls raw;
  raw.top_logprobs = 1;
  raw.logprobs_mode = LogprobsMode::kRaw;
  EXPECT_EQ(Finish(RandomCandidates(4, 1), RowParams{}, raw, &out), KernelStatus::kInvalidArgument);
}

// The fused path hands over the union of per-slice top-k lists, in any order.
TEST(SampleFromCandidates, AnySupersetOfTheTopKGivesTheSameResult) {
  const std::vector<Candidate> all = RandomCandidates(300, 2);
  for (int trial = 0; trial < 50; ++trial) {
    RowControls c;
    c.top_k = 1 + trial;
    c.top_p = trial % 2 ? 0.6f : 1.0f;
    c.min_p = trial % 3 ? 0.0f : 0.05f;
    c.top_logprobs = 4;
    c.num_samples = 3;
    const RowParams p{0.9f, 11u + trial, 3, 1};
    std::vector<Candidate> sorted = all;
    std::sort(sorted.begin(), sorted.end(), CandidateBefore);
    std::vector<Candidate> superset(sorted.begin(), sorted.begin() + std::min<size_t>(300, c.top_k + 17));
    std::shuffle(superset.begin(), superset.end(), std::mt19937(trial));
    Out full, part;
    ASSERT_EQ(Finish(all, p, c, &full), KernelStatus::kOk);
    ASSERT_EQ(Finish(superset, p, c, &part), KernelStatus::kOk);
    EXPECT_EQ(full.token, part.token);
    EXPECT_EQ(full.logz, part.logz);
    EXPECT_EQ(full.logprob, part.logprob);
    EXPECT_EQ(full.detail.token_ids, part.detail.token_ids);
    EXPECT_EQ(full.detail.ranks, part.detail.ranks);
  }
}

TEST(SampleFromCandidates, GreedyIsTheArgmaxWithLowerIdTiesForEverySample) {
  std::vector<Candidate> c = {{1.0f, 5}, {3.0f, 9}, {3.0f, 4}, {-2.0f, 1}};
  RowControls rc;
  rc.num_samples = 3;
  Out out;
  ASSERT_EQ(Finish(c, RowParams{0.0f, 1, 0, 0}, rc, &out), KernelStatus::kOk);
  EXPECT_EQ(out.token, 4);
  EXPECT_EQ(out.detail.token_ids, (std::vector<int32_t>{4, 4, 4}));
}

TEST(SampleFromCandidates, TinyTopPKeepsTheBestTokenAndNeutralFiltersKeepAll) {
  const std::vector<Candidate> c = RandomCandidates(50, 3);
  const int32_t best = std::min_element(c.begin(), c.end(), CandidateBefore)->id;
  RowControls tiny;
  tiny.top_p = 1e-6f;
  Out out;
  ASSERT_EQ(Finish(c, RowParams{1.0f, 4, 0, 0}, tiny, &out), KernelStatus::kOk);
  EXPECT_EQ(out.token, best);
  EXPECT_EQ(out.logprob, 0.0f);
  RowControls neutral;
  neutral.top_p = 1.0f;
  neutral.min_p = 0.0f;
  neutral.top_logprobs = 20;
  ASSERT_EQ(Finish(c, RowParams{1.0f, 4, 0, 0}, neutral, &out), KernelStatus::kOk);
  EXPECT_EQ(out.detail.top.size(), 20u);
  EXPECT_EQ(out.detail.top[0].token_id, best);
}

// Top-p over a large set (the materialized path without top_k) sorts only a
// growing head; its cut must be the one a full sort gives. Flat logits put
// thousands of tokens in the nucleus (the head grows several times), peaked
// ones a handful.
TEST(SampleFromCandidates, TopPOverALargeSetCutsWhereAFullSortDoes) {
  const std::pair<float, float> cases[] = {{0.5f, 0.3f}, {0.5f, 0.9f}, {0.5f, 0.999f}, {6.0f, 0.3f}, {6.0f, 0.9f}};
  for (const auto& [stddev, top_p] : cases) {
    {
      SCOPED_TRACE(::testing::Message() << "stddev " << stddev << " top_p " << top_p);
      std::mt19937 rng(static_cast<uint32_t>(stddev * 100 + top_p * 1000));
      std::normal_distribution<float> normal(0.0f, stddev);
      std::vector<Candidate> c;
      for (int i = 0; i < 20000; ++i) c.push_back(Candidate{normal(rng), i});
      // Reference cut: full canonical sort, float64 masses.
      std::vector<Candidate> sorted = c;
      std::sort(sorted.begin(), sorted.end(), CandidateOrder());
      double total = 0;
      for (const Candidate& x : sorted) total += std::exp(double{x.logit} - sorted[0].logit);
      double before = 0, kept_mass = 0;
      size_t keep = 0;
      while (keep < sorted.size() && before < top_p * total) {
        before += std::exp(double{sorted[keep].logit} - sorted[0].logit);
        ++keep;
      }
      kept_mass = before;
      std::vector<bool> kept(20000, false);
      for (size_t i = 0; i < keep; ++i) kept[sorted[i].id] = true;
      RowControls rc;
      rc.top_p = top_p;
      rc.num_samples = 64;
      rc.top_logprobs = 20;
      Out out;
      ASSERT_EQ(Finish(c, RowParams{1.0f, 5, 0, 0}, rc, &out), KernelStatus::kOk);
      // Flat inputs: one token more or less at the cut moves logz (~10) by
      // >= 1e-5 here, against fp32 rounding of 5e-7. Peaked inputs: the
      // nucleus fits the top-20 list, whose length then is the kept count.
      const double want_logz = sorted[0].logit + std::log(kept_mass);
      EXPECT_NEAR(out.logz, want_logz, 2e-6);
      if (stddev > 1.0f) {
        ASSERT_LE(keep, 20u);
      }
      for (int32_t t : out.detail.token_ids) EXPECT_TRUE(kept[t]) << t;
      ASSERT_EQ(out.detail.top.size(), std::min<size_t>(20, keep));
      for (size_t i = 0; i < out.detail.top.size(); ++i) EXPECT_EQ(out.detail.top[i].token_id, sorted[i].id);
    }
  }
}

// Draft tokens (speculative verification): log p(x) after the filters (-inf
// when a filter removed x), x never drawn by sampled rows (in any sample),
// greedy rows unchanged, and a kept set of x alone returns x with p(x) = 1.
TEST(SampleFromCandidates, DraftTokenIsExcludedFromSampledRowsAndScored) {
  const std::vector<Candidate> all = RandomCandidates(50, 9);
  std::vector<Candidate> sorted = all;
  std::sort(sorted.begin(), sorted.end(), CandidateBefore);
  const int32_t best = sorted[0].id, third = sorted[2].id, last = sorted.back().id;
  RowControls top3;
  top3.top_k = 3;
  top3.num_samples = 4;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const RowParams sampled{1.0f, seed, 0, 0};
    Out out;
    float draft_logprob = 0;
    std::vector<Candidate> c = all;
    ASSERT_EQ(SampleFromCandidates(&c, sampled, top3, nullptr, 0,
                                   {&out.token, &out.logz, &out.logprob, &out.detail, &draft_logprob},
                                   third),
              KernelStatus::kOk);
    EXPECT_NEAR(draft_logprob, sorted[2].logit - out.logz, 1e-5);
    for (int32_t t : out.detail.token_ids) EXPECT_NE(t, third);
    c = all;
    ASSERT_EQ(SampleFromCandidates(&c, sampled, top3, nullptr, 0,
                                   {&out.token, &out.logz, &out.logprob, &out.detail, &draft_logprob},
                                   last),
              KernelStatus::kOk);
    EXPECT_EQ(draft_logprob, -INFINITY);  // filtered out: p(x) = 0
  }
  Out out;
  float draft_logprob = 0;
  std::vector<Candidate> c = all;
  ASSERT_EQ(SampleFromCandidates(&c, RowParams{0.0f, 1, 0, 0}, RowControls{}, nullptr, 0,
                                 {&out.token, &out.logz, &out.logprob, nullptr, &draft_logprob}, best),
            KernelStatus::kOk);
  EXPECT_EQ(out.token, best);  // greedy: the argmax, the draft included
  std::vector<Candidate> one = {Candidate{1.5f, 7}};
  ASSERT_EQ(SampleFromCandidates(&one, RowParams{1.0f, 1, 0, 0}, RowControls{}, nullptr, 0,
                                 {&out.token, &out.logz, &out.logprob, nullptr, &draft_logprob}, 7),
            KernelStatus::kOk);
  EXPECT_EQ(out.token, 7);
  EXPECT_EQ(draft_logprob, 0.0f);
  c = all;  // a draft without a place for its log-probability
  EXPECT_EQ(SampleFromCandidates(&c, RowParams{}, RowControls{}, nullptr, 0,
                                 {&out.token, nullptr, nullptr, nullptr}, 3),
            KernelStatus::kInvalidArgument);
}

}  // namespace
}  // namespace flashsampler::kernels
