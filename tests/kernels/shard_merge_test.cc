// Tests of kernels/common/shard_merge.h: the merge of vocabulary shards'
// summaries (the host side of the multi-GPU sampler; the device merge kernel
// runs the same inline code). CPU only, so CI runs them.
//
// Shard summaries are built here as a shard of the GPU sampler builds them:
// noise keyed by the GLOBAL token id (GumbelNoise of the RNG contract), one
// SampleSummary over the shard's tokens. Then:
//  - kExact merges of any contiguous split (even, uneven, with empty shards)
//    give bit for bit the winner of the unsharded vocabulary, and log Z within
//    fp32 rounding;
//  - kGroupGumbel samples are exactly distributed as softmax(l / T)
//    (chi-square against float64, tests/common/goodness_of_fit.h), and so are
//    kExact samples;
//  - greedy rows ignore the mode; the shard-selection noise is not any
//    token's noise.
#include "kernels/common/shard_merge.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tests/common/goodness_of_fit.h"

namespace flashsampler {
namespace {

// The summary of global tokens [begin, end) of `logits` (raw logits, scaled
// here by LogitScale with one fp32 multiply as every backend does) for a row.
SampleSummary ShardSummary(const std::vector<float>& logits, int64_t begin, int64_t end,
                           const RowParams& p) {
  const float scale = LogitScale(p);
  SampleSummary s = EmptySampleSummary();
  float m = -INFINITY;
  for (int64_t i = begin; i < end; ++i) {
    const float l = logits[i] * scale;
    const float score = p.temperature > 0.0f
                            ? l + GumbelNoise(p.seed, p.offset, p.stream, static_cast<uint32_t>(i))
                            : l;
    if (ScoreBeats(score, static_cast<int32_t>(i), s.best_score, s.best_index)) {
      s.best_score = score;
      s.best_index = static_cast<int32_t>(i);
      s.best_logit = l;
    }
    m = std::max(m, l);
  }
  if (begin < end) {
    float sum = 0.0f;
    for (int64_t i = begin; i < end; ++i) sum += expf(logits[i] * scale - m);
    s.max_logit = m;
    s.sum_exp = sum;
  }
  return s;
}

// Summaries of the shards cut at `bounds` (bounds[0] = 0, bounds.back() = V).
std::vector<SampleSummary> ShardSummaries(const std::vector<float>& logits,
                                          const std::vector<int64_t>& bounds, const RowParams& p) {
  std::vector<SampleSummary> out;
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    out.push_back(ShardSummary(logits, bounds[k], bounds[k + 1], p));
  }
  return out;
}

SampleSummary Merge(const std::vector<SampleSummary>& shards, const RowParams& p,
                    ShardMergeMode mode) {
  return MergeShardSummaries(shards.data(), 1, static_cast<int32_t>(shards.size()), p, mode);
}

TEST(ShardMergeTest, ExactMergeIsPathwiseTheUnshardedSample) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  constexpr int64_t kV = 2000;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits(kV);
    for (float& l : logits) l = normal(rng);
    const RowParams p{trial % 5 == 0 ? 0.0f : 0.5f + 0.01f * trial, 1000u + trial,
                      static_cast<uint64_t>(trial), static_cast<uint32_t>(trial % 3)};
    const SampleSummary whole = ShardSummary(logits, 0, kV, p);

    // Splits: even halves, uneven (a multiple of 4, as the planner makes),
    // many random cuts, and one with empty shards.
    std::vector<std::vector<int64_t>> splits = {{0, kV / 2, kV}, {0, 128, kV}, {0, 1, 2, kV}};
    std::vector<int64_t> random_cuts = {0, kV};
    std::uniform_int_distribution<int64_t> cut(0, kV);
    for (int c = 0; c < 7; ++c) random_cuts.push_back(cut(rng));
    std::sort(random_cuts.begin(), random_cuts.end());
    splits.push_back(random_cuts);
    splits.push_back({0, 0, 700, 700, kV, kV});
    for (const auto& bounds : splits) {
      for (ShardMergeMode mode : {ShardMergeMode::kExact}) {
        const SampleSummary m = Merge(ShardSummaries(logits, bounds, p), p, mode);
        EXPECT_EQ(m.best_index, whole.best_index);
        EXPECT_EQ(m.best_score, whole.best_score);
        EXPECT_EQ(m.best_logit, whole.best_logit);
        // Different merge tree: log Z agrees to fp32 rounding.
        EXPECT_NEAR(SummaryLogZ(m), SummaryLogZ(whole),
                    1e-5 * std::max(1.0f, std::fabs(SummaryLogZ(whole))));
      }
    }
  }
}

TEST(ShardMergeTest, StrideReadsTheAllGatherLayout) {
  // [shard][row] with 3 rows: row 1's shards sit at 1, 4, 7.
  const RowParams p{1.0f, 5, 0, 0};
  std::vector<SampleSummary> gathered(9, SampleSummary{100.0f, 99, 0.0f, 0.0f, 1.0f});
  gathered[1] = SampleSummary{1.0f, 10, 0.5f, 0.5f, 1.0f};
  gathered[4] = SampleSummary{3.0f, 20, 0.5f, 0.5f, 1.0f};
  gathered[7] = SampleSummary{2.0f, 30, 0.5f, 0.5f, 1.0f};
  const SampleSummary m = MergeShardSummaries(gathered.data() + 1, 3, 3, p, ShardMergeMode::kExact);
  EXPECT_EQ(m.best_index, 20);
  EXPECT_NEAR(SummaryLogZ(m), 0.5 + std::log(3.0), 1e-6);
}

