// CpuTiledSampler implementation.
//
// Work split: the vocabulary [0, valid_vocab) is cut into tiles of tile_rows
// tokens and the batch into blocks of at most kMaxRowsPerGemm rows. A work item
// is one (tile, row block): one FixedOrderLogits call writes its
// [rows, tile] logits into the worker's own buffer, then every row of the block
// reduces the tile to a SampleSummary stored at summaries[tile][row]. Workers
// claim items from an atomic counter (a call with fewer items than threads
// wakes only as many threads as there are items; a head of fewer tiles than
// threads, such as a small vocabulary, cuts the batch into smaller row blocks
// so that every thread gets one); after all items are done each row merges
// its tile summaries in tile order. The logits are fully determined by the
// (tile, row block) call, whichever thread makes it, and the merge order is
// fixed, so outputs are bit-identical for any thread count. A row's logits
// depend on its own hidden state alone (fixed_order_logits.h), so its outputs
// are also the same in every batch.
//
// Exact pruning (never changes a result): each worker keeps, per row, the best
// score it has seen so far in this call (a real score of a real token of that
// row). A token is skipped only when an upper bound of its score is strictly
// below that value, so it could neither win nor tie the final merge:
//   1. max l' over a chunk of 64 tokens + kGumbelMax < best: no noise can save
//      any of them, and their Philox blocks are not even generated;
//   2. l' + GumbelBucketBound(r) < best: the logs are not evaluated;
//   3. otherwise the score l' + GumbelFromBits(r) is compared in full.
// fp32 addition is monotone, so fl(l' + g) <= fl(l' + bound) < best. A skipped
// token may leave a tile summary without the tile's own best token, but then
// that token loses to the one that set `best`, so the merged winner (and its
// logit, hence the logprob) is unchanged. The log-sum-exp part of the summaries
// is computed over every token of the tile, independently of pruning.
//
// Draft rows: the item whose tile holds a row's draft token x records l'_x
// (after the tile's log-sum-exp, which must include x) and then sets x's
// logit to -inf in its own buffer for sampled rows, so x can neither win nor
// raise the pruning threshold; -inf + noise stays -inf and loses to any finite
// score. Exactly one item writes each row's draft logit.
#include "kernels/cpu/tiled_sampler.h"


#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <thread>
#include <vector>

#include "kernels/common/gumbel_noise.h"
#include "kernels/common/sample_summary.h"
#include "kernels/cpu/fixed_order_logits.h"
#include "kernels/cpu/gumbel_bucket_bound.h"
#include "kernels/cpu/philox_batch.h"
#include "kernels/cpu/sampler_arguments.h"
#include "kernels/cpu/worker_pool.h"

namespace flashsampler::kernels {
namespace {

// Rows per FixedOrderLogits call: bounds the per-worker logits buffer to
// kMaxRowsPerGemm * tile_rows floats whatever the batch size.
constexpr int64_t kMaxRowsPerGemm = 128;
// Row blocks cut for parallelism are multiples of this many rows, so that the
// micro-kernels' row blocks (fixed_order_logits.cc) stay mostly full.
constexpr int64_t kRowBlockAlign = 4;

// log Z is summed per chunk of 64 tokens aligned to global ids (the noise's
// chunks), and the chunks are folded in token order, when every tile is made
// of whole chunks (tile_rows a multiple of 64, or a single tile): then its
// bits do not depend on tile_rows either. Otherwise per tile, in tile order.
constexpr int64_t kLseChunk = 64;

// max of x[0, n), NaN elements ignored. Eight independent running maxima (in
// place of one serial chain) keep the latency of maxss off the critical path.
float MaxOf(const float* x, int64_t n) {
  constexpr int kLanes = 8;
  float m[kLanes];
  for (float& v : m) v = -INFINITY;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) m[k] = std::max(m[k], x[i + k]);
  }
  for (; i < n; ++i) m[0] = std::max(m[0], x[i]);
  float out = m[0];
  for (int k = 1; k < kLanes; ++k) out = std::max(out, m[k]);
  return out;
}

// The log-sum-exp part of a tile summary: max of the transformed logits and the
// sum of exp(l' - max), in index order. scale > 0 and fp32 rounding is
// monotone, so max(l * scale) == max(l) * scale exactly.
void TileLogSumExp(const float* logits, int64_t n, float scale, SampleSummary* s) {
  const float m = MaxOf(logits, n) * scale;
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += expf(logits[j] * scale - m);
  s->max_logit = m;
  s->sum_exp = sum;
}

