// Fused controlled sampling: stage 1 is the tensor-core GEMM with the
// controls epilogue (fused_sample_mma.cu + fused_controls.cuh); this file holds
// stage 2 and the launcher. What it computes and why it is exact:
// fused_controlled_sample.h. Reads top to bottom: the candidate keys, the
// block's top-k selection, the stage-2 kernel (summary rows, then candidate rows step by step), the
// launcher with its workspace arithmetic.
#include "kernels/cuda/fused_controlled_sample.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include <cub/block/block_scan.cuh>

#include "kernels/common/candidate_order_key.h"
#include "kernels/common/gumbel_noise.h"
#include "kernels/common/sample_summary.h"
#include "kernels/cuda/fused_controls.cuh"
#include "kernels/cuda/fused_sample_mma.cuh"
#include "kernels/cuda/fused_sample_sm90.cuh"
#include "kernels/cuda/sample_reduce.cuh"

namespace flashsampler::kernels {
namespace {

using cuda_internal::FusedCandidate;
using cuda_internal::kFullWarpMask;
using cuda_internal::kMmaTileVocab;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Tile heads per thread in the first selection: 8 x 256 = 2048 tiles = kFusedMaxVocab.
constexpr int kHeadItems = 8;
static_assert(int64_t{kHeadItems} * kThreads * kMmaTileVocab == kFusedMaxVocab, "one block holds every tile head");
// Candidates per thread in the second selection: top_k tiles x m candidates.
constexpr int kCandItems = (kFusedMaxTopK * kFusedTileCandidates) / kThreads;
static_assert(kCandItems * kThreads == kFusedMaxTopK * kFusedTileCandidates, "whole items");
static_assert(kFusedMaxTopK <= 64, "the sample step gives each lane two kept tokens");
static_assert(kFusedMaxTopK <= kThreads, "the top-k's final order gives each found token a thread");
static_assert(kHeadItems <= 32 && kCandItems <= 32, "a thread's taken items fit one bit mask");

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// ---- The canonical order as integers ------------------------------------------
// CandidateOrderKey (kernels/common/candidate_order_key.h): larger = earlier
// in (l' desc, id asc); 0 marks an empty slot.
__device__ __forceinline__ uint64_t CandidateKey(const FusedCandidate& c) {
  return c.id < 0 ? 0 : CandidateOrderKey(c.logit, c.id);
}
// Its high word, l' alone (0 still marks an empty slot: the ordered bits of
// every l', -inf included, are non-zero; l' is never NaN). The selections
// below compare this 32-bit key and leave the id to the arrangement: keys
// that tie go to the earlier item, and each selection's input lists ids in
// ascending order wherever logits can tie (tile heads in tile order;
// candidates tile by tile in tile order, each tile's in canonical order).
// So what they take, and the order step 2's ranking gives it (ties to the
// earlier item), are those of the 64-bit key, with half the radix rounds.
// This rests on two facts outside this kernel: the tile columns of `candidates` are in
// ascending global tile order (a vocabulary shard's tiles are gathered at
// column token_offset / 128, sharded_sample.cu), and stage 1 writes each
// tile's candidates in canonical order (ControlledTileRow, fused_controls.cuh).
__device__ __forceinline__ uint32_t LogitKey(const FusedCandidate& c) {
  return c.id < 0 ? 0u : static_cast<uint32_t>(CandidateOrderKey(c.logit, c.id) >> 32);
}

// ---- The k largest keys of a block: a radix select ------------------------------
// Stage 2 needs, twice, the k largest of up to 2048 32-bit keys (k <= 64;
// key 0: an empty slot, never taken) with ties going to the earlier item of
// the block's blocked arrangement (thread t holds items t * kItems ...),
// which lists ids in ascending order wherever keys can tie (LogitKey). Not
// a sort: the cut between the taken keys and the rest, found one 8-bit
// digit at a time from the top (a 256-bin histogram of the keys that match
// the digits found so far, and a scan of it from the largest digit down),
// so at most four rounds of block barriers instead of a radix sort's eight
// passes of ranking and exchange over every key. The cut is exact: every
// key above it is among the k largest, and so are the first `equal` keys
// equal to it; the k largest under "key desc, then arrangement order" are
// exactly those.
constexpr int kDigitBits = 8;
constexpr int kDigits = 1 << kDigitBits;
static_assert(kDigits == kThreads, "one histogram bin a thread");
using CountScan = cub::BlockScan<int32_t, kThreads>;

struct SelectShared {
  typename CountScan::TempStorage scan;
  int32_t hist[kDigits];  // zero between rounds and calls
  uint32_t prefix;
  int32_t remaining;
  int32_t done;
};

struct TopKCut {
  uint32_t key;   // every key above it is taken
  int32_t equal;  // and the first `equal` keys equal to it (0 when every key
                  // taken is above `key`: at most k non-zero keys, or a whole digit)
};

// All threads call it with the same k >= 1; sh.hist must be zero (it is
// left zero). Ends with a barrier, so sh may be reused at once.
template <int kItems>
__device__ __forceinline__ TopKCut SelectTopKCut(const uint32_t (&keys)[kItems], int k,
                                                 SelectShared& sh) {
  const int tid = static_cast<int>(threadIdx.x);
  uint32_t prefix = 0u, mask = 0u;
  int remaining = k;  // still to take among the keys that match prefix on mask
  for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    // Ordered after the last round's reads by its closing barrier, and
    // before this round's winner's write by the next one.
    if (tid == 0) sh.done = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (keys[i] != 0u && (keys[i] & mask) == prefix) {
        atomicAdd(&sh.hist[(keys[i] >> shift) & (kDigits - 1)], 1);
      }
    }
    __syncthreads();
    // Thread t takes digit 255 - t: its exclusive prefix sum counts the
    // matching keys in larger digits.
    const int digit = kDigits - 1 - tid;
    const int count = sh.hist[digit];
    sh.hist[digit] = 0;  // for the next round; the barriers below order it before its atomics
    int above = 0, matching = 0;
    CountScan(sh.scan).ExclusiveSum(count, above, matching);
    if (matching <= remaining) {
      // Only in the first round (later rounds match more than `remaining`
      // keys): at most k non-zero keys, all taken.
      __syncthreads();
      return {0u, 0};
    }
    if (above < remaining && remaining <= above + count) {  // exactly one thread
      const uint32_t cut = prefix | (static_cast<uint32_t>(digit) << shift);
      if (remaining - above == count) {
        // The whole digit is taken: every key >= cut, i.e. above cut - 1.
        // cut > 0: digit 0 taken whole would take every matching key, and
        // there are more than `remaining` of them.
        sh.prefix = cut - 1u;
        sh.remaining = 0;
        sh.done = 1;
      } else {
        sh.prefix = cut;
        sh.remaining = remaining - above;
      }
    }
    __syncthreads();
    prefix = sh.prefix;
    remaining = sh.remaining;
    const bool done = sh.done != 0;
    __syncthreads();  // before the next round rewrites sh.prefix and reuses sh.scan
    if (done) return {prefix, 0};
    mask |= static_cast<uint32_t>(kDigits - 1) << shift;
  }
  return {prefix, remaining};
}

