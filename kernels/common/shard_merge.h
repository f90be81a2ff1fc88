// Shard merge: how the per-row SampleSummary of each vocabulary shard (a
// contiguous range of token ids on one GPU, kernels/cuda/sharded_sample.h)
// combines into the row's sample, log Z and log-prob. Pure functions, the same
// code on the host (CPU tests, CI) and in the device merge kernel.
//
// Two modes (--shard_merge):
// - kExact (default): fold the shards' summaries with MergeSummaries in shard
//   order. The winner is argmax over all tokens of l'_i + g_i, and because
//   every shard keys its noise by the global token id, it is pathwise the
//   token one GPU picks for the same seeds (MergeSummaries is associative and
//   breaks ties by id). log Z = logsumexp_k L_k (L_k: the shard's log-mass),
//   equal to the single-GPU value up to fp32 rounding (different merge tree).
// - kGroupGumbel (the paper's group-Gumbel variant): for sampled rows, pick the
//   shard k with a fresh Gumbel over the shards' log-masses,
//   k* = argmax_k (L_k + G_k), and take shard k*'s own winner. A shard's winner
//   is a sample of softmax(l') restricted to the shard, independent of the
//   fresh G, and P(k*) = exp(L_k) / sum_j exp(L_j), so the token is exactly
//   distributed as softmax(l'), but it is not pathwise the kExact token.
//   Greedy rows (temperature 0) always merge exactly (argmax). The rescored
//   summaries still go through MergeSummaries, so log Z is as in kExact.
//   Precondition: the summaries carry the log-sum-exp (max_logit, sum_exp).
//
// The fresh shard noise extends the RNG contract (gumbel_noise.h) without
// touching any token's noise: G_k = GumbelNoise(seed, offset, stream,
// kShardNoiseIndexBase + k). Token ids are < 2^31 (int32), so vocabulary
// indices from 2^31 up are never a token's.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "kernels/common/gumbel_noise.h"
#include "kernels/common/host_device.h"
#include "kernels/common/row_params.h"
#include "kernels/common/sample_summary.h"

namespace flashsampler {

enum class ShardMergeMode : int32_t { kExact = 0, kGroupGumbel = 1 };

// First vocabulary index of the shard-selection noise (see above).
inline constexpr uint32_t kShardNoiseIndexBase = 0x80000000u;

// The fresh Gumbel G_k of shard k for a row (kGroupGumbel).
FS_HOST_DEVICE FS_FORCE_INLINE float ShardSelectionNoise(const RowParams& p, int32_t shard) {
  return GumbelNoise(p.seed, p.offset, p.stream,
                     kShardNoiseIndexBase + static_cast<uint32_t>(shard));
}

// Shard k's summary as it enters the merge: unchanged in kExact mode and for
// greedy rows; in kGroupGumbel mode for sampled rows its best_score becomes
// L_k + G_k (an empty shard, best_index -1, stays empty and never wins).
FS_HOST_DEVICE FS_FORCE_INLINE SampleSummary ShardMergeInput(const SampleSummary& s,
                                                             int32_t shard,
                                                             const RowParams& p,
                                                             ShardMergeMode mode) {
  if (mode != ShardMergeMode::kGroupGumbel || !(p.temperature > 0.0f) || s.best_index < 0) {
    return s;
  }
  SampleSummary out = s;
  out.best_score = SummaryLogZ(s) + ShardSelectionNoise(p, shard);
  return out;
}

// One row's merged summary over `num_shards` shard summaries, shard k's at
// summaries[k * stride] (the all-gather layout [shard][row] has stride =
// batch). Shards are merged in order 0, 1, ..., so the result, log Z rounding
// included, is the same on every call. best_score of a kGroupGumbel result is
// the shard-level score, not a token score.
FS_HOST_DEVICE FS_FORCE_INLINE SampleSummary MergeShardSummaries(const SampleSummary* summaries,
                                                                 int64_t stride,
                                                                 int32_t num_shards,
                                                                 const RowParams& p,
                                                                 ShardMergeMode mode) {
  SampleSummary merged = EmptySampleSummary();
  for (int32_t k = 0; k < num_shards; ++k) {
    merged = MergeSummaries(merged, ShardMergeInput(summaries[k * stride], k, p, mode));
  }
  return merged;
}

}  // namespace flashsampler
