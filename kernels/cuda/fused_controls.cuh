// The sampling-controls epilogue of the tensor-core stage 1
// (fused_sample_mma.cu) for the fused controlled path
// (fused_controlled_sample.h): how one warp turns a row's 128 dots of a tile
// into l' (bitmask, bans, bias, penalties, temperature) and then either a
// SampleSummary or the tile's best candidates. Internal to kernels/cuda:
// include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/candidate_order_key.h"
#include "kernels/common/gumbel_noise.h"
#include "kernels/common/sample_summary.h"
#include "kernels/common/touched_tokens.h"
#include "kernels/cuda/fused_controlled_sample.h"
#include "kernels/cuda/fused_sample_mma.cuh"
#include "kernels/cuda/sample_reduce.cuh"

namespace flashsampler::kernels::cuda_internal {

// One tile candidate: l' and its global token id; id -1 marks an empty slot.
struct FusedCandidate {
  float logit;
  int32_t id;
};

// Tile-head slots of a candidate row: kHeadSlots words per row, zero before
// stage 1. Slot s holds the largest head key (OrderedFloatBits of the tile's
// best l') among the row's tiles t with t % kHeadSlots == s that have run so
// far. Distinct slots hold distinct tiles' heads, so distinct tokens: once
// every slot is non-zero, at least kHeadSlots tokens of the row have a key >=
// min over the slots, and so does the row's k-th best for every k <=
// kHeadSlots (kFusedMaxTopK). A token whose key is below that minimum ranks
// 65th or later: no tile needs to write it (ControlledTileRow's rounds stop
// there). Slots only grow, and a stale read is a smaller minimum, still a
// bound; so the candidates a tile writes depend on timing, but never a token
// of the top-k, and stage 2's result does not (fused_controlled_sample.h).
inline constexpr int kHeadSlots = 64;
static_assert(kHeadSlots == 2 * 32, "each lane reads two slots");
static_assert(kFusedMaxTopK <= kHeadSlots, "the minimum bounds the k-th best for every top_k served");

// What the controlled epilogue reads and writes, besides the plain kernel's
// arguments. candidates: [batch, num_tiles, kFusedTileCandidates]; head_slots:
// [batch, kHeadSlots], or null (no pruning).
struct MmaControls {
  ControlledDeviceControls controls;
  FusedCandidate* candidates = nullptr;
  uint32_t* head_slots = nullptr;
};

// The first index in touched[0, count) (sorted by id) whose id >= token: a
// 32-way search, every lane probing one position per round, so a list of a
// few thousand ids takes three dependent loads. Warp-uniform result.
__device__ __forceinline__ int WarpLowerBound(const TouchedToken* touched, int count,
                                              int64_t token, int lane) {
  int lo = 0, hi = count;  // the answer lies in [lo, hi]
  while (hi - lo > 32) {
    const int step = (hi - lo + 31) / 32;
    const int probe = lo + lane * step;
    const bool before = probe < hi && touched[probe].id < token;
    const int c = __popc(__ballot_sync(kFullWarpMask, before));  // probes before `token`
    if (c == 0) return lo;  // touched[lo].id >= token
    const int last_before = lo + (c - 1) * step;
    const int first_after = lo + c * step;
    lo = last_before + 1;
    hi = first_after < hi ? first_after : hi;
  }
  const bool before = lo + lane < hi && touched[lo + lane].id < token;
  return lo + __popc(__ballot_sync(kFullWarpMask, before));
}

// The controlled epilogue of one (row, tile) for one warp. dot_row: the
// row's 128 raw dots of the tile in shared memory (this warp's alone; it is
// overwritten when the row has touched tokens). Lane k takes tokens
// tok0 + 4k .. tok0 + 4k + 3, as the plain epilogue does. tok0 and
// valid_vocab count the launch's own rows of W; token_offset (a vocabulary
// shard's first global id, a multiple of 128; 0 for a whole head) turns them
// into the global ids that the bitmask, the touched tokens, the noise and the
// written candidates and summaries use, so a shard's tiles are the whole
// head's tiles bit for bit.
__device__ __forceinline__ void ControlledTileRow(const MmaControls& ctl, const RowParams* params,
                                                  int64_t row, float* dot_row, int64_t tok0,
                                                  int64_t token_offset, int64_t valid_vocab, int64_t num_tiles,
                                                  int64_t tile, int lane,
                                                  SampleSummary* tile_summaries) {
  const ControlledRowDesc d = ctl.controls.rows[row];
  const int32_t kind = FusedRowKindOf(d);
  if (kind == kFusedUnservedRow) return;
  // A candidate row's two tile-head slots of this lane, read from L2 (other
  // blocks raise them), early: the rounds below wait on them.
  uint2 slots = make_uint2(0u, 0u);
  uint32_t* const row_slots = ctl.head_slots != nullptr ? ctl.head_slots + row * kHeadSlots : nullptr;
  if (kind == kFusedCandidateRow && row_slots != nullptr) {
    slots = __ldcg(reinterpret_cast<const uint2*>(row_slots) + lane);
  }
  const RowParams p = params[row];
  const float scale = DeviceLogitScale(p.temperature);
  const uint32_t* mask = d.bitmask_begin >= 0 ? ctl.controls.bitmask + d.bitmask_begin : nullptr;
  const int64_t t0 = tok0 + 4 * lane;  // local; a multiple of 4
  const int64_t g0 = token_offset + t0;  // global; a multiple of 4: one mask word for all four
  const float4 raw4 = *reinterpret_cast<const float4*>(dot_row + 4 * lane);
  const float raw[4] = {raw4.x, raw4.y, raw4.z, raw4.w};
  const uint32_t word = (mask != nullptr && t0 < valid_vocab) ? mask[g0 >> 5] : ~0u;
  float l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bool allowed = t0 + i < valid_vocab && ((word >> ((g0 + i) & 31)) & 1u) != 0u;
    const float y = allowed ? TransformLogit(raw[i], scale) : -INFINITY;
    l[i] = isfinite(y) ? y : -INFINITY;
  }