// The same per chunk of kLseChunk tokens (the last one shorter), chunk c of
// the tile into out[c * stride]. A chunk's sum depends on its own logits
// only, so where the tiles are whole chunks, folding the chunks in token
// order gives log Z bits that no tile size changes.
void ChunkLogSumExp(const float* logits, int64_t n, float scale, SampleSummary* out,
                    int64_t stride) {
  for (int64_t c = 0; c * kLseChunk < n; ++c) {
    const int64_t j0 = c * kLseChunk;
    SampleSummary* s = out + c * stride;
    *s = EmptySampleSummary();
    TileLogSumExp(logits + j0, std::min(kLseChunk, n - j0), scale, s);
  }
}

// Greedy row: score = l', prune when l' < best. `!(x >= y)` also skips NaN
// logits (non-finite weights), which must never win.
void TileGreedy(const float* logits, int64_t n, int64_t first_token, float scale, float* best,
                SampleSummary* s) {
  float threshold = *best;
  for (int64_t j = 0; j < n; ++j) {
    const float l = logits[j] * scale;
    if (!(l >= threshold)) continue;
    const int32_t token = static_cast<int32_t>(first_token + j);
    if (ScoreBeats(l, token, s->best_score, s->best_index)) {
      s->best_score = l;
      s->best_index = token;
      s->best_logit = l;
      threshold = l;
    }
  }
  *best = threshold;
}

// Sampled row: score = l' + GumbelNoise(seed, offset, stream, token), with the
// exact pruning described at the top of the file. Tokens go in chunks of 64
// aligned to global ids (16 Philox blocks): a chunk whose largest l' cannot
// reach the threshold even with kGumbelMax is skipped without noise; otherwise
// its 64 noise words come from one PhiloxNoiseWords call and each token is
// screened with the bucket bound before its logs are taken. The chunk-level
// test uses the threshold at the chunk's start, which is never above the
// current one, so it is exact too.
void TileGumbel(const float* logits, int64_t n, int64_t first_token, float scale,
                const RowParams& p, const GumbelBucketBound& bound, float* best,
                SampleSummary* s) {
  alignas(64) float scaled[kPhiloxBatchWords];
  alignas(64) uint32_t words[kPhiloxBatchWords];
  alignas(64) uint8_t maybe[kPhiloxBatchWords] = {};  // lanes >= count: stale, never used alone
  float threshold = *best;
  for (int64_t j = 0; j < n;) {
    const int64_t token = first_token + j;
    const int64_t chunk_first = token & ~int64_t{kPhiloxBatchWords - 1};
    const int lane0 = static_cast<int>(token - chunk_first);
    const int count = static_cast<int>(std::min<int64_t>(kPhiloxBatchWords - lane0, n - j));
    for (int i = 0; i < count; ++i) scaled[i] = logits[j + i] * scale;
    const float chunk_max = MaxOf(scaled, count);
    if (chunk_max + kGumbelMax >= threshold) {
      PhiloxNoiseWords(p.seed, p.offset, p.stream, static_cast<uint32_t>(chunk_first >> 2), words);
      // Screen all lanes at once (vectorised) for a superset of the tokens
      // that pass the bucket bound: outside the top bucket the bound is at
      // most below_top_bound(), inside it at most kGumbelMax. The sums are
      // formed as in the exact test, so by fp32 monotonicity nothing that
      // would pass it is screened out.
      const float below_top = bound.below_top_bound();
      for (int i = 0; i < count; ++i) {
        const float l = scaled[i];
        const bool top = words[lane0 + i] >= GumbelBucketBound::kTopBucketFirstWord;
        maybe[i] = (l + below_top >= threshold) | (top & (l + kGumbelMax >= threshold));
      }
      for (int i = 0; i < count; ++i) {
        if ((i & 7) == 0) {  // skip 8 lanes at a time: most are screened out
          uint64_t group;
          std::memcpy(&group, maybe + i, sizeof group);
          if (group == 0) {
            i += 7;
            continue;
          }
        }
        if (!maybe[i]) continue;
        const float l = scaled[i];
        const uint32_t r = words[lane0 + i];
        if (l + bound(r) < threshold) continue;
        const float score = l + GumbelFromBits(r);
        if (!(score >= threshold)) continue;
        const int32_t id = static_cast<int32_t>(token + i);
        if (ScoreBeats(score, id, s->best_score, s->best_index)) {
          s->best_score = score;
          s->best_index = id;
          s->best_logit = l;
          threshold = score;
        }
      }
    }
    j += count;
  }
  *best = threshold;
}

}  // namespace

struct CpuTiledSampler::Impl {
  Impl(TokenPanels w, int64_t v, int64_t vv, int64_t d, CpuSamplerConfig config)
      : weight(w),
        vocab(v),
        valid_vocab(vv),
        hidden(d),
        tile_rows(std::min(config.tile_rows, vv)),
        config_ok(ValidSamplerShape(w, v, vv, d, config)),
        pool(ResolveSamplerThreads(config.num_threads)) {}

