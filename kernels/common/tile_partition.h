// TilePartition: how the blocks of the GPU samplers' stage 1 share one row
// chunk's vocabulary tiles, and the one merge tree that makes the cut invisible.
//
// The concept. Stage 1 (kernels/cuda/fused_sample.cu, fused_sample_mma.cu)
// writes one SampleSummary per (row, tile) of kTileTokens = 128 tokens, and
// stage 2 merges a row's tiles in a fixed order. A tile is kTileUnits = 8
// units of kUnitTokens = 16 tokens, and a tile's summary is ALWAYS
// MergeTileUnits over its 8 unit summaries, a balanced tree in token order,
// whichever block computed which unit. So the tokens, and log Z to the last
// bit, are the same however the tiles are cut among blocks; the cut is free to
// follow the GPU's size and the batch.
//
// Two cuts:
// - One block per tile (num_parts == num_tiles): part p is tile p; no tile is
//   split. For vocabularies that fill the GPU many times over.
// - Balanced (num_parts < num_tiles): a persistent grid of num_parts blocks per
//   row chunk, part p owning the units [PartFirstUnit(p), PartFirstUnit(p + 1))
//   of the chunk's kTileUnits * num_tiles units, nearly equal runs (they differ
//   by at most one unit). With one block per tile a vocabulary of 2.25 GPU-fulls
//   of blocks ends in a quarter wave of blocks that cannot saturate DRAM
//   (BENCHMARKS.md: a half-vocabulary shard's stage 1 ran at 80% of peak DRAM
//   against 89% for the whole head); with balanced parts every SM streams until
//   the end. A part boundary inside a tile splits it: each of the two blocks
//   writes its units' summaries to split_units[row][boundary][unit], and stage
//   2 merges the tile with MergeTileUnits. num_parts <= num_tiles guarantees
//   every part has at least kTileUnits units, so a tile holds at most one
//   boundary.
//
// Units past valid_vocab count as work in the cut (they are not loaded); the
// last tile is always a full kTileUnits units here.
//
// Thread safety: plain values and pure functions, host and device.
#pragma once

#include <cstdint>

#include "kernels/common/host_device.h"
#include "kernels/common/sample_summary.h"

