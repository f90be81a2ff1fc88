// Stage-1 shapes: the launch-shape choices the fused sampler's stage 1
// makes (fused_sample.cu, fused_sample_mma.cu, fused_sample_sm90.cu). Pure
// host arithmetic, so every rule is testable on the CPU. None changes any
// token's arithmetic, so none changes a token.
//
// The first two exist for one reason. A stage-1 block is latency-bound: one wave of
// resident blocks just saturates DRAM, so the last, partial wave of a grid
// reads at the fraction of peak its blocks fill. A vocabulary shard of about
// 76k tokens at hidden_dim 4096 is 594 blocks of 128 tokens: 2.25 waves of
// 264 on the CUDA cores, 1.5 waves of 396 on the tensor cores at B <= 16
// (docs/benchmark-log.md, "the half-vocabulary kernel loses its last wave").
//
// 1. CUDA-core tile: 64 or 128 tokens per block (CudaCoreTileTokens).
// A block's bytes in flight do not depend on its tile (each warp streams 4 W
// rows at a time), so 64-token tiles halve the block time, and the tail with
// it. They cost a second load of H into shared memory per 64 tokens and twice
// the tile summaries, which made them slower on small heads (hidden_dim 2048
// and below, measured on an H100).
// The rule: 64 when (a) the grid of 128-token tiles ends in a last wave at
// most half full (finer tiles then fill their last wave strictly better;
// when more than half full they fill it exactly as well), and (b) a 64-token
// tile still streams at least 512 KiB of W (hidden_dim * element bytes >=
// 8 KiB), so the per-block fixed costs stay small. Else 128.
// Exactness: a token's dot product (lane k, then the butterfly) and its noise
// do not depend on the tile, and the best-score merge is exact, so the token
// is the same for either tile; only the log-sum-exp's merge tree changes, so
// log Z agrees to fp32 rounding. The choice depends on the head and the
// device only (resident blocks of the one-row kernel), never on the batch,
// so each launch path stays batch-invariant bit for bit.
//
// 2. Tensor-core pipeline at B <= 16 (MmaDeepPipeline): 3 blocks per SM with
// one 32 KB K step in flight each (the default), or 1 block per SM with three
// steps in flight. The same bytes in flight per SM, in waves a third the
// size, so a grid that would end in a nearly empty wave of 3-per-SM blocks
// fills its last wave far better. A lone block's epilogue is no longer
// hidden behind another block's main loop, which made the deep pipeline 1%
// slower where the last wave was half full or more, and on rows of 6144 and
// less (measured on an H100). The rule: deep when the 3-per-SM grid's last
// wave is at most a third full and hidden_dim >= 7168.
// Exactness: the stages only change when W arrives, not the mma sequence, so
// every output is bit-identical either way.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashsampler::kernels {

inline constexpr int kCudaCoreLargeTile = 128;  // the tensor-core path's tile, too
inline constexpr int kCudaCoreSmallTile = 64;
// Condition (b): bytes of one W row a 64-token tile needs at least.
inline constexpr int64_t kCudaCoreSmallTileMinRowBytes = 8 * 1024;

// Tokens per CUDA-core stage-1 tile for a head of valid_vocab tokens of
// hidden_dim elements of elem_bytes each, on a device where
// `resident_blocks` one-row blocks run at once (blocks per SM times SMs;
// <= 0: unknown, then 128).
inline int CudaCoreTileTokens(int64_t valid_vocab, int64_t hidden_dim, size_t elem_bytes,
                              int64_t resident_blocks) {
  if (valid_vocab < 1 || resident_blocks <= 0) return kCudaCoreLargeTile;
  if (static_cast<int64_t>(elem_bytes) * hidden_dim < kCudaCoreSmallTileMinRowBytes) {
    return kCudaCoreLargeTile;
  }
  const int64_t tiles = (valid_vocab + kCudaCoreLargeTile - 1) / kCudaCoreLargeTile;
  const int64_t last_wave = tiles % resident_blocks;
  return last_wave != 0 && 2 * last_wave <= resident_blocks ? kCudaCoreSmallTile
                                                             : kCudaCoreLargeTile;
}