// Which of the thread's items the cut takes (bit i); every item taken is
// non-zero. When the cut takes some of the keys equal to it, a block scan
// counts those the threads before this one hold, so they go in
// arrangement order. All threads call it; sh may be reused at once after.
template <int kItems>
__device__ __forceinline__ uint32_t TakenItems(const uint32_t (&keys)[kItems], TopKCut cut,
                                               SelectShared& sh) {
  uint32_t ties = 0u;  // bit i: item i is non-zero and equal to the cut
#pragma unroll
  for (int i = 0; i < kItems; ++i) ties |= keys[i] != 0u && keys[i] == cut.key ? 1u << i : 0u;
  int equal_before = 0;
  if (cut.equal > 0) {  // uniform
    CountScan(sh.scan).ExclusiveSum(__popc(ties), equal_before);
    __syncthreads();
  }
  uint32_t taken = 0u;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const bool tie = ((ties >> i) & 1u) != 0u;
    if (keys[i] > cut.key || (tie && equal_before < cut.equal)) taken |= 1u << i;
    equal_before += tie ? 1 : 0;
  }
  return taken;
}

struct FinishShared {
  union {
    SelectShared select;
    SampleSummary warp_summaries[kWarps];
  };
  int32_t by_index[kFusedMaxTopK];  // the selected tiles in ascending tile order
  uint32_t found_key[kFusedMaxTopK];  // the top-k found, in arrangement order
  int32_t found_id[kFusedMaxTopK];
  float logit[kFusedMaxTopK];      // the row's top-k, canonical order
  int32_t id[kFusedMaxTopK];
  double mass[kFusedMaxTopK];      // exp(l' - max), float64
  int32_t saturated;
  int32_t kept;
  double logz;
};

