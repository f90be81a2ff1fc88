// Tests of kernels/cpu/candidate_sampler.h: outcomes, that any superset of
// the top-k gives the result of the full candidate list, greedy rows, and the
// filters' edge rules (top_p keeps at least one token; top_p = 1 and
// min_p = 0 keep everything).
#include "kernels/cpu/candidate_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
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

}  // namespace
}  // namespace flashsampler::kernels