  KernelStatus Sample(const float* hidden_states, int64_t batch, const RowParams* params,
                      const int32_t* draft_tokens, CpuSampleOutputs outputs);
  void RunItem(int64_t item, int worker, const float* hidden_states, int64_t batch,
               const RowParams* params, const int32_t* draft_tokens, bool want_lse);

  TokenPanels weight;
  int64_t vocab;
  int64_t valid_vocab;
  int64_t hidden;
  int64_t tile_rows;
  bool config_ok;
  WorkerPool pool;
  GumbelBucketBound bound;

  // Scratch, grown on demand and reused across calls.
  std::vector<std::vector<float>> logits;      // [worker][kMaxRowsPerGemm * tile_rows]
  std::vector<std::vector<float>> row_best;    // [worker][batch]
  std::vector<SampleSummary> tile_summaries;   // [num_tiles][batch]
  std::vector<SampleSummary> chunk_lse;        // [num_chunks][batch] (chunked log Z)
  bool chunked_lse = false;
  std::vector<SampleSummary> merged;           // [batch]
  std::vector<float> draft_logit;              // [batch] l'_x of draft rows
  int64_t num_tiles = 0;
  int64_t rows_per_gemm = 0;
  int64_t row_blocks = 0;
};

void CpuTiledSampler::Impl::RunItem(int64_t item, int worker, const float* hidden_states,
                                    int64_t batch, const RowParams* params,
                                    const int32_t* draft_tokens, bool want_lse) {
  const int64_t tile = item / row_blocks;
  const int64_t row0 = (item % row_blocks) * rows_per_gemm;
  const int64_t rows = std::min(rows_per_gemm, batch - row0);
  const int64_t token0 = tile * tile_rows;
  const int64_t n = std::min(tile_rows, valid_vocab - token0);
  float* buf = logits[worker].data();
  // buf[r * n + j] = h_{row0 + r} . w_{token0 + j}
  FixedOrderLogits(hidden_states + row0 * hidden, rows, weight, token0, n, hidden, buf);
  float* best = row_best[worker].data();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = row0 + r;
    const RowParams& p = params[row];
    const float scale = LogitScale(p);
    float* l = buf + r * n;
    SampleSummary s = EmptySampleSummary();
    if (want_lse) {
      if (chunked_lse) {
        ChunkLogSumExp(l, n, scale, chunk_lse.data() + (token0 / kLseChunk) * batch + row, batch);
      } else {
        TileLogSumExp(l, n, scale, &s);
      }
    }
    const int64_t draft = draft_tokens != nullptr ? draft_tokens[row] : -1;
    if (draft >= token0 && draft < token0 + n) {
      draft_logit[row] = l[draft - token0] * scale;
      if (p.temperature != 0.0f) l[draft - token0] = -INFINITY;  // the residual excludes x
    }
    if (p.temperature == 0.0f) {
      TileGreedy(l, n, token0, scale, &best[row], &s);
    } else {
      TileGumbel(l, n, token0, scale, p, bound, &best[row], &s);
    }
    tile_summaries[tile * batch + row] = s;
  }
}