// ---- Stage 2: one block per row --------------------------------------------------
// Summary rows: merge the row's tile summaries (thread t takes tiles t,
// t + 256, ... in order, then a fixed tree), as the plain stage 2 does.
// Candidate rows: steps 1-5 below. Unserved rows: row_status 2.
__global__ void __launch_bounds__(kThreads)
    FusedControlledFinishKernel(const SampleSummary* __restrict__ tile_summaries,
                                const FusedCandidate* __restrict__ candidates, int64_t num_tiles,
                                const RowParams* __restrict__ params,
                                ControlledDeviceControls controls, ControlledSampleOutputs out) {
  __shared__ FinishShared sh;
  cuda_internal::GridDependencyWait();  // stage 1's summaries and candidates are written
  const int64_t row = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const ControlledRowDesc d = controls.rows[row];
  const int32_t kind = FusedRowKindOf(d);
  if (kind == kFusedUnservedRow) {
    if (tid == 0) {
      out.row_status[row] = kFusedRowNotServed;
      out.token_ids[row] = -1;
    }
    return;
  }
  const RowParams p = params[row];

  if (kind == kFusedSummaryRow) {
    SampleSummary s = EmptySampleSummary();
    for (int64_t t = tid; t < num_tiles; t += kThreads) {
      s = MergeSummaries(s, tile_summaries[row * num_tiles + t]);
    }
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) s = MergeSummaries(s, cuda_internal::ShuffleXorSummary(s, m));
    if (lane == 0) sh.warp_summaries[warp] = s;
    __syncthreads();
    if (tid != 0) return;
    for (int w = 1; w < kWarps; ++w) s = MergeSummaries(s, sh.warp_summaries[w]);
    if (s.best_index < 0) {  // every token of the row is masked or non-finite
      out.row_status[row] = 1;
      out.token_ids[row] = -1;
      return;
    }
    const float logz = SummaryLogZ(s);
    out.row_status[row] = 0;
    out.token_ids[row] = s.best_index;
    out.sample_tokens[d.sample_begin] = s.best_index;
    if (out.logz != nullptr) out.logz[row] = logz;
    if (out.logprobs != nullptr) out.logprobs[row] = s.best_logit - logz;
    out.top_counts[row] = 0;
    return;
  }

  // ---- Candidate row.
  const int k = d.top_k;
  const int m = k < kFusedTileCandidates ? k : kFusedTileCandidates;
  const FusedCandidate* row_cands = candidates + row * num_tiles * kFusedTileCandidates;

  // 1. The top_k tiles by their head (best candidate; key 0: an empty tile),
  // in ascending tile order. Tiles in ascending order in the blocked
  // arrangement, so heads that tie on l' go to the lower ids.
  sh.select.hist[tid] = 0;  // SelectTopKCut's histogram starts zero
  __syncthreads();
  int selected = 0;
  {
    uint32_t keys[kHeadItems];
#pragma unroll
    for (int i = 0; i < kHeadItems; ++i) {
      const int t = tid * kHeadItems + i;  // blocked arrangement
      keys[i] = t < num_tiles ? LogitKey(row_cands[static_cast<int64_t>(t) * kFusedTileCandidates]) : 0u;
    }
    const uint32_t taken = TakenItems(keys, SelectTopKCut(keys, k, sh.select), sh.select);
    int pos = 0;
    CountScan(sh.select.scan).ExclusiveSum(__popc(taken), pos, selected);
#pragma unroll
    for (int i = 0; i < kHeadItems; ++i) {
      if ((taken >> i) & 1u) sh.by_index[pos++] = tid * kHeadItems + i;
    }
    __syncthreads();
  }

  // 2. Their first m candidates; the best k of them are the top-k found.
  // Listed tile by tile in ascending tile order (each tile's candidates are
  // already in canonical order), so logits that tie go to the lower ids.
  // The k taken (in list order) are put in canonical order by counting: a
  // found token's rank is the number that precede it.
  uint64_t kth_key = 0;
  int found = 0;
  {
    uint32_t keys[kCandItems];
    int32_t ids[kCandItems];
#pragma unroll
    for (int i = 0; i < kCandItems; ++i) {
      const int idx = tid * kCandItems + i;
      const int s = idx / m, c = idx % m;
      FusedCandidate cand{0.0f, -1};
      if (s < selected) cand = row_cands[static_cast<int64_t>(sh.by_index[s]) * kFusedTileCandidates + c];
      keys[i] = LogitKey(cand);
      ids[i] = cand.id;
    }
    const uint32_t taken = TakenItems(keys, SelectTopKCut(keys, k, sh.select), sh.select);
    int pos = 0;
    CountScan(sh.select.scan).ExclusiveSum(__popc(taken), pos, found);
#pragma unroll
    for (int i = 0; i < kCandItems; ++i) {
      if ((taken >> i) & 1u) {
        sh.found_key[pos] = keys[i];
        sh.found_id[pos] = ids[i];
        ++pos;
      }
    }
    __syncthreads();
    if (tid < found) {
      const uint32_t key = sh.found_key[tid];
      int rank = 0;
      for (int j = 0; j < found; ++j) {
        const uint32_t other = sh.found_key[j];
        rank += other > key || (other == key && j < tid) ? 1 : 0;
      }
      sh.logit[rank] = FloatOfOrderedBits(key);
      sh.id[rank] = sh.found_id[tid];
    }
    if (tid == 0) sh.saturated = 0;
    __syncthreads();
  }
  if (found == k) {
    kth_key = CandidateKey(FusedCandidate{sh.logit[k - 1], sh.id[k - 1]});
  }

  // 3. Completeness (TileMayHoldMoreOfTopK, candidate_order_key.h): a full
  // tile whose last candidate ranks before the k-th found (or, when fewer
  // than k were found, any full tile) may hold more of the top-k.
  if (tid < selected) {
    const FusedCandidate last = row_cands[static_cast<int64_t>(sh.by_index[tid]) * kFusedTileCandidates + m - 1];
    if (TileMayHoldMoreOfTopK(last.id >= 0, m, k, CandidateKey(last), kth_key)) sh.saturated = 1;
  }
  __syncthreads();
  if (sh.saturated != 0 || found == 0) {
    if (tid == 0) {
      out.row_status[row] = sh.saturated != 0 ? kFusedRowNotServed : 1;
      out.token_ids[row] = -1;
    }
    return;
  }

  // 4. min_p, top_p and log Z over the ranked top-k, float64 in canonical
  // order: the CPU's SampleFromCandidates sums the same terms in the same order.
  const double max = sh.logit[0];
  if (tid < found) sh.mass[tid] = exp(static_cast<double>(sh.logit[tid]) - max);
  __syncthreads();
  if (tid == 0) {
    int kept = found;
    if (d.min_p > 0.0f) {
      int n = 0;
      while (n < kept && sh.mass[n] >= static_cast<double>(d.min_p)) ++n;
      kept = n;  // >= 1: the max has mass 1
    }
    if (d.top_p < 1.0f) {
      double total = 0.0;
      for (int i = 0; i < kept; ++i) total += sh.mass[i];
      const double target = static_cast<double>(d.top_p) * total;
      double before = 0.0;
      int keep = 0;
      while (keep < kept && before < target) before += sh.mass[keep++];
      kept = keep > 1 ? keep : 1;
    }
    double sum = 0.0;
    for (int i = 0; i < kept; ++i) sum += sh.mass[i];
    sh.kept = kept;
    sh.logz = max + log(sum);
  }
  __syncthreads();
  const int kept = sh.kept;
  const double logz = sh.logz;

  // 5. Sample j (warp j % 8): arg-max over the kept tokens of l' + noise on
  // stream + j * stride (greedy: l'), ties to the lower id; lane L scores
  // kept tokens L and L + 32.
  const bool sampled = p.temperature > 0.0f;
  for (int j = warp; j < d.num_samples; j += kWarps) {
    RowParams q = p;
    q.stream = p.stream + static_cast<uint32_t>(j) * d.sample_stream_stride;
    float best = -INFINITY;
    int32_t best_id = -1;
    float best_logit = -INFINITY;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = lane + 32 * h;
      if (i >= kept) continue;
      const float l = sh.logit[i];
      const float score =
          sampled ? __fadd_rn(l, cuda_internal::DeviceGumbelNoise(q, static_cast<uint32_t>(sh.id[i]))) : l;
      if (ScoreBeats(score, sh.id[i], best, best_id)) {
        best = score;
        best_id = sh.id[i];
        best_logit = l;
      }
    }