TEST(ShardMergeTest, GreedyRowsIgnoreTheMode) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(500);
  for (float& l : logits) l = normal(rng);
  const RowParams greedy{0.0f, 42, 3, 1};
  const auto shards = ShardSummaries(logits, {0, 100, 260, 500}, greedy);
  const SampleSummary exact = Merge(shards, greedy, ShardMergeMode::kExact);
  const SampleSummary grouped = Merge(shards, greedy, ShardMergeMode::kGroupGumbel);
  EXPECT_EQ(grouped.best_index, exact.best_index);
  EXPECT_EQ(grouped.best_score, exact.best_score);
  EXPECT_EQ(exact.best_index, std::max_element(logits.begin(), logits.end()) - logits.begin());
}

TEST(ShardMergeTest, GroupGumbelEmptyShardNeverWinsAndLogZIsUnchanged) {
  const RowParams p{1.0f, 9, 0, 0};
  std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f, -1.0f, 0.5f, 0.25f, 4.0f};
  for (uint64_t offset = 0; offset < 200; ++offset) {
    RowParams q = p;
    q.offset = offset;
    const auto shards = ShardSummaries(logits, {0, 0, 4, 4, 8}, q);  // shards 0 and 2 empty
    const SampleSummary g = Merge(shards, q, ShardMergeMode::kGroupGumbel);
    const SampleSummary e = Merge(shards, q, ShardMergeMode::kExact);
    ASSERT_GE(g.best_index, 0);
    EXPECT_TRUE(g.best_index == shards[1].best_index || g.best_index == shards[3].best_index);
    EXPECT_EQ(g.max_logit, e.max_logit);
    EXPECT_EQ(g.sum_exp, e.sum_exp);
  }
}

TEST(ShardMergeTest, ShardNoiseIsNotATokensNoise) {
  // The shard-selection words come from counter blocks no token id < 2^31 uses.
  const RowParams p{1.0f, 123, 4, 2};
  EXPECT_NE(ShardSelectionNoise(p, 0), GumbelNoise(p.seed, p.offset, p.stream, 0));
  EXPECT_EQ(ShardSelectionNoise(p, 3),
            GumbelNoise(p.seed, p.offset, p.stream, kShardNoiseIndexBase + 3));
  EXPECT_GT(kShardNoiseIndexBase, static_cast<uint32_t>(INT32_MAX));
}

// Both modes sample softmax(l / T) exactly. Logits are chosen so that every
// token has p >= 0.1 or p < 0.05 (the z-tested ones need N p / (1 - p) >=
// (6 / 0.02)^2, i.e. N >= 810k at p = 0.1), split into 3 uneven shards, with
// the heavy tokens spread over different shards so the shard choice matters.
// Each draw's shard summaries feed both modes (independent draws per mode
// would cost twice the time for no extra power).
TEST(ShardMergeTest, BothModesMatchFloat64Softmax) {
  constexpr int64_t kV = 24;
  std::vector<float> logits(kV, -1.0f);
  logits[2] = 2.6f;
  logits[9] = 2.2f;
  logits[10] = 1.9f;
  logits[20] = 2.4f;
  for (int i = 13; i < 19; ++i) logits[i] = -0.2f - 0.1f * (i - 13);
  const std::vector<int64_t> bounds = {0, 8, 12, kV};
  for (float temperature : {1.0f, 1.3f}) {
    const std::vector<double> probs =
        testing::SoftmaxOfScaled(logits, kV, LogitScale(RowParams{temperature, 0, 0, 0}));
    constexpr int64_t kSamples = 1'200'000;
    std::vector<int64_t> exact_counts(kV, 0), grouped_counts(kV, 0);
    for (int64_t n = 0; n < kSamples; ++n) {
      // Independent draws: one stream per sample, a few offsets.
      const RowParams p{temperature, 2026, static_cast<uint64_t>(n >> 20),
                        static_cast<uint32_t>(n & ((1 << 20) - 1))};
      const auto shards = ShardSummaries(logits, bounds, p);
      const SampleSummary e = Merge(shards, p, ShardMergeMode::kExact);
      const SampleSummary g = Merge(shards, p, ShardMergeMode::kGroupGumbel);
      ASSERT_GE(e.best_index, 0);
      ASSERT_GE(g.best_index, 0);
      ++exact_counts[e.best_index];
      ++grouped_counts[g.best_index];
    }
    SCOPED_TRACE(::testing::Message() << "temperature " << temperature);
    {
      SCOPED_TRACE("exact");
      EXPECT_GE(testing::ExpectCountsMatch(exact_counts, probs).z_tested, 4);
    }
    {
      SCOPED_TRACE("group_gumbel");
      EXPECT_GE(testing::ExpectCountsMatch(grouped_counts, probs).z_tested, 4);
    }
  }
}

// The two modes are different samplers: on a row where the modes differ, the
// group-Gumbel token is still its shard's own winner.
TEST(ShardMergeTest, GroupGumbelTakesTheChosenShardsWinner) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(300);
  for (float& l : logits) l = normal(rng);
  const std::vector<int64_t> bounds = {0, 100, 200, 300};
  int differ = 0;
  for (uint32_t stream = 0; stream < 500; ++stream) {
    const RowParams p{1.0f, 77, 0, stream};
    const auto shards = ShardSummaries(logits, bounds, p);
    const SampleSummary g = Merge(shards, p, ShardMergeMode::kGroupGumbel);
    const SampleSummary e = Merge(shards, p, ShardMergeMode::kExact);
    bool is_a_shard_winner = false;
    for (const auto& s : shards) is_a_shard_winner |= s.best_index == g.best_index;
    EXPECT_TRUE(is_a_shard_winner);
    differ += g.best_index != e.best_index;
  }
  // Both pick shard k with probability ~1/3 independently-ish: they differ often.
  EXPECT_GT(differ, 100);
}

}  // namespace
}  // namespace flashsampler
