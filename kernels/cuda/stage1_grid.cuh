// The grid of a stage-1 launch: how many blocks of the kernel the current GPU
// holds at once, and from that the TilePartition the launch takes
// (kernels/common/tile_partition.h: one block per tile, or balanced parts in
// one wave). Used by both stage-1 launchers (fused_sample.cu,
// fused_sample_mma.cu). Internal to kernels/cuda.
//
// Thread safety: queries the current device and the kernel's attributes only;
// safe from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>

#include "kernels/common/tile_partition.h"

namespace flashsampler::kernels::cuda_internal {

struct Stage1Grid {
  TilePartition partition;
  unsigned blocks = 0;  // partition.num_parts * num_chunks, chunks fastest
};

// Plans the grid of `kernel` (threads per block, dynamic shared memory per
// block) over num_chunks row chunks x num_tiles tiles. split_units: the
// workspace's [batch][kMaxTileParts][kTileUnits] scratch, or null for one
// block per tile (no split tiles). tile_parts: FusedSampleArgs::tile_parts (0:
// ChooseTileParts from the occupancy; n >= 1: min(n, kMaxTileParts) parts, one
// block per tile when n >= num_tiles). Returns the CUDA
// error of a query, or cudaErrorInvalidValue if the grid is too large.
template <class Kernel>
cudaError_t PlanStage1Grid(Kernel* kernel, int threads, size_t smem_bytes, int64_t num_tiles,
                           int64_t num_chunks, SampleSummary* split_units, int64_t tile_parts,
                           Stage1Grid* grid) {
  if (split_units == nullptr || tile_parts >= num_tiles) {
    const int64_t blocks = num_tiles * num_chunks;
    if (blocks > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
    grid->partition = WholeTilePartition(num_tiles);
    grid->blocks = static_cast<unsigned>(blocks);
    return cudaSuccess;
  }
  int64_t parts = tile_parts < kMaxTileParts ? tile_parts : kMaxTileParts;
  if (tile_parts == 0) {
    int device = 0, sms = 0, per_sm = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) {
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes);
    }
    if (err != cudaSuccess) return err;
    parts = ChooseTileParts(num_tiles, num_chunks, int64_t{sms} * per_sm);
  }
  const int64_t blocks = parts * num_chunks;
  if (blocks > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
  grid->partition = TilePartition{num_tiles, parts, split_units};
  grid->blocks = static_cast<unsigned>(blocks);
  return cudaSuccess;
}

}  // namespace flashsampler::kernels::cuda_internal