#pragma unroll
    for (int off = 16; off >= 1; off /= 2) {
      const float os = __shfl_xor_sync(kFullWarpMask, best, off);
      const int32_t oi = __shfl_xor_sync(kFullWarpMask, best_id, off);
      const float ol = __shfl_xor_sync(kFullWarpMask, best_logit, off);
      if (ScoreBeats(os, oi, best, best_id)) {
        best = os;
        best_id = oi;
        best_logit = ol;
      }
    }
    // vLLM's rank: kept tokens with l' >= the sample's.
    const bool ge0 = lane < kept && sh.logit[lane] >= best_logit;
    const bool ge1 = lane + 32 < kept && sh.logit[lane + 32] >= best_logit;
    const int rank = __popc(__ballot_sync(kFullWarpMask, ge0)) + __popc(__ballot_sync(kFullWarpMask, ge1));
    if (lane == 0) {
      out.sample_tokens[d.sample_begin + j] = best_id;
      if (d.top_logprobs > 0) {
        out.sample_logprobs[d.sample_begin + j] = static_cast<float>(static_cast<double>(best_logit) - logz);
        out.sample_ranks[d.sample_begin + j] = rank;
      }
      if (j == 0) {
        out.token_ids[row] = best_id;
        if (out.logprobs != nullptr) out.logprobs[row] = static_cast<float>(static_cast<double>(best_logit) - logz);
      }
    }
  }
  const int top = d.top_logprobs < kept ? d.top_logprobs : kept;
  if (tid < top) {
    out.top_ids[row * kMaxTopLogprobs + tid] = sh.id[tid];
    out.top_logprobs[row * kMaxTopLogprobs + tid] = static_cast<float>(static_cast<double>(sh.logit[tid]) - logz);
  }
  if (tid == 0) {
    out.top_counts[row] = top;
    out.row_status[row] = 0;
    if (out.logz != nullptr) out.logz[row] = static_cast<float>(logz);
  }
}