KernelStatus CpuTiledSampler::Impl::Sample(const float* hidden_states, int64_t batch,
                                           const RowParams* params,
                                           const int32_t* draft_tokens, CpuSampleOutputs outputs) {
  if (!config_ok || hidden_states == nullptr || params == nullptr ||
      outputs.token_ids == nullptr || batch <= 0 || batch > kMaxInt32 ||
      (draft_tokens != nullptr && outputs.draft_logprobs == nullptr)) {
    return KernelStatus::kInvalidArgument;
  }
  bool any_draft = false;
  if (draft_tokens != nullptr) {
    for (int64_t b = 0; b < batch; ++b) {
      if (draft_tokens[b] < -1 || draft_tokens[b] >= valid_vocab) return KernelStatus::kInvalidArgument;
      any_draft = any_draft || draft_tokens[b] >= 0;
    }
  }
  if (!any_draft) draft_tokens = nullptr;
  for (int64_t b = 0; b < batch; ++b) {
    if (!ValidSamplerTemperature(params[b].temperature)) return KernelStatus::kInvalidArgument;
  }
  if (!AllFinite(hidden_states, batch * hidden)) return KernelStatus::kInvalidArgument;

  const int workers = pool.num_threads();
  num_tiles = (valid_vocab + tile_rows - 1) / tile_rows;
  chunked_lse = num_tiles == 1 || tile_rows % kLseChunk == 0;
  const int64_t num_chunks = (valid_vocab + kLseChunk - 1) / kLseChunk;
  rows_per_gemm = std::min(batch, kMaxRowsPerGemm);
  if (num_tiles < workers) {
    // Fewer tiles than threads: cut the rows so each thread gets an item. A
    // row's logits do not depend on its block (fixed_order_logits.h), so the
    // bits do not change.
    const int64_t blocks_wanted = (workers + num_tiles - 1) / num_tiles;
    const int64_t rows = (batch + blocks_wanted - 1) / blocks_wanted;
    rows_per_gemm = std::min(rows_per_gemm, (rows + kRowBlockAlign - 1) / kRowBlockAlign * kRowBlockAlign);
  }
  row_blocks = (batch + rows_per_gemm - 1) / rows_per_gemm;
  try {
    logits.resize(workers);
    row_best.resize(workers);
    for (int w = 0; w < workers; ++w) {
      logits[w].resize(static_cast<size_t>(rows_per_gemm * tile_rows));
      row_best[w].assign(static_cast<size_t>(batch), -INFINITY);
    }
    tile_summaries.resize(static_cast<size_t>(num_tiles * batch));
    if (chunked_lse) chunk_lse.resize(static_cast<size_t>(num_chunks * batch));
    merged.resize(static_cast<size_t>(batch));
    draft_logit.assign(static_cast<size_t>(batch), NAN);
  } catch (const std::bad_alloc&) {
    return KernelStatus::kOutOfMemory;
  }

  // Draft rows need log Z for log p(x).
  const bool want_lse =
      outputs.logz != nullptr || outputs.logprobs != nullptr || draft_tokens != nullptr;
  const int64_t items = num_tiles * row_blocks;
  std::atomic<int64_t> next_item{0};
  pool.RunOn(static_cast<int>(std::min<int64_t>(items, workers)), [&](int worker) {
    for (int64_t item = next_item.fetch_add(1, std::memory_order_relaxed); item < items;
         item = next_item.fetch_add(1, std::memory_order_relaxed)) {
      RunItem(item, worker, hidden_states, batch, params, draft_tokens, want_lse);
    }
  });

  // Merge in tile order (fixed, so logz rounds the same for any thread count),
  // and with chunked log Z fold the chunks in token order (the tile
  // summaries then carry an empty log-sum-exp). A row without a winner only
  // happens when every logit is NaN (non-finite weights); report it before
  // writing any output.
  std::fill(merged.begin(), merged.end(), EmptySampleSummary());
  for (int64_t t = 0; t < num_tiles; ++t) {
    const SampleSummary* tile_row = tile_summaries.data() + t * batch;
    for (int64_t b = 0; b < batch; ++b) merged[b] = MergeSummaries(merged[b], tile_row[b]);
  }
  if (want_lse && chunked_lse) {
    for (int64_t b = 0; b < batch; ++b) {
      SampleSummary lse = EmptySampleSummary();
      for (int64_t c = 0; c < num_chunks; ++c) lse = MergeSummaries(lse, chunk_lse[c * batch + b]);
      merged[b].max_logit = lse.max_logit;
      merged[b].sum_exp = lse.sum_exp;
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (merged[b].best_index < 0) return KernelStatus::kInvalidArgument;
  }
  for (int64_t b = 0; b < batch; ++b) {
    outputs.token_ids[b] = merged[b].best_index;
    if (want_lse) {
      const float logz = SummaryLogZ(merged[b]);
      if (outputs.logz != nullptr) outputs.logz[b] = logz;
      if (outputs.logprobs != nullptr) outputs.logprobs[b] = merged[b].best_logit - logz;
      if (outputs.draft_logprobs != nullptr) {
        outputs.draft_logprobs[b] =
            draft_tokens != nullptr && draft_tokens[b] >= 0 ? draft_logit[b] - logz : NAN;
      }
    }
  }
  if (!want_lse && outputs.draft_logprobs != nullptr) {
    std::fill(outputs.draft_logprobs, outputs.draft_logprobs + batch, NAN);
  }
  return KernelStatus::kOk;
}

CpuTiledSampler::CpuTiledSampler(TokenPanels weight, int64_t vocab, int64_t valid_vocab,
                                 int64_t hidden, CpuSamplerConfig config)
    : impl_(std::make_unique<Impl>(weight, vocab, valid_vocab, hidden, config)) {}

CpuTiledSampler::~CpuTiledSampler() = default;

KernelStatus CpuTiledSampler::Sample(const float* hidden_states, int64_t batch,
                                     const RowParams* params, CpuSampleOutputs outputs) {
  return impl_->Sample(hidden_states, batch, params, nullptr, outputs);
}

KernelStatus CpuTiledSampler::Sample(const float* hidden_states, int64_t batch,
                                     const RowParams* params, const int32_t* draft_tokens,
                                     CpuSampleOutputs outputs) {
  return impl_->Sample(hidden_states, batch, params, draft_tokens, outputs);
}

int CpuTiledSampler::num_threads() const { return impl_->pool.num_threads(); }

}  // namespace flashsampler::kernels