  // Touched tokens (bans, bias, penalties) of this tile: at most 128 distinct
  // ids, so at most 4 per lane. Each lane computes its entries' l' from the
  // raw dots, the lanes store their plain l' over the dots, the entries'
  // owners overwrite theirs, and every lane reads its 4 back.
  if (d.touched_count > 0) {
    const TouchedToken* touched = ctl.controls.touched + d.touched_begin;
    const int64_t gtok0 = token_offset + tok0;
    const int first = WarpLowerBound(touched, d.touched_count, gtok0, lane);
    int pos[4];
    float value[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      pos[q] = -1;
      value[q] = -INFINITY;
      const int j = first + lane + 32 * q;
      if (j >= d.touched_count) continue;
      const TouchedToken t = touched[j];
      if (t.id >= gtok0 + kMmaTileVocab || t.id - token_offset >= valid_vocab) continue;
      pos[q] = static_cast<int>(t.id - gtok0);
      const bool allowed = mask == nullptr || ((mask[t.id >> 5] >> (t.id & 31)) & 1u) != 0u;
      if (allowed && t.banned == 0) {
        const float y = TouchedLogit(dot_row[pos[q]], t, d.repetition_penalty,
                                     d.frequency_penalty, d.presence_penalty, scale);
        value[q] = isfinite(y) ? y : -INFINITY;
      }
    }
    __syncwarp();  // every raw dot this row needs has been read
    *reinterpret_cast<float4*>(dot_row + 4 * lane) = make_float4(l[0], l[1], l[2], l[3]);
    __syncwarp();
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (pos[q] >= 0) dot_row[pos[q]] = value[q];
    }
    __syncwarp();
    const float4 back = *reinterpret_cast<const float4*>(dot_row + 4 * lane);
    l[0] = back.x;
    l[1] = back.y;
    l[2] = back.z;
    l[3] = back.w;
  }

  if (kind == kFusedSummaryRow) {
    // The plain sampler's fold over the processed logits; -inf tokens are out.
    const bool sampled = p.temperature > 0.0f;
    r123::Philox4x32::ctr_type block = {{0u, 0u, 0u, 0u}};
    if (sampled) block = PhiloxNoiseBlock(p.seed, p.offset, p.stream, static_cast<uint32_t>(g0) >> 2);
    SampleSummary s = EmptySampleSummary();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (l[i] == -INFINITY) continue;
      const float score = sampled ? __fadd_rn(l[i], GumbelFromBits(block.v[i])) : l[i];
      AddToken(s, static_cast<int32_t>(g0 + i), l[i], score, true);
    }
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) s = MergeSummaries(s, ShuffleXorSummary(s, m));
    if (lane == 0) tile_summaries[row * num_tiles + tile] = s;
    return;
  }

  // Candidate row: m rounds of a warp arg-max in canonical order (higher l',
  // then lower id; -inf tokens never enter). l' is compared through its
  // order-preserving bits (-0 folded into +0, as float comparison has them
  // equal). Each lane first sorts its four tokens by (key descending, id
  // ascending), so its best remaining token is always its head: a round is
  // one redux.sync max over the heads plus a ballot (among lanes holding the
  // maximum the lowest lane holds the lowest id, and a lane's head is its
  // lowest id of that key), and the owner writes the c-th candidate and pops
  // its head. Key 0 (below every finite l') marks -inf tokens and the empty
  // slots popping leaves. The same candidates in the same order as arg-max
  // rounds over the unsorted four (a total order picks them), in fewer
  // instructions a round. The rounds stop at the first key below the row's
  // tile-head bound (kHeadSlots): such tokens rank after the 64th, and the
  // slots after the last round are empty, as for a tile with fewer finite
  // tokens. Keys equal to the bound stay (a tie may rank either side).
  const int m = d.top_k < kFusedTileCandidates ? d.top_k : kFusedTileCandidates;
  FusedCandidate* out = ctl.candidates + (row * num_tiles + tile) * kFusedTileCandidates;
  uint32_t key[4];
  float lv[4];
  int32_t id[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    key[i] = l[i] > -INFINITY ? OrderedFloatBits(l[i]) : 0u;
    lv[i] = l[i];
    id[i] = static_cast<int32_t>(g0 + i);
  }
  // A 4-input sorting network; position j goes before position i (j > i)
  // when its key is larger, or equal with a lower id.
  constexpr int kPairs[5][2] = {{0, 1}, {2, 3}, {0, 2}, {1, 3}, {1, 2}};
