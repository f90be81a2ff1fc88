// SampleSummary: what one slice of the vocabulary (a tile, a thread's range, a
// GPU shard) contributes to one row's sample, and the one function that merges
// two such summaries. Every reduction in FlashSampler (tiles, threads, shards)
// goes through MergeSummaries, so all of them agree.
//
// Exactness: the sample is argmax_i (l_i + g_i) over the whole vocabulary, and
// max decomposes over any partition, so merging the slices' winners gives the
// global winner. Ties on the score go to the lower token id, which makes the
// merge commutative and associative: the result does not depend on how the
// vocabulary was cut or in what order the slices were merged. The log-sum-exp
// part (max_logit, sum_exp) is combined by rescaling to the larger max; its
// rounding depends on merge order, so callers merge slices in a fixed order
// when they want bit-identical logz.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/host_device.h"

namespace flashsampler {

struct SampleSummary {
  float best_score;   // max over the slice of transformed logit + noise
  int32_t best_index; // global token id of best_score; -1 for an empty slice
  float best_logit;   // transformed logit of best_index (for its log-prob)
  float max_logit;    // max transformed logit of the slice (-inf if empty)
  float sum_exp;      // sum over the slice of exp(logit - max_logit)
};

FS_HOST_DEVICE FS_FORCE_INLINE SampleSummary EmptySampleSummary() {
  return SampleSummary{-INFINITY, -1, -INFINITY, -INFINITY, 0.0f};
}

// True when (score_a, index_a) beats (score_b, index_b): higher score, or the
// same score and a lower (valid) index.
FS_HOST_DEVICE FS_FORCE_INLINE bool ScoreBeats(float score_a, int32_t index_a, float score_b,
                                               int32_t index_b) {
  if (index_a < 0) return false;
  if (index_b < 0) return true;
  return score_a > score_b || (score_a == score_b && index_a < index_b);
}

FS_HOST_DEVICE FS_FORCE_INLINE SampleSummary MergeSummaries(const SampleSummary& a,
                                                            const SampleSummary& b) {
  SampleSummary out = ScoreBeats(b.best_score, b.best_index, a.best_score, a.best_index) ? b : a;
  // Online log-sum-exp: rescale the smaller partial sum to the larger max.
  // An empty side has max -inf and sum 0 and must not produce exp(-inf + inf).
  if (a.max_logit == -INFINITY) {
    out.max_logit = b.max_logit;
    out.sum_exp = b.sum_exp;
  } else if (b.max_logit == -INFINITY) {
    out.max_logit = a.max_logit;
    out.sum_exp = a.sum_exp;
  } else if (a.max_logit >= b.max_logit) {
    out.max_logit = a.max_logit;
    out.sum_exp = a.sum_exp + b.sum_exp * expf(b.max_logit - a.max_logit);
  } else {
    out.max_logit = b.max_logit;
    out.sum_exp = b.sum_exp + a.sum_exp * expf(a.max_logit - b.max_logit);
  }
  return out;
}

// log Z of a merged summary: log sum_i exp(l_i) = max + log(sum_exp).
FS_HOST_DEVICE FS_FORCE_INLINE float SummaryLogZ(const SampleSummary& s) {
  return s.max_logit + logf(s.sum_exp);
}

}  // namespace flashsampler
