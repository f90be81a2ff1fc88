// Tests of kernels/common/tile_partition.h: how stage 1's blocks cut the
// vocabulary tiles, and that every cut yields the same tile summaries. CPU
// only, so CI runs them; the GPU kernels run the same inline functions (their
// tests compare forced cuts on the device: tests/gpu/fused_sample_test.cc).
//
//  - the parts of a cut tile the units exactly once, in order, with lengths
//    that differ by at most one unit and never fall below a tile;
//  - SplitBoundaryOf and WindowOf agree with a brute-force scan of the
//    boundaries, for many (tiles, parts);
//  - a host model of stage 1 (whole windows write the tile, split windows
//    write their units by boundary) and stage 2 (split tiles merged from
//    their units) gives, for every cut, the tile summaries of one block per
//    tile bit for bit, logz rounding included;
//  - ChooseTileParts takes the balanced cut exactly when one wave of parts
//    keeps more of the GPU busy than ceil(waves) of whole tiles.
#include "kernels/common/tile_partition.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace flashsampler {
namespace {

TEST(TilePartitionTest, PartsCoverEveryUnitOnceWithNearlyEqualLengths) {
  for (int64_t tiles : {1, 2, 7, 33, 594, 1187}) {
    for (int64_t parts : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{13}, int64_t{264},
                          int64_t{396}, tiles}) {
      if (parts > tiles) continue;
      const TilePartition p{tiles, parts, nullptr};
      EXPECT_EQ(PartFirstUnit(p, 0), 0);
      EXPECT_EQ(PartFirstUnit(p, parts), kTileUnits * tiles);
      int64_t shortest = INT64_MAX, longest = 0;
      for (int64_t k = 0; k < parts; ++k) {
        const int64_t len = PartFirstUnit(p, k + 1) - PartFirstUnit(p, k);
        shortest = std::min(shortest, len);
        longest = std::max(longest, len);
      }
      EXPECT_GE(shortest, kTileUnits) << tiles << " tiles, " << parts << " parts";
      EXPECT_LE(longest - shortest, 1) << tiles << " tiles, " << parts << " parts";
    }
  }
}

TEST(TilePartitionTest, OneBlockPerTileSplitsNothing) {
  const TilePartition p = WholeTilePartition(1187);
  for (int64_t t = 0; t < 1187; ++t) {
    EXPECT_EQ(PartFirstUnit(p, t), kTileUnits * t);
    EXPECT_EQ(SplitBoundaryOf(p, t), 0);
    EXPECT_TRUE(WindowOf(p, t, t).whole());
  }
}

TEST(TilePartitionTest, SplitTilesAndWindowsMatchABruteForceScan) {
  for (int64_t tiles = 1; tiles <= 80; ++tiles) {
    for (int64_t parts = 1; parts <= tiles; ++parts) {
      const TilePartition p{tiles, parts, nullptr};
      // Brute force: the boundary strictly inside each tile, if any.
      std::vector<int64_t> inside(static_cast<size_t>(tiles), 0);
      for (int64_t b = 1; b < parts; ++b) {
        const int64_t u = PartFirstUnit(p, b);
        if (u % kTileUnits != 0) {
          ASSERT_EQ(inside[static_cast<size_t>(u / kTileUnits)], 0) << "two boundaries in a tile";
          inside[static_cast<size_t>(u / kTileUnits)] = b;
        }
      }
      // Every (part, tile) window: its units, and whole windows only where no
      // boundary falls; the units of each tile are covered exactly once.
      std::vector<int> covered(static_cast<size_t>(kTileUnits * tiles), 0);
      for (int64_t k = 0; k < parts; ++k) {
        const int64_t first = PartFirstUnit(p, k), end = PartFirstUnit(p, k + 1);
        for (int64_t t = first / kTileUnits; t <= (end - 1) / kTileUnits; ++t) {
          const TileWindow w = WindowOf(p, k, t);
          ASSERT_LT(w.lo, w.hi);
          for (int u = w.lo; u < w.hi; ++u) {
            const int64_t unit = kTileUnits * t + u;
            EXPECT_TRUE(unit >= first && unit < end);
            ++covered[static_cast<size_t>(unit)];
          }
          EXPECT_EQ(w.whole(), inside[static_cast<size_t>(t)] == 0);
          EXPECT_EQ(w.boundary, inside[static_cast<size_t>(t)]);
        }
      }
      for (int c : covered) ASSERT_EQ(c, 1) << tiles << " tiles, " << parts << " parts";
      for (int64_t t = 0; t < tiles; ++t) {
        EXPECT_EQ(SplitBoundaryOf(p, t), inside[static_cast<size_t>(t)])
            << "tile " << t << " of " << tiles << ", " << parts << " parts";
      }
    }
  }
}

