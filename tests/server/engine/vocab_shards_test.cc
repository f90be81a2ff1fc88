// Tests of server/engine/vocab_shards.h: the contiguous, tile-aligned vocabulary
// split of the sharded CUDA engine.
#include "server/engine/vocab_shards.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace flashsampler {
namespace {

// Shards cover [0, valid_vocab) in order, without gaps, aligned, non-empty.
void ExpectPartition(const std::vector<VocabShard>& shards, int64_t valid_vocab,
                     const std::vector<int>& devices) {
  ASSERT_EQ(shards.size(), devices.size());
  int64_t next = 0;
  for (size_t k = 0; k < shards.size(); ++k) {
    EXPECT_EQ(shards[k].device, devices[k]);
    EXPECT_EQ(shards[k].begin, next);
    EXPECT_EQ(shards[k].begin % kShardAlignment, 0);
    EXPECT_GT(shards[k].end, shards[k].begin);
    if (k + 1 < shards.size()) {
      EXPECT_EQ(shards[k].end % kShardAlignment, 0);
    }
    next = shards[k].end;
  }
  EXPECT_EQ(next, valid_vocab);
}

TEST(VocabShardsTest, EvenSplitsOfTheIssueShapes) {
  for (int64_t v : {int64_t{128256}, int64_t{151936}, int64_t{32000}, int64_t{400}}) {
    for (const std::vector<int>& devices : {std::vector<int>{0}, std::vector<int>{0, 1},
                                            std::vector<int>{3, 1, 2}}) {
      auto shards = PlanVocabShards(v, devices, {});
      ASSERT_TRUE(shards.ok()) << shards.status();
      ExpectPartition(*shards, v, devices);
      // Even: tile counts differ by at most one.
      const int64_t tiles0 = (shards->front().end - shards->front().begin + 127) / 128;
      for (const VocabShard& s : *shards) {
        EXPECT_LE(std::abs((s.end - s.begin + 127) / 128 - tiles0), 1);
      }
    }
  }
  // 151936 = 1187 tiles: 594 + 593.
  auto two = PlanVocabShards(151936, {0, 1}, {});
  ASSERT_TRUE(two.ok());
  EXPECT_EQ((*two)[0].end, 594 * 128);
}

TEST(VocabShardsTest, WeightedUnevenSplit) {
  auto shards = PlanVocabShards(128000, {0, 1}, {1.0, 3.0});  // 1000 tiles
  ASSERT_TRUE(shards.ok()) << shards.status();
  ExpectPartition(*shards, 128000, {0, 1});
  EXPECT_EQ((*shards)[0].end, 250 * 128);
  // Extreme weights still leave every shard a tile.
  auto tiny = PlanVocabShards(1000, {0, 1, 2}, {1e-9, 1.0, 1e-9});
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  ExpectPartition(*tiny, 1000, {0, 1, 2});
}

TEST(VocabShardsTest, Refusals) {
  EXPECT_FALSE(PlanVocabShards(1000, {}, {}).ok());
  EXPECT_FALSE(PlanVocabShards(1000, {0, 0}, {}).ok());
  EXPECT_FALSE(PlanVocabShards(1000, {-1}, {}).ok());
  EXPECT_FALSE(PlanVocabShards(1000, {0, 1}, {1.0}).ok());
  EXPECT_FALSE(PlanVocabShards(1000, {0, 1}, {1.0, 0.0}).ok());
  EXPECT_FALSE(PlanVocabShards(128, {0, 1}, {}).ok());  // one tile, two devices
  EXPECT_TRUE(PlanVocabShards(129, {0, 1}, {}).ok());   // 128 + 1
  EXPECT_FALSE(PlanVocabShards(0, {0}, {}).ok());
}

}  // namespace
}  // namespace flashsampler