// ---- Workspace: [batch, tiles] summaries | [batch, tiles, m] candidates |
// [batch, kHeadSlots] tile-head slots | Hr
size_t AlignUp(size_t n) { return (n + 255) & ~size_t{255}; }
int64_t NumTiles(int64_t valid_vocab) { return (valid_vocab + kMmaTileVocab - 1) / kMmaTileVocab; }
size_t SummaryBytes(int64_t batch, int64_t tiles) {
  return AlignUp(static_cast<size_t>(batch) * static_cast<size_t>(tiles) * sizeof(SampleSummary));
}
size_t CandidateBytes(int64_t batch, int64_t tiles) {
  return AlignUp(static_cast<size_t>(batch) * static_cast<size_t>(tiles) * kFusedTileCandidates *
                 sizeof(FusedCandidate));
}
size_t HeadSlotBytes(int64_t batch) {
  return AlignUp(static_cast<size_t>(batch) * cuda_internal::kHeadSlots * sizeof(uint32_t));
}

}  // namespace

bool FusedControlledShapeSupported(CudaWeightDType dtype, int64_t valid_vocab, int64_t hidden_dim) {
  return (dtype == CudaWeightDType::kBFloat16 || dtype == CudaWeightDType::kFloat16) &&
         valid_vocab >= 1 && valid_vocab <= kFusedMaxVocab && hidden_dim >= 16 &&
         hidden_dim % 16 == 0 && hidden_dim <= kMaxInt32;
}

