// Tests of kernels/cuda/cuda_core_tiling.h, the CUDA-core stage 1's choice of
// 64- or 128-token tiles (pure host arithmetic, so it runs in CI). The shapes
// and the 264-block wave (2 blocks on each of 132 SMs) are those measured in
// BENCHMARKS.md ("64-token tiles for the CUDA-core stage 1"): 64 where it was
// measured faster, 128 where it was measured slower or equal.
#include "kernels/cuda/cuda_core_tiling.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace flashsampler::kernels
