// Tests of kernels/cuda/stage1_shape.h: the CUDA-core stage 1's choice of
// 64- or 128-token tiles, the tensor-core stage 1's pipeline depth at
// B <= 16 and the WGMMA stage 1's chunk layouts (pure host arithmetic, so
// they run in CI). The shapes and waves
// (132 SMs: 264 one-row CUDA-core blocks, 396 tensor-core blocks) are those
// measured in docs/benchmark-log.md ("64-token tiles for the CUDA-core stage 1",
// "a deeper tensor-core pipeline"): the rules pick what was measured faster.
#include "kernels/cuda/stage1_shape.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace flashsampler::kernels {
namespace {

constexpr int64_t kWave = 264;
constexpr size_t kBf16 = 2, kFp32 = 4;

TEST(CudaCoreTiling, SmallTilesWhereTheLastWaveIsAtMostHalfFull) {
  // 594 tiles = 2 waves + 66 blocks: 64-token tiles (measured 2-4% faster).
  EXPECT_EQ(CudaCoreTileTokens(76032, 4096, kBf16, kWave), kCudaCoreSmallTile);
  // 1188 tiles = 4 waves + 132 blocks, exactly half: small tiles.
  EXPECT_EQ(CudaCoreTileTokens(152064, 5120, kBf16, kWave), kCudaCoreSmallTile);
  // 1187 tiles = 4 waves + 131 blocks.
  EXPECT_EQ(CudaCoreTileTokens(151936, 4096, kBf16, kWave), kCudaCoreSmallTile);
}

TEST(CudaCoreTiling, LargeTilesWhereTheLastWaveIsMoreThanHalfFull) {
  EXPECT_EQ(CudaCoreTileTokens(128256, 4096, kBf16, kWave), kCudaCoreLargeTile);  // + 210
  EXPECT_EQ(CudaCoreTileTokens(64128, 8192, kBf16, kWave), kCudaCoreLargeTile);   // + 237
  EXPECT_EQ(CudaCoreTileTokens(32000, 8192, kBf16, kWave), kCudaCoreLargeTile);   // 250 < 1 wave
  EXPECT_EQ(CudaCoreTileTokens(256000, 8192, kBf16, kWave), kCudaCoreLargeTile);  // + 152
  // Whole waves: nothing to gain.
  EXPECT_EQ(CudaCoreTileTokens(2 * kWave * 128, 4096, kBf16, kWave), kCudaCoreLargeTile);
  // One block more than half a wave.
  EXPECT_EQ(CudaCoreTileTokens((kWave / 2 + 1) * 128, 4096, kBf16, kWave), kCudaCoreLargeTile);
  EXPECT_EQ(CudaCoreTileTokens((kWave / 2) * 128, 4096, kBf16, kWave), kCudaCoreSmallTile);
}

TEST(CudaCoreTiling, LargeTilesForShortRows) {
  // A 64-token tile must stream >= 512 KiB of W: hidden_dim * element bytes
  // >= 8 KiB. 50304 tokens at 2048 (393 tiles, a half-empty last wave) were
  // measured 2% slower with small tiles.
  EXPECT_EQ(CudaCoreTileTokens(50304, 2048, kBf16, kWave), kCudaCoreLargeTile);
  EXPECT_EQ(CudaCoreTileTokens(76032, 4095, kBf16, kWave), kCudaCoreLargeTile);
  // fp32 weights reach 8 KiB at hidden_dim 2048.
  EXPECT_EQ(CudaCoreTileTokens(50304, 2048, kFp32, kWave), kCudaCoreSmallTile);
}

TEST(CudaCoreTiling, UnknownDeviceOrEmptyHeadKeepsLargeTiles) {
  EXPECT_EQ(CudaCoreTileTokens(76032, 4096, kBf16, 0), kCudaCoreLargeTile);
  EXPECT_EQ(CudaCoreTileTokens(76032, 4096, kBf16, -1), kCudaCoreLargeTile);
  EXPECT_EQ(CudaCoreTileTokens(0, 4096, kBf16, kWave), kCudaCoreLargeTile);
}

constexpr int64_t kSms = 132;

TEST(MmaDeepPipeline, DeepWhereTheLastWaveIsAtMostAThirdFullOnLongRows) {
  EXPECT_TRUE(MmaDeepPipeline(501, 8192, kSms));   // 8192 x 64128: + 105 of 396, measured 3% faster
  EXPECT_TRUE(MmaDeepPipeline(505, 7168, kSms));   // 7168 x 64640: + 109, 2.5% faster
  EXPECT_TRUE(MmaDeepPipeline(2000, 8192, kSms));  // 8192 x 256000: + 20, equal
  EXPECT_TRUE(MmaDeepPipeline(132, 7168, kSms));   // exactly a third
}

TEST(MmaDeepPipeline, ShallowElsewhere) {
  EXPECT_FALSE(MmaDeepPipeline(594, 8192, kSms));   // 8192 x 76032: + 198, 1% slower deep
  EXPECT_FALSE(MmaDeepPipeline(1002, 8192, kSms));  // 8192 x 128256: + 210
  EXPECT_FALSE(MmaDeepPipeline(250, 8192, kSms));   // 8192 x 32000: 250 of one wave
  EXPECT_FALSE(MmaDeepPipeline(133, 7168, kSms));   // one block past a third
  EXPECT_FALSE(MmaDeepPipeline(792, 8192, kSms));   // whole waves
  EXPECT_FALSE(MmaDeepPipeline(501, 6144, kSms));   // short rows: 5120, 6144 never gained deep
  EXPECT_FALSE(MmaDeepPipeline(501, 8192, 0));      // unknown device
  EXPECT_FALSE(MmaDeepPipeline(0, 8192, kSms));
}

// The WGMMA stage 1's chunk layouts, for every batch a launch can have up
// to 4096 rows and both box sizes: the chunks hold every row once, in
// order, each within its box; balanced chunks differ by at most one row
// (the last may be the short one); and the scratch the workspace sizes
// (RoundedHiddenRows) holds every box. The kernels rely on all of it
// (fused_sample_sm90.cu: RowsOfChunk, LaunchTiles).
TEST(HiddenChunks, EveryRowOnceInsideItsBoxAndTheScratch) {
  for (const int64_t box : {int64_t{128}, int64_t{256}}) {
    for (const bool persistent : {false, true}) {
      for (int64_t batch = 1; batch <= 4096; ++batch) {
        SCOPED_TRACE(::testing::Message() << "box " << box << (persistent ? " balanced" : " padded")
                                          << ", batch " << batch);
        const HiddenChunks c = WgmmaHiddenChunks(batch, box, persistent);
        ASSERT_GE(c.chunk_rows, 1);
        ASSERT_LE(c.chunk_rows, c.block_rows);
        ASSERT_LE(c.rows_filled(), RoundedHiddenRows(batch));
        if (batch <= box) {
          EXPECT_EQ(c.num_chunks, 1);
          EXPECT_EQ(c.block_rows, batch);
          EXPECT_EQ(c.chunk_rows, batch);
          continue;
        }
        EXPECT_EQ(c.block_rows, box);
        EXPECT_EQ(c.num_chunks, (batch + box - 1) / box);
        // Chunk k holds rows [k * chunk_rows, min(+ chunk_rows, batch)),
        // placed from row k * box of the scratch.
        int64_t covered = 0;
        for (int64_t k = 0; k < c.num_chunks; ++k) {
          const int64_t first = k * c.chunk_rows;
          const int64_t end = std::min(first + c.chunk_rows, batch);
          ASSERT_LT(first, end) << "chunk " << k << " is empty";
          ASSERT_EQ(first, covered);
          ASSERT_LE(k * box + (end - first), c.rows_filled());
          covered = end;
        }
        EXPECT_EQ(covered, batch);
        if (persistent) {
          // Every chunk but the last holds chunk_rows; the last at most
          // num_chunks - 1 fewer.
          EXPECT_LE(c.chunk_rows * c.num_chunks - batch, c.num_chunks - 1);
        } else {
          EXPECT_EQ(c.chunk_rows, box);
        }
      }
    }
  }
  // The separate-epilogue schedule's own box (WgmmaSeparateBox): the same
  // checks, and the box is the one the measurements chose.
  for (int64_t batch = 1; batch <= 4096; ++batch) {
    SCOPED_TRACE(::testing::Message() << "separate-epilogue box, batch " << batch);
    const int64_t box = WgmmaSeparateBox(batch);
    const bool box96 = (batch >= 65 && batch <= 96) || (batch >= 129 && batch <= 192);
    ASSERT_EQ(box, box96 ? 96 : 128);
    const HiddenChunks c = WgmmaHiddenChunks(batch, box, /*persistent=*/true);
    ASSERT_LE(c.chunk_rows, c.block_rows);
    ASSERT_LE(c.chunk_rows, box);
    ASSERT_LE(c.rows_filled(), RoundedHiddenRows(batch));
    ASSERT_EQ(c.num_chunks, batch <= box ? 1 : (batch + box - 1) / box);
    if (c.num_chunks > 1) {
      ASSERT_LT((c.num_chunks - 1) * c.chunk_rows, batch);  // the last chunk holds a row
      ASSERT_GE(c.num_chunks * c.chunk_rows, batch);        // every row is in a chunk
    }
  }
  // Two examples from the measurements: 160 rows as 2 x 80, 300 as 3 x 100.
  EXPECT_EQ(WgmmaHiddenChunks(160, 128, true).chunk_rows, 80);
  EXPECT_EQ(WgmmaHiddenChunks(300, 128, true).chunk_rows, 100);
  EXPECT_EQ(WgmmaHiddenChunks(160, 128, false).chunk_rows, 128);
  EXPECT_EQ(WgmmaHiddenChunks(300, 256, true).chunk_rows, 150);
  EXPECT_EQ(WgmmaHiddenChunks(160, WgmmaSeparateBox(160), true).chunk_rows, 80);
  EXPECT_EQ(WgmmaHiddenChunks(160, WgmmaSeparateBox(160), true).rows_filled(), 192);
}

}  // namespace
}  // namespace flashsampler::kernels
