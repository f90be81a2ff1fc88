// CpuControlledSampler implementation.
//
// Rows go in blocks of ControlledRowsPerBlock(valid_vocab). Within a block, work items are
// vocabulary tiles of tile_rows tokens; each item is one single-threaded
// sgemm of [block rows, tile] logits into the worker's own buffer (the same
// call in both paths, so the logits are bit-identical), after which:
//  - kFused: each row's RowLogitProcessor transforms the tile and the finite
//    l' enter the worker's bounded top-k heap of that row. A token in the
//    global top-k (a total order: l' desc, id asc) is in the top-k of every
//    slice containing it, so the union of the workers' heaps holds the global
//    top-k whatever the thread count or the tiles each worker took.
//  - kMaterialized: the tile is copied into the block's full logits rows;
//    after all tiles each row is transformed as a whole and every finite l'
//    becomes a candidate.
// Then SampleFromCandidates finishes each row (rows in parallel).
#include "kernels/cpu/controlled_sampler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <thread>
#include <vector>

#include "kernels/cpu/candidate_sampler.h"
#include "kernels/cpu/fixed_order_logits.h"
#include "kernels/cpu/row_logit_processor.h"
#include "kernels/cpu/sampler_arguments.h"
#include "kernels/cpu/worker_pool.h"

namespace flashsampler::kernels {
namespace {

bool FusedServes(const RowControls& c) {
  return c.top_k >= 1 && c.top_k <= kCpuFusedMaxTopK &&
         !(c.top_logprobs > 0 && c.logprobs_mode == LogprobsMode::kRaw);
}

// Offers `x` to a heap holding the best `k` candidates seen (worst at front).
void OfferToTopK(std::vector<Candidate>* heap, size_t k, Candidate x) {
  if (heap->size() < k) {
    heap->push_back(x);
    std::push_heap(heap->begin(), heap->end(), CandidateOrder());
  } else if (CandidateBefore(x, heap->front())) {
    std::pop_heap(heap->begin(), heap->end(), CandidateOrder());
    heap->back() = x;
    std::push_heap(heap->begin(), heap->end(), CandidateOrder());
  }
}

}  // namespace

int64_t ControlledRowsPerBlock(int64_t valid_vocab) {
  return std::clamp<int64_t>((int64_t{1} << 22) / std::max<int64_t>(valid_vocab, 1), 16, 1024);
}

CpuControlledPath PlanCpuControlledPath(const RowControls* controls, int64_t batch) {
  for (int64_t b = 0; b < batch; ++b) {
    if (!FusedServes(controls[b])) return CpuControlledPath::kMaterialized;
  }
  return CpuControlledPath::kFused;
}

struct CpuControlledSampler::Impl {
  Impl(TokenPanels w, int64_t v, int64_t vv, int64_t d, CpuSamplerConfig config)
      : weight(w),
        vocab(v),
        valid_vocab(vv),
        hidden(d),
        tile_rows(std::min(config.tile_rows, vv)),
        config_ok(ValidSamplerShape(w, v, vv, d, config)),
        pool(ResolveSamplerThreads(config.num_threads)) {}

  KernelStatus Sample(const float* hidden_states, int64_t batch, const RowParams* params,
                      const RowControls* controls, const int32_t* draft_tokens,
                      CpuControlledPath path, CpuControlledOutputs outputs);
  // One block of `rows` rows starting at `row0`.
  KernelStatus RunBlock(const float* hidden_states, int64_t row0, int64_t rows,
                        const RowParams* params, const RowControls* controls,
                        const int32_t* draft_tokens, bool fused, CpuControlledOutputs outputs);

  TokenPanels weight;
  int64_t vocab;
  int64_t valid_vocab;
  int64_t hidden;
  int64_t tile_rows;
  bool config_ok;
  WorkerPool pool;