// True when the tensor-core stage 1 at B <= 16 should run 1 block per SM
// with three K steps in flight rather than 3 blocks with one each: a grid of
// `tiles` 128-token tiles (times row chunks: 1 at B <= 16) on `sms` SMs whose
// 3-per-SM last wave is at most a third full, and rows of at least 7168
// elements. sms <= 0 (unknown): false.
inline constexpr int64_t kMmaDeepMinHidden = 7168;
inline bool MmaDeepPipeline(int64_t tiles, int64_t hidden_dim, int64_t sms) {
  if (tiles < 1 || sms <= 0 || hidden_dim < kMmaDeepMinHidden) return false;
  const int64_t wave = 3 * sms;
  const int64_t last_wave = tiles % wave;
  return last_wave != 0 && 3 * last_wave <= wave;
}

// 3. How the tensor-core stage 1's rounding kernel (LaunchRoundHidden,
// fused_sample_mma.cuh) lays the batch's rows out in its scratch. The
// WGMMA stage 1 loads H in boxes of block_rows rows, one box per chunk of
// the batch. Above one box the batch is cut into num_chunks chunks of
// chunk_rows rows (the last may hold fewer), chunk c's rows placed at rows
// [c * block_rows, + chunk_rows) of hidden_rounded and zeros after them, so
// that every box lies inside the scratch: a box running past the batch's
// end made 160-192 rows 14-20% slower (NOTES-fused.md, v25).
// - Padded: chunk_rows = block_rows, the last chunk short (rows past the
//   batch are zeros); for the schedules of one block per item.
// - Balanced: about as many rows in every chunk. For the persistent
//   schedules, whose blocks keep one chunk of each tile: blocks that fold a
//   small last chunk ran ahead of their tiles' other chunks and read W from
//   DRAM again (10-20% at D = 8192, 160-320 rows); balanced, they keep pace.
// - Identity (one chunk, block_rows = chunk_rows = batch): row r at row r,
//   as the mma.sync stage 1 and the logits epilogue read it.
struct HiddenChunks {
  int64_t block_rows = 0;
  int64_t chunk_rows = 0;
  int64_t num_chunks = 1;

  static HiddenChunks Identity(int64_t batch) { return {batch, batch, 1}; }
  // batch > block_rows for both.
  static HiddenChunks Padded(int64_t batch, int64_t block_rows) {
    return {block_rows, block_rows, (batch + block_rows - 1) / block_rows};
  }
  static HiddenChunks Balanced(int64_t batch, int64_t block_rows) {
    const int64_t n = (batch + block_rows - 1) / block_rows;
    return {block_rows, (batch + n - 1) / n, n};
  }
  int64_t rows_filled() const { return num_chunks * block_rows; }
};

// Rows of the rounded-H scratch a launch of `batch` rows needs: the batch up
// to 128 rows; above, whole 256-row blocks, which hold the chunks of every
// layout the WGMMA stage 1 takes (128- and 256-row boxes).
inline int64_t RoundedHiddenRows(int64_t batch) {
  return batch <= 128 ? batch : (batch + 255) / 256 * 256;
}

// The layout the WGMMA stage 1 takes for `batch` rows in boxes of `box`
// rows (128, or 256 for the one-block-per-SM schedule above 128 rows):
// identity within one box, else balanced chunks for the persistent
// schedules and padded ones for one block per item.
inline HiddenChunks WgmmaHiddenChunks(int64_t batch, int64_t box, bool persistent) {
  if (batch <= box) return HiddenChunks::Identity(batch);
  return persistent ? HiddenChunks::Balanced(batch, box) : HiddenChunks::Padded(batch, box);
}

// 4. The H box of the WGMMA stage 1 with separate epilogue warps
// (fused_sample_sm90.cu: LaunchWgmmaStage1 lays H out for it, LaunchForBatch
// takes the configuration of that many rows above 64 rows): 96 rows where a
// chunk of the batch holds at most 96 (65-96 rows in one chunk, 129-192 in
// two balanced ones), else 128 (up to 64 rows the 32- and 64-row
// configurations take the batch in one identity chunk, whichever box). 96-row
// boxes took 10-25% off those batches on an H200 (NOTES-fused.md, v28).
inline int64_t WgmmaSeparateBox(int64_t batch) {
  if (batch <= 64 || batch > 256) return 128;
  const int64_t chunk = batch <= 128 ? batch : (batch + 1) / 2;
  return chunk <= 96 ? 96 : 128;
}

}  // namespace flashsampler::kernels
