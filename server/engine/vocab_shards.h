// Vocabulary shards: how the sharded CUDA engine (sharded_cuda_engine.cc)
// splits the LM head W over the local GPUs. A pure planning function.
//
// The sampled range [0, valid_vocab) is cut into contiguous shards, one per
// device, in device-list order. Boundaries are multiples of `alignment`
// (kShardAlignment = 128 tokens, the fused kernel's vocabulary tile, so every
// shard's tiles are exactly the single-GPU kernel's tiles, and a multiple of
// the 4 tokens of a Philox block, which the kernels require); only the last
// shard ends at valid_vocab, which need not be aligned. Shard sizes follow
// `weights` (relative, e.g. {1, 3} gives the second GPU ~3/4 of the tiles;
// empty: equal), rounded to whole tiles, every shard at least one tile:
// uneven splits are allowed. Rows of W at or past valid_vocab (padding) are
// never sampled and are not placed on any device.
//
// Thread safety: pure function. Outcomes: InvalidArgument naming the problem
// for no devices, a duplicate device, bad weights, or fewer alignment tiles in
// [0, valid_vocab) than devices.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace flashsampler {

inline constexpr int64_t kShardAlignment = 128;

struct VocabShard {
  int device = 0;     // CUDA ordinal
  int64_t begin = 0;  // first global token id (a multiple of the alignment)
  int64_t end = 0;    // one past the last; rows [begin, end) of W live on `device`
};

absl::StatusOr<std::vector<VocabShard>> PlanVocabShards(int64_t valid_vocab,
                                                        const std::vector<int>& devices,
                                                        const std::vector<double>& weights,
                                                        int64_t alignment = kShardAlignment);

}  // namespace flashsampler