  std::vector<std::vector<float>> logits;     // [worker][rows * tile_rows]
  std::vector<std::vector<float>> processed;  // [worker][max(tile_rows, valid_vocab)]
  std::vector<std::vector<std::vector<Candidate>>> top;  // [worker][row in block] (fused)
  std::vector<std::vector<Candidate>> candidates;        // [worker] (finishing a row)
  std::vector<float> block_logits;                       // [rows, valid_vocab] (materialized)
};

KernelStatus CpuControlledSampler::Impl::RunBlock(const float* hidden_states, int64_t row0,
                                                  int64_t rows, const RowParams* params,
                                                  const RowControls* controls,
                                                  const int32_t* draft_tokens, bool fused,
                                                  CpuControlledOutputs outputs) {
  const int workers = pool.num_threads();
  std::vector<RowLogitProcessor> processors;
  processors.reserve(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    processors.emplace_back(controls[row0 + r], LogitScale(params[row0 + r]));
  }
  if (fused) {
    for (auto& worker_top : top) {
      for (auto& heap : worker_top) heap.clear();
    }
  }
  const float* block_hidden = hidden_states + row0 * hidden;
  const int64_t num_tiles = (valid_vocab + tile_rows - 1) / tile_rows;
  std::atomic<int64_t> next_tile{0};
  pool.RunOn(static_cast<int>(std::min<int64_t>(num_tiles, workers)), [&](int w) {
    for (int64_t t = next_tile.fetch_add(1, std::memory_order_relaxed); t < num_tiles;
         t = next_tile.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t token0 = t * tile_rows;
      const int64_t n = std::min(tile_rows, valid_vocab - token0);
      float* buf = logits[w].data();
      FixedOrderLogits(block_hidden, rows, weight, token0, n, hidden, buf);
      for (int64_t r = 0; r < rows; ++r) {
        if (!fused) {
          std::memcpy(block_logits.data() + r * valid_vocab + token0, buf + r * n,
                      static_cast<size_t>(n) * sizeof(float));
          continue;
        }
        float* l = processed[w].data();
        processors[r].Process(token0, n, buf + r * n, l);
        std::vector<Candidate>& heap = top[w][r];
        const size_t k = static_cast<size_t>(controls[row0 + r].top_k);
        for (int64_t j = 0; j < n; ++j) {
          // Not finite: disallowed (-inf) or overflowed; never a candidate.
          if (!std::isfinite(l[j])) continue;
          if (heap.size() == k && l[j] < heap.front().logit) continue;
          OfferToTopK(&heap, k, Candidate{l[j], static_cast<int32_t>(token0 + j)});
        }
      }
    }
  });

  std::vector<KernelStatus> status(static_cast<size_t>(rows), KernelStatus::kOk);
  std::atomic<int64_t> next_row{0};
  pool.RunOn(static_cast<int>(std::min<int64_t>(rows, workers)), [&](int w) {
    for (int64_t r = next_row.fetch_add(1, std::memory_order_relaxed); r < rows;
         r = next_row.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t row = row0 + r;
      std::vector<Candidate>& cands = candidates[w];
      cands.clear();
      const float* raw = nullptr;
      if (fused) {
        for (int v = 0; v < workers; ++v) cands.insert(cands.end(), top[v][r].begin(), top[v][r].end());
      } else {
        raw = block_logits.data() + r * valid_vocab;
        float* l = processed[w].data();
        processors[r].Process(0, valid_vocab, raw, l);
        for (int64_t i = 0; i < valid_vocab; ++i) {
          if (std::isfinite(l[i])) cands.push_back(Candidate{l[i], static_cast<int32_t>(i)});
        }
      }
      CandidateRowOutputs out{outputs.token_ids + row,
                              outputs.logz != nullptr ? outputs.logz + row : nullptr,
                              outputs.logprobs != nullptr ? outputs.logprobs + row : nullptr,
                              outputs.details + row,
                              outputs.draft_logprobs != nullptr ? outputs.draft_logprobs + row : nullptr};
      const int32_t draft = draft_tokens != nullptr ? draft_tokens[row] : -1;
      if (draft < 0 && out.draft_logprob != nullptr) *out.draft_logprob = NAN;
      status[r] = SampleFromCandidates(&cands, params[row], controls[row], raw, valid_vocab, out, draft);
    }
  });
  for (KernelStatus s : status) {
    if (s != KernelStatus::kOk) return s;
  }
  return KernelStatus::kOk;
}

KernelStatus CpuControlledSampler::Impl::Sample(const float* hidden_states, int64_t batch,
                                                const RowParams* params,
                                                const RowControls* controls,
                                                const int32_t* draft_tokens,
                                                CpuControlledPath path,
                                                CpuControlledOutputs outputs) {
  if (!config_ok || hidden_states == nullptr || params == nullptr || controls == nullptr ||
      outputs.token_ids == nullptr || outputs.details == nullptr || batch <= 0 ||
      batch > kMaxInt32 || (draft_tokens != nullptr && outputs.draft_logprobs == nullptr)) {
    return KernelStatus::kInvalidArgument;
  }
  if (draft_tokens != nullptr) {
    for (int64_t b = 0; b < batch; ++b) {
      if (draft_tokens[b] < -1 || draft_tokens[b] >= valid_vocab) return KernelStatus::kInvalidArgument;
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (!ValidSamplerTemperature(params[b].temperature) ||
        !ValidRowControls(controls[b], vocab, valid_vocab)) {
      return KernelStatus::kInvalidArgument;
    }
  }
  if (!AllFinite(hidden_states, batch * hidden)) return KernelStatus::kInvalidArgument;
  const bool fused = path == CpuControlledPath::kFused;
  if (fused && PlanCpuControlledPath(controls, batch) != CpuControlledPath::kFused) {
    return KernelStatus::kInvalidArgument;
  }
  const int workers = pool.num_threads();
  const int64_t block = std::min(batch, ControlledRowsPerBlock(valid_vocab));
  try {
    logits.resize(workers);
    processed.resize(workers);
    candidates.resize(workers);
    for (int w = 0; w < workers; ++w) {
      logits[w].resize(static_cast<size_t>(block * tile_rows));
      processed[w].resize(static_cast<size_t>(fused ? tile_rows : valid_vocab));
      candidates[w].reserve(static_cast<size_t>(fused ? workers * kCpuFusedMaxTopK : valid_vocab));
    }
    if (fused) {
      top.resize(workers);
      for (auto& worker_top : top) {
        worker_top.resize(static_cast<size_t>(block));
        for (auto& heap : worker_top) heap.reserve(kCpuFusedMaxTopK);
      }
    } else {
      block_logits.resize(static_cast<size_t>(block * valid_vocab));
    }
  } catch (const std::bad_alloc&) {
    return KernelStatus::kOutOfMemory;
  }
  for (int64_t row0 = 0; row0 < batch; row0 += block) {
    const int64_t rows = std::min(block, batch - row0);
    if (KernelStatus s =
            RunBlock(hidden_states, row0, rows, params, controls, draft_tokens, fused, outputs);
        s != KernelStatus::kOk) {
      return s;
    }
  }
  return KernelStatus::kOk;
}

CpuControlledSampler::CpuControlledSampler(TokenPanels weight, int64_t vocab, int64_t valid_vocab,
                                           int64_t hidden, CpuSamplerConfig config)
    : impl_(std::make_unique<Impl>(weight, vocab, valid_vocab, hidden, config)) {}

CpuControlledSampler::~CpuControlledSampler() = default;

KernelStatus CpuControlledSampler::Sample(const float* hidden_states, int64_t batch,
                                          const RowParams* params, const RowControls* controls,
                                          CpuControlledPath path, CpuControlledOutputs outputs) {
  return impl_->Sample(hidden_states, batch, params, controls, nullptr, path, outputs);
}

KernelStatus CpuControlledSampler::Sample(const float* hidden_states, int64_t batch,
                                          const RowParams* params, const RowControls* controls,
                                          const int32_t* draft_tokens, CpuControlledPath path,
                                          CpuControlledOutputs outputs) {
  return impl_->Sample(hidden_states, batch, params, controls, draft_tokens, path, outputs);
}

}  // namespace flashsampler::kernels