// A unit's summary of 16 random logits with Gumbel-like scores (the values
// only need to differ and carry a log-sum-exp).
SampleSummary RandomUnit(std::mt19937& rng, int32_t first_token) {
  std::normal_distribution<float> logit(0.0f, 3.0f);
  std::uniform_real_distribution<float> noise(-2.0f, 6.0f);
  SampleSummary s = EmptySampleSummary();
  for (int32_t i = 0; i < kUnitTokens; ++i) {
    const float l = logit(rng);
    SampleSummary one{l + noise(rng), first_token + i, l, l, 1.0f};
    s = MergeSummaries(s, one);
  }
  return s;
}

bool SameBits(const SampleSummary& a, const SampleSummary& b) {
  return std::memcmp(&a, &b, sizeof(SampleSummary)) == 0;
}

TEST(TilePartitionTest, EveryCutGivesTheTileSummariesOfOneBlockPerTile) {
  std::mt19937 rng(7);
  constexpr int64_t kRows = 3;
  for (int64_t tiles : {9, 40, 131}) {
    // units[row][unit]: what any block computes for that unit.
    std::vector<SampleSummary> units(static_cast<size_t>(kRows * kTileUnits * tiles));
    for (int64_t i = 0; i < static_cast<int64_t>(units.size()); ++i) {
      units[static_cast<size_t>(i)] =
          RandomUnit(rng, static_cast<int32_t>((i % (kTileUnits * tiles)) * kUnitTokens));
    }
    auto unit_of = [&](int64_t row, int64_t unit) {
      return units[static_cast<size_t>(row * kTileUnits * tiles + unit)];
    };
    // Stage 2 of a row: tiles merged in order (the order's shape does not
    // matter here: it is the same for every cut).
    auto stage2 = [&](const TilePartition& p, const std::vector<SampleSummary>& tile_out,
                      int64_t row) {
      SampleSummary s = EmptySampleSummary();
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t b = SplitBoundaryOf(p, t);
        const SampleSummary tile =
            b == 0 ? tile_out[static_cast<size_t>(row * tiles + t)] : MergeTileUnits([&](int u) {
              return p.split_units[SplitUnitIndex(p, row, b, u)];
            });
        s = MergeSummaries(s, tile);
      }
      return s;
    };
    // Stage 1 of a cut: each (part, tile) window writes what the kernels write.
    auto run = [&](int64_t parts, std::vector<SampleSummary>* split_storage) {
      split_storage->assign(static_cast<size_t>(kRows * kMaxTileParts * kTileUnits),
                            SampleSummary{NAN, -7, NAN, NAN, NAN});  // poison
      TilePartition p{tiles, parts, split_storage->data()};
      std::vector<SampleSummary> tile_out(static_cast<size_t>(kRows * tiles),
                                          SampleSummary{NAN, -7, NAN, NAN, NAN});
      for (int64_t k = 0; k < parts; ++k) {
        const int64_t first = PartFirstUnit(p, k), end = PartFirstUnit(p, k + 1);
        for (int64_t t = first / kTileUnits; t <= (end - 1) / kTileUnits; ++t) {
          const TileWindow w = WindowOf(p, k, t);
          for (int64_t row = 0; row < kRows; ++row) {
            if (w.whole()) {
              tile_out[static_cast<size_t>(row * tiles + t)] =
                  MergeTileUnits([&](int u) { return unit_of(row, kTileUnits * t + u); });
            } else {
              for (int u = w.lo; u < w.hi; ++u) {
                p.split_units[SplitUnitIndex(p, row, w.boundary, u)] =
                    unit_of(row, kTileUnits * t + u);
              }
            }
          }
        }
      }
      std::vector<SampleSummary> rows;
      for (int64_t row = 0; row < kRows; ++row) rows.push_back(stage2(p, tile_out, row));
      return rows;
    };
    std::vector<SampleSummary> storage;
    const std::vector<SampleSummary> reference = run(tiles, &storage);
    for (int64_t parts = 1; parts < tiles; ++parts) {
      const std::vector<SampleSummary> got = run(parts, &storage);
      for (int64_t row = 0; row < kRows; ++row) {
        ASSERT_TRUE(SameBits(got[static_cast<size_t>(row)], reference[static_cast<size_t>(row)]))
            << tiles << " tiles, " << parts << " parts, row " << row;
        ASSERT_GE(got[static_cast<size_t>(row)].best_index, 0);
      }
    }
  }
}

