// Cuda-core tiling: how many tokens one block of the fused sampler's CUDA-core
// stage 1 (fused_sample.cu) scores, 64 or 128, chosen per head. Pure host
// arithmetic, so the choice is testable on the CPU.
//
// Why the choice exists. A stage-1 block is latency-bound: one wave of
// resident blocks just saturates DRAM, so the last, partial wave of a grid
// reads at the fraction of peak its blocks fill. With 128-token tiles a
// vocabulary shard of about 76k tokens at hidden_dim 4096 is 594 blocks =
// 2.25 waves of 264 on a 132-SM GPU, and its last quarter-wave costs a whole
// block time (BENCHMARKS.md, "the half-vocabulary kernel loses its last
// wave"). 64-token tiles halve the block time, so that tail halves too.
// They cost a second load of H into shared memory per 64 tokens and twice the
// tile summaries, which is what made them slower on small heads (hidden_dim
// 2048 and below, measured on an H100).
//
// The rule. 64 when (a) the grid of 128-token tiles ends in a last wave at
// most half full (finer tiles then fill their last wave strictly better;
// when more than half full they fill it exactly as well), and (b) a
// 64-token tile still streams at least 512 KiB of W (hidden_dim * element
// bytes >= 8 KiB), so the per-block fixed costs stay small. Else 128.
//
// Exactness. A token's dot product (lane k, then the butterfly) and its
// noise do not depend on the tile, and the best-score merge is exact, so the
// token is the same for either tile; only the log-sum-exp's merge tree
// changes, so log Z agrees to fp32 rounding. The choice depends on the head
// and the device only (resident blocks of the one-row kernel), never on the
// batch, so each launch path stays batch-invariant bit for bit.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashsampler::kernels {

inline constexpr int kCudaCoreLargeTile = 128;  // the tensor-core path's tile, too
inline constexpr int kCudaCoreSmallTile = 64;

// Tokens per CUDA-core stage-1 tile for a head of valid_vocab tokens of
// hidden_dim elements of elem_bytes each, on a device where
// `resident_blocks` one-row blocks run at once (blocks per SM times SMs;
// <= 0: unknown, then 128).
inline int CudaCoreTileTokens(int64_t valid_vocab, int64_t hidden_dim, size_t elem_bytes,
                              int64_t resident_blocks) {
  if (valid_vocab < 1 || resident_blocks <= 0) return kCudaCoreLargeTile;
  if (static_cast<int64_t>(elem_bytes) * hidden_dim < 8 * 1024) return kCudaCoreLargeTile;
  const int64_t tiles = (valid_vocab + kCudaCoreLargeTile - 1) / kCudaCoreLargeTile;
  const int64_t last_wave = tiles % resident_blocks;
  return last_wave != 0 && 2 * last_wave <= resident_blocks ? kCudaCoreSmallTile
                                                             : kCudaCoreLargeTile;
}

}  // namespace flashsampler::kernels
