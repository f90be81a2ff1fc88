#include "kernels/cpu/candidate_sampler.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/gumbel_noise.h"
#include "kernels/common/sample_summary.h"
#include "kernels/cpu/gumbel_bucket_bound.h"

namespace flashsampler::kernels {
namespace {

float MaxLogit(const std::vector<Candidate>& c) {
  float m = -INFINITY;
  for (const Candidate& x : c) m = std::max(m, x.logit);
  return m;
}

// log sum exp over the candidates, float64, summed in vector order.
double LogSumExp(const std::vector<Candidate>& c) {
  const double m = MaxLogit(c);
  double sum = 0.0;
  for (const Candidate& x : c) sum += std::exp(static_cast<double>(x.logit) - m);
  return m + std::log(sum);
}

void ApplyMinP(std::vector<Candidate>* c, float min_p) {
  const double m = MaxLogit(*c);
  c->erase(std::remove_if(c->begin(), c->end(),
                          [&](const Candidate& x) {
                            return !(std::exp(static_cast<double>(x.logit) - m) >=
                                     static_cast<double>(min_p));
                          }),
           c->end());
}

// Sets of up to this many candidates are sorted whole before the top-p cut
// (every set the fused path produces is, so both paths make identical cuts);
// larger ones (top_p without top_k over a big vocabulary) sort only a growing
// head, which is all the cut needs.
constexpr size_t kSortWholeMax = 4096;
constexpr size_t kFirstHead = 256;

// Keeps the shortest prefix, in canonical order, of `c` whose mass reaches
// top_p of the total; leaves that prefix sorted. The float64 total is summed in
// the order `c` arrives in.
void ApplyTopP(std::vector<Candidate>* c, float top_p) {
  const double m = MaxLogit(*c);
  double total = 0.0;
  for (const Candidate& x : *c) total += std::exp(static_cast<double>(x.logit) - m);
  const double target = static_cast<double>(top_p) * total;
  // The nucleus of a peaked distribution is a few tokens: start small.
  for (size_t head = std::min(c->size(), kFirstHead);; head = std::min(c->size(), head * 8)) {
    if (head < c->size()) {
      std::nth_element(c->begin(), c->begin() + head, c->end(), CandidateOrder());
    }
    std::sort(c->begin(), c->begin() + head, CandidateOrder());
    double before = 0.0;
    size_t keep = 0;
    while (keep < head && before < target) {
      before += std::exp(static_cast<double>((*c)[keep].logit) - m);
      ++keep;
    }
    // The cut lies inside the sorted head unless the whole head stayed below
    // the target and more candidates remain.
    if (keep < head || before >= target || head == c->size()) {
      c->resize(std::max<size_t>(keep, 1));
      return;
    }
  }
}

// Sample j's token: argmax of l' + noise on stream (stream + j * stride), or of
// l' alone for greedy rows; ties to the lower id (ScoreBeats). Exact pruning as
// in the tiled sampler: a token whose l' + (an upper bound of its noise) is
// strictly below the best score cannot win or tie, so its logarithms are
// skipped; in sorted order, once l' + kGumbelMax is below it, every later
// token is too. Token `exclude` (-1: none) is skipped (a draft's residual).
int32_t DrawSample(const std::vector<Candidate>& c, bool sorted, const RowParams& p,
                   uint32_t stream, int32_t exclude) {
  static const GumbelBucketBound bound;
  float best_score = -INFINITY;
  int32_t best = -1;
  for (const Candidate& x : c) {
    if (x.id == exclude) continue;
    if (p.temperature == 0.0f) {
      if (ScoreBeats(x.logit, x.id, best_score, best)) best_score = x.logit, best = x.id;
      continue;
    }
    if (x.logit + kGumbelMax < best_score) {
      if (sorted) break;
      continue;
    }
    const uint32_t r = NoiseBits(p.seed, p.offset, stream, static_cast<uint32_t>(x.id));
    if (x.logit + bound(r) < best_score) continue;
    const float score = x.logit + GumbelFromBits(r);
    if (ScoreBeats(score, x.id, best_score, best)) {
      best_score = score;
      best = x.id;
    }
  }
  return best;
}

// vLLM's rank: how many of `values` are >= `v`.
template <typename Values>
int32_t RankOf(const Values& values, float v) {
  int32_t rank = 0;
  for (float x : values) rank += x >= v ? 1 : 0;
  return rank;
}

void FillSampledModeDetail(std::vector<Candidate>* kept, double logz, int32_t n,
                           RowSampleDetail* d) {
  std::vector<float> logits(kept->size());
  for (size_t i = 0; i < kept->size(); ++i) logits[i] = (*kept)[i].logit;
  for (int32_t token : d->token_ids) {
    const auto it = std::find_if(kept->begin(), kept->end(),
                                 [token](const Candidate& x) { return x.id == token; });
    d->logprobs.push_back(static_cast<float>(it->logit - logz));
    d->ranks.push_back(RankOf(logits, it->logit));
  }
  const size_t top = std::min<size_t>(static_cast<size_t>(n), kept->size());
  std::partial_sort(kept->begin(), kept->begin() + top, kept->end(), CandidateOrder());
  for (size_t i = 0; i < top; ++i) {
    d->top.push_back(TokenLogprob{(*kept)[i].id, static_cast<float>((*kept)[i].logit - logz)});
  }
}

void FillRawModeDetail(const float* raw, int64_t valid_vocab, int32_t n, RowSampleDetail* d) {
  double m = -INFINITY;
  for (int64_t i = 0; i < valid_vocab; ++i) m = std::max(m, static_cast<double>(raw[i]));
  double sum = 0.0;
  for (int64_t i = 0; i < valid_vocab; ++i) sum += std::exp(raw[i] - m);
  const double logz = m + std::log(sum);
  const std::vector<float> values(raw, raw + valid_vocab);
  for (int32_t token : d->token_ids) {
    d->logprobs.push_back(static_cast<float>(raw[token] - logz));
    d->ranks.push_back(RankOf(values, raw[token]));
  }
  std::vector<Candidate> all(static_cast<size_t>(valid_vocab));
  for (int64_t i = 0; i < valid_vocab; ++i) all[i] = Candidate{raw[i], static_cast<int32_t>(i)};
  const size_t top = std::min<size_t>(static_cast<size_t>(n), all.size());
  std::partial_sort(all.begin(), all.begin() + top, all.end(), CandidateOrder());
  for (size_t i = 0; i < top; ++i) {
    d->top.push_back(TokenLogprob{all[i].id, static_cast<float>(all[i].logit - logz)});
  }
}

}  // namespace

KernelStatus SampleFromCandidates(std::vector<Candidate>* candidates, const RowParams& params,
                                  const RowControls& controls, const float* raw_row,
                                  int64_t valid_vocab, CandidateRowOutputs outputs,
                                  int32_t draft_token) {
  std::vector<Candidate>& c = *candidates;
  const bool raw_mode = controls.top_logprobs > 0 && controls.logprobs_mode == LogprobsMode::kRaw;
  if (raw_mode && raw_row == nullptr) return KernelStatus::kInvalidArgument;
  if (draft_token >= 0 && outputs.draft_logprob == nullptr) return KernelStatus::kInvalidArgument;
  if (c.empty()) return KernelStatus::kFailedPrecondition;
  if (controls.min_p > 0.0f) ApplyMinP(&c, controls.min_p);
  const bool ordered = controls.top_k > 0 || controls.top_p < 1.0f;
  if (controls.top_k > 0 && c.size() > static_cast<size_t>(controls.top_k)) {
    std::nth_element(c.begin(), c.begin() + (controls.top_k - 1), c.end(), CandidateOrder());
    c.resize(static_cast<size_t>(controls.top_k));
  }
  // Canonical order first for sets the fused path can also produce (so both
  // sum the top-p total identically); ApplyTopP sorts what it keeps.
  if (controls.top_k > 0 || (ordered && c.size() <= kSortWholeMax)) {
    std::sort(c.begin(), c.end(), CandidateOrder());
  }
  if (controls.top_p < 1.0f) ApplyTopP(&c, controls.top_p);
  const double logz = LogSumExp(c);
  int32_t exclude = -1;
  if (draft_token >= 0) {
    const auto it = std::find_if(c.begin(), c.end(),
                                 [draft_token](const Candidate& x) { return x.id == draft_token; });
    *outputs.draft_logprob = it == c.end() ? -INFINITY : static_cast<float>(it->logit - logz);
    // The residual excludes x, unless x is all that is left (then p(x) = 1).
    if (params.temperature != 0.0f && it != c.end() && c.size() > 1) exclude = draft_token;
  }

  RowSampleDetail local;
  RowSampleDetail& d = outputs.detail != nullptr ? *outputs.detail : local;
  d = RowSampleDetail{};
  const int32_t samples = outputs.detail != nullptr ? controls.num_samples : 1;
  for (int32_t j = 0; j < samples; ++j) {
    const uint32_t stream = params.stream + static_cast<uint32_t>(j) * controls.sample_stream_stride;
    d.token_ids.push_back(DrawSample(c, ordered, params, stream, exclude));
  }
  const int32_t token = d.token_ids[0];
  *outputs.token_id = token;
  if (outputs.logz != nullptr) *outputs.logz = static_cast<float>(logz);
  if (outputs.logprob != nullptr) {
    const auto it = std::find_if(c.begin(), c.end(), [token](const Candidate& x) { return x.id == token; });
    *outputs.logprob = static_cast<float>(it->logit - logz);
  }
  if (outputs.detail != nullptr && controls.top_logprobs > 0) {
    if (raw_mode) {
      FillRawModeDetail(raw_row, valid_vocab, controls.top_logprobs, &d);
    } else {
      FillSampledModeDetail(&c, logz, controls.top_logprobs, &d);
    }
  }
  return KernelStatus::kOk;
}

}  // namespace flashsampler::kernels