size_t FusedControlledWorkspaceBytes(int64_t batch, int64_t valid_vocab, int64_t hidden_dim) {
  if (batch < 1 || batch > kMaxInt32 || valid_vocab < 1 || valid_vocab > kFusedMaxVocab ||
      hidden_dim < 1 || hidden_dim > kMaxInt32) {
    return 0;
  }
  const int64_t tiles = NumTiles(valid_vocab);
  return SummaryBytes(batch, tiles) + CandidateBytes(batch, tiles) + HeadSlotBytes(batch) +
         AlignUp(static_cast<size_t>(RoundedHiddenRows(batch)) *
                 static_cast<size_t>(hidden_dim) * sizeof(uint16_t));
}

size_t FusedControlledTileSummaryBytes() { return sizeof(SampleSummary); }
size_t FusedControlledTileCandidateBytes() { return kFusedTileCandidates * sizeof(FusedCandidate); }

FusedControlledTiles FusedControlledTilesIn(void* workspace, int64_t batch, int64_t valid_vocab) {
  FusedControlledTiles t;
  t.tiles = NumTiles(valid_vocab);
  auto* base = static_cast<unsigned char*>(workspace);
  t.summaries = base;
  t.candidates = base + SummaryBytes(batch, t.tiles);
  return t;
}

// Grid: stage 1 as the plain tensor-core sampler (ChooseStage1: below 16
// rows fused_sample_mma.cu's launcher, one block of 256 threads per
// (128-token tile, row chunk of 8..128 rows); from 16 rows on Hopper
// fused_sample_sm90.cu's: a persistent block of 544 or 640 threads per SM
// with separate epilogue warps), with the controlled epilogue.
bool FusedControlledStage1Valid(const ControlledSampleArgs& a, int64_t token_offset) {
  return a.weight != nullptr && a.hidden != nullptr && a.params != nullptr &&
         a.controls.rows != nullptr && a.controls.touched != nullptr && a.workspace != nullptr &&
         a.controls.draft_tokens == nullptr &&  // drafts: materialized only
         a.batch >= 1 && a.batch <= kMaxInt32 && a.vocab >= 1 && a.vocab <= kMaxInt32 &&
         a.valid_vocab >= 1 && a.valid_vocab <= a.vocab &&
         FusedControlledShapeSupported(a.weight_dtype, a.valid_vocab, a.hidden_dim) &&
         token_offset >= 0 && token_offset % kMmaTileVocab == 0 &&
         token_offset <= kFusedMaxVocab - a.valid_vocab &&
         reinterpret_cast<uintptr_t>(a.weight) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(a.hidden) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(a.workspace) % 256 == 0 &&
         a.workspace_bytes >= FusedControlledWorkspaceBytes(a.batch, a.valid_vocab, a.hidden_dim);
}