TEST(TilePartitionTest, MergeTileUnitsIsTheBalancedTreeInTokenOrder) {
  std::mt19937 rng(11);
  SampleSummary u[kTileUnits];
  for (int i = 0; i < kTileUnits; ++i) u[i] = RandomUnit(rng, i * static_cast<int32_t>(kUnitTokens));
  const SampleSummary want =
      MergeSummaries(MergeSummaries(MergeSummaries(u[0], u[1]), MergeSummaries(u[2], u[3])),
                     MergeSummaries(MergeSummaries(u[4], u[5]), MergeSummaries(u[6], u[7])));
  EXPECT_TRUE(SameBits(MergeTileUnits([&](int i) { return u[i]; }), want));
  // The GPU epilogue's butterfly over lanes (1, 2 within a unit, then 4, 8,
  // 16) relies on the merge being commutative bit for bit.
  for (int i = 0; i + 1 < kTileUnits; ++i) {
    EXPECT_TRUE(SameBits(MergeSummaries(u[i], u[i + 1]), MergeSummaries(u[i + 1], u[i])));
  }
}

TEST(TilePartitionTest, ChooseTilePartsPrefersTheCutThatKeepsMoreSmsBusy) {
  // A 132-SM GPU with 2 resident blocks per SM (the CUDA-core kernel) and 3
  // (the 8- and 16-row tensor-core kernels).
  EXPECT_EQ(ChooseTileParts(594, 1, 264), 264);    // half vocabulary: 2.25 waves
  EXPECT_EQ(ChooseTileParts(594, 1, 396), 396);    // 1.5 waves
  EXPECT_EQ(ChooseTileParts(1187, 1, 264), 264);   // 4.5 waves: 90% busy vs 100%
  EXPECT_EQ(ChooseTileParts(528, 1, 264), 528);    // exactly 2 waves: a tie keeps whole tiles
  EXPECT_EQ(ChooseTileParts(32, 1, 264), 32);      // fewer tiles than blocks
  EXPECT_EQ(ChooseTileParts(1187, 2, 264), 132);   // two row chunks share the GPU
  EXPECT_EQ(ChooseTileParts(1187, 300, 264), 1187);  // more chunks than resident blocks
  // 1187 tiles x 100 chunks = 449.6 waves (99.9% busy) beats 2 x 100 / 264 (76%).
  EXPECT_EQ(ChooseTileParts(1187, 100, 264), 1187);
  // A GPU of 600 resident blocks: 700 tiles are 58% busy in 2 waves, 512
  // parts (capped by the scratch) 85% in one.
  EXPECT_EQ(ChooseTileParts(700, 1, 600), kMaxTileParts);
  EXPECT_EQ(ChooseTileParts(100000, 1, 2000), 100000);  // 50 whole waves: nothing to gain
  EXPECT_EQ(ChooseTileParts(0, 1, 264), 0);
  EXPECT_EQ(ChooseTileParts(594, 1, 0), 594);
}

TEST(TilePartitionTest, SplitUnitScratchHoldsTheLargestCut) {
  const TilePartition p{100000, kMaxTileParts, nullptr};
  const int64_t rows = 5;
  EXPECT_EQ(SplitUnitIndex(p, rows - 1, kMaxTileParts - 1, kTileUnits - 1) + 1,
            SplitUnitBytes(rows) / static_cast<int64_t>(sizeof(SampleSummary)));
}

}  // namespace
}  // namespace flashsampler