#pragma unroll
  for (int q = 0; q < 5; ++q) {
    const int i = kPairs[q][0], j = kPairs[q][1];
    const bool swap = key[j] > key[i] || (key[j] == key[i] && id[j] < id[i]);
    const uint32_t ki = key[i];
    const float li = lv[i];
    const int32_t ii = id[i];
    key[i] = swap ? key[j] : key[i];
    lv[i] = swap ? lv[j] : lv[i];
    id[i] = swap ? id[j] : id[i];
    key[j] = swap ? ki : key[j];
    lv[j] = swap ? li : lv[j];
    id[j] = swap ? ii : id[j];
  }
  // 1 while any slot is empty: only the -inf key 0 stops the rounds then.
  const uint32_t bound = max(__reduce_min_sync(kFullWarpMask, min(slots.x, slots.y)), 1u);
  uint32_t head = 0u;  // the tile's best key (0: no finite l')
  int c = 0;
  for (; c < m; ++c) {
    const uint32_t top = __reduce_max_sync(kFullWarpMask, key[0]);
    if (c == 0) head = top;
    if (top < bound) break;  // warp-uniform: no token of the top-k left in the tile
    const uint32_t owners = __ballot_sync(kFullWarpMask, key[0] == top);
    if (lane == __ffs(owners) - 1) {
      out[c] = FusedCandidate{lv[0], id[0]};
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        key[i] = key[i + 1];
        lv[i] = lv[i + 1];
        id[i] = id[i + 1];
      }
      key[3] = 0u;
    }
  }
  if (lane >= c && lane < m) out[lane] = FusedCandidate{-INFINITY, -1};
  // Raise the tile's slot. A head below the bound is below every slot already.
  const int s = static_cast<int>(tile % kHeadSlots);
  if (row_slots != nullptr && head >= bound && lane == s / 2 && head > ((s & 1) != 0 ? slots.y : slots.x)) {
    atomicMax(row_slots + s, head);
  }
}

}  // namespace flashsampler::kernels::cuda_internal
