// Shard exchange: how the vocabulary shards' per-row summaries
// (kernels/cuda/sharded_sample.h) reach the GPU that merges them (--shard_exchange).
// - kNcclAllGather (default): one NCCL group of in-place all-gathers over the
//   shards' communicators; every GPU receives every summary.
// - kPeerWrite: each shard's kernel stores its summaries straight into the
//   merging GPU's buffer (peer access over NVLink / PCIe) and the merge waits
//   for one event per shard; no collective. Needs peer access from every
//   shard's GPU to the merging one.
// Both move the same bytes into the same layout, so the merged outputs are the
// same bits; only the latency of the exchange differs.
//
// Thread safety: a plain enum.
#pragma once

#include <cstdint>

namespace flashsampler {

enum class ShardExchange : int32_t { kNcclAllGather = 0, kPeerWrite = 1 };

}  // namespace flashsampler