KernelStatus LaunchFusedControlledStage1(const ControlledSampleArgs& a, int64_t token_offset,
                                         cudaStream_t stream) {
  if (!FusedControlledStage1Valid(a, token_offset)) return KernelStatus::kInvalidArgument;
  const FusedControlledTiles t = FusedControlledTilesIn(a.workspace, a.batch, a.valid_vocab);
  unsigned char* const slots_at = static_cast<unsigned char*>(a.workspace) +
                                  SummaryBytes(a.batch, t.tiles) + CandidateBytes(a.batch, t.tiles);
  auto* hidden_rounded = reinterpret_cast<unsigned short*>(slots_at + HeadSlotBytes(a.batch));

  FusedSampleArgs plain;
  plain.weight = a.weight;
  plain.weight_dtype = a.weight_dtype;
  plain.hidden = a.hidden;
  plain.params = a.params;
  plain.batch = a.batch;
  plain.vocab = a.vocab;
  plain.valid_vocab = a.valid_vocab;
  plain.hidden_dim = a.hidden_dim;
  plain.token_offset = token_offset;
  cuda_internal::Stage1Choice choice;
  if (!cuda_internal::ChooseStage1(plain, a.stage1, &choice) ||
      choice.family == cuda_internal::Stage1Choice::kCudaCore ||
      (choice.family == cuda_internal::Stage1Choice::kWgmma &&
       choice.wgmma_schedule == Stage1Kernel::kWgmmaPingpong)) {
    return KernelStatus::kInvalidArgument;
  }
  cuda_internal::MmaControls ctl;
  ctl.controls = a.controls;
  ctl.candidates = static_cast<FusedCandidate*>(t.candidates);
  // The tile-head slots start empty (fused_controls.cuh, kHeadSlots): 256
  // bytes a row, cleared ahead of stage 1 (and of the H rounding before it).
  ctl.head_slots = reinterpret_cast<uint32_t*>(slots_at);
  const cudaError_t cleared = cudaMemsetAsync(
      slots_at, 0, static_cast<size_t>(a.batch) * cuda_internal::kHeadSlots * sizeof(uint32_t), stream);
  if (cleared != cudaSuccess) return cuda_internal::StatusFromCuda(cleared);
  auto* summaries = static_cast<SampleSummary*>(t.summaries);
#if FLASHSAMPLER_HAVE_CUTLASS
  if (choice.family == cuda_internal::Stage1Choice::kWgmma) {
    return cuda_internal::StatusFromCuda(cuda_internal::LaunchWgmmaStage1(
        plain, t.tiles, /*want_lse=*/true, summaries, hidden_rounded, stream,
        choice.wgmma_schedule, &ctl));
  }
#endif
  return cuda_internal::StatusFromCuda(cuda_internal::LaunchMmaStage1(
      plain, t.tiles, /*want_lse=*/true, summaries, hidden_rounded, stream, &ctl));
}

// Grid: one block of 256 threads per row, static shared memory =
// sizeof(FinishShared) (the selection's 256-bin histogram and cub scan
// storage, plus the row's top-k), launched as a programmatic dependent
// (after stage 1 it may start early and waits; after copies it is ordinary).
KernelStatus LaunchFusedControlledStage2(const void* tile_summaries, const void* tile_candidates,
                                         int64_t tiles, int64_t batch, const RowParams* params,
                                         const ControlledDeviceControls& controls,
                                         const ControlledSampleOutputs& outputs,
                                         cudaStream_t stream) {
  if (tile_summaries == nullptr || tile_candidates == nullptr || params == nullptr ||
      !ControlledBuffersValid(controls, outputs) || controls.draft_tokens != nullptr ||
      tiles < 1 || tiles > kFusedMaxVocab / kMmaTileVocab ||
      batch < 1 || batch > kMaxInt32) {
    return KernelStatus::kInvalidArgument;
  }
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cuda_internal::DependentLaunch(
      dim3(static_cast<unsigned>(batch)), dim3(kThreads), 0, stream, &attribute);
  const cudaError_t err = cudaLaunchKernelEx(
      &config, &FusedControlledFinishKernel, static_cast<const SampleSummary*>(tile_summaries),
      static_cast<const FusedCandidate*>(tile_candidates), tiles, params, controls, outputs);
  return cuda_internal::StatusFromCuda(err);
}

KernelStatus LaunchFusedControlledSample(const ControlledSampleArgs& a, cudaStream_t stream) {
  // Stage 2's outputs are checked before stage 1 is enqueued.
  if (!ControlledBuffersValid(a.controls, a.outputs)) return KernelStatus::kInvalidArgument;
  if (const KernelStatus s = LaunchFusedControlledStage1(a, 0, stream); s != KernelStatus::kOk) {
    return s;
  }
  const FusedControlledTiles t = FusedControlledTilesIn(a.workspace, a.batch, a.valid_vocab);
  return LaunchFusedControlledStage2(t.summaries, t.candidates, t.tiles, a.batch, a.params,
                                     a.controls, a.outputs, stream);
}

}  // namespace flashsampler::kernels