namespace flashsampler {

constexpr int64_t kTileTokens = 128;
constexpr int kTileUnits = 8;
constexpr int64_t kUnitTokens = kTileTokens / kTileUnits;  // 16
// Most balanced parts per row chunk: bounds the split-unit scratch
// (SplitUnitBytes) whatever the GPU. A 132-SM H100 / H200 runs at most 396.
constexpr int64_t kMaxTileParts = 512;

struct TilePartition {
  int64_t num_tiles = 0;  // tiles of the row chunk's vocabulary, >= 1
  int64_t num_parts = 0;  // 1 .. num_tiles; == num_tiles: one block per tile
  // Device [batch][num_parts][kTileUnits]: the units of split tiles, indexed by
  // the boundary that splits them. Unused (may be null) when no tile is split.
  SampleSummary* split_units = nullptr;
};

// One block per tile.
FS_HOST_DEVICE FS_FORCE_INLINE TilePartition WholeTilePartition(int64_t num_tiles) {
  return TilePartition{num_tiles, num_tiles, nullptr};
}

// First unit of part `part` (0 .. num_parts; part == num_parts gives the end).
// part * units fits int64: units < 2^31 / 16 * 8 and part <= num_tiles.
FS_HOST_DEVICE FS_FORCE_INLINE int64_t PartFirstUnit(const TilePartition& p, int64_t part) {
  return part * (kTileUnits * p.num_tiles) / p.num_parts;
}

// The boundary b (1 .. num_parts - 1) whose first unit falls strictly inside
// `tile`, i.e. the tile is split between parts b - 1 and b; 0 when the tile is
// whole. The smallest b with PartFirstUnit(b) >= first is ceil(first * parts /
// units) (floor(x) >= first iff x >= first for an integer first).
FS_HOST_DEVICE FS_FORCE_INLINE int64_t SplitBoundaryOf(const TilePartition& p, int64_t tile) {
  if (p.num_parts >= p.num_tiles) return 0;
  const int64_t units = kTileUnits * p.num_tiles;
  const int64_t first = kTileUnits * tile + 1;
  const int64_t b = (first * p.num_parts + units - 1) / units;
  if (b >= p.num_parts) return 0;
  return PartFirstUnit(p, b) < kTileUnits * (tile + 1) ? b : 0;
}

// What part `part` computes of tile `tile` (one of the tiles its units touch,
// PartFirstUnit(part) / kTileUnits .. (PartFirstUnit(part + 1) - 1) / kTileUnits):
// its units [lo, hi) of the tile, and for a split tile the boundary that splits
// it (the part's own first unit when the part starts inside the tile, else the
// next part's).
struct TileWindow {
  int lo = 0;
  int hi = kTileUnits;
  int64_t boundary = 0;  // 0 for a whole tile
  FS_HOST_DEVICE bool whole() const { return lo == 0 && hi == kTileUnits; }
};

FS_HOST_DEVICE FS_FORCE_INLINE TileWindow WindowOf(const TilePartition& p, int64_t part,
                                                   int64_t tile) {
  const int64_t first = kTileUnits * tile;
  const int64_t begin = PartFirstUnit(p, part) - first;
  const int64_t end = PartFirstUnit(p, part + 1) - first;
  TileWindow w;
  w.lo = begin > 0 ? static_cast<int>(begin) : 0;
  w.hi = end < kTileUnits ? static_cast<int>(end) : kTileUnits;
  if (!w.whole()) w.boundary = w.lo > 0 ? part : part + 1;
  return w;
}

// Index of unit `unit` of the tile split by `boundary`, row `row`, in split_units.
FS_HOST_DEVICE FS_FORCE_INLINE int64_t SplitUnitIndex(const TilePartition& p, int64_t row,
                                                      int64_t boundary, int unit) {
  return (row * p.num_parts + boundary) * kTileUnits + unit;
}

// The tile's summary from its 8 unit summaries, unit(0) .. unit(7) in token
// order: ((u0 u1)(u2 u3))((u4 u5)(u6 u7)). The CUDA-core stage 1 merges its 8
// warps (a warp = a unit) with it; the tensor-core epilogue's butterfly over
// lanes 1, 2 (4 lanes = a unit), then 4, 8, 16 builds the same tree, because
// MergeSummaries is commutative bit for bit.
template <class UnitAt>
FS_HOST_DEVICE FS_FORCE_INLINE SampleSummary MergeTileUnits(const UnitAt& unit) {
  const SampleSummary a = MergeSummaries(MergeSummaries(unit(0), unit(1)),
                                         MergeSummaries(unit(2), unit(3)));
  const SampleSummary b = MergeSummaries(MergeSummaries(unit(4), unit(5)),
                                         MergeSummaries(unit(6), unit(7)));
  return MergeSummaries(a, b);
}

// Bytes of split_units for `batch` rows and any cut of up to kMaxTileParts parts.
FS_HOST_DEVICE FS_FORCE_INLINE int64_t SplitUnitBytes(int64_t batch) {
  return batch * kMaxTileParts * kTileUnits * static_cast<int64_t>(sizeof(SampleSummary));
}

// The cut for a launch of `num_chunks` row chunks x num_tiles tiles on a GPU
// that holds `resident_blocks` blocks of the kernel at once (occupancy x SMs).
// One block per tile fills ceil(waves) waves, the last one partly; balanced
// parts are one wave of floor(resident / chunks) blocks per chunk (capped by
// num_tiles and kMaxTileParts). Takes whichever keeps more of the GPU busy,
// one block per tile on a tie.
FS_HOST_DEVICE FS_FORCE_INLINE int64_t ChooseTileParts(int64_t num_tiles, int64_t num_chunks,
                                                       int64_t resident_blocks) {
  if (num_tiles < 1 || num_chunks < 1 || resident_blocks < 1) return num_tiles;
  int64_t parts = resident_blocks / num_chunks;
  if (parts > kMaxTileParts) parts = kMaxTileParts;
  if (parts >= num_tiles || parts < 1) return num_tiles;
  // Busy fractions, compared as cross-multiplied integers:
  //   whole tiles: blocks / (ceil(blocks / resident) * resident)
  //   balanced:    parts * num_chunks / resident
  const int64_t blocks = num_tiles * num_chunks;
  const int64_t waves = (blocks + resident_blocks - 1) / resident_blocks;
  return parts * num_chunks * waves > blocks ? parts : num_tiles;
}

}  // namespace flashsampler
