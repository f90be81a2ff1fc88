// SampleFromCandidates: steps 5-8 of the sampling controls (min_p, top_k,
// top_p, the Gumbel-max samples) and the row's outputs (logz, logprob, the
// RowSampleDetail), given the row's candidate tokens and their transformed
// logits l'. Both CPU controlled paths end here, which is what makes them agree.
//
// Candidates: every token with a finite l' (the materialized path, in token
// order), or any superset of the row's top_k best by (l' desc, id asc) taken
// from disjoint slices (the fused path). Both give the same kept set, because
// min_p keeps a prefix of that order and the prefix's threshold depends only on
// the maximum, which every superset of the top-k contains. Whenever top_k is
// on (or the set has at most 4096 tokens), the set is sorted into that
// canonical order before any float64 sum, so both paths compute bit-identical
// top-p cuts and logz. A larger set under top_p alone (materialized path only)
// sorts just a growing head until the cut falls inside it.
//
// Numerics: min_p keeps i when exp(double(l'_i) - double(max l')) >= min_p;
// top_p keeps sorted token j when the float64 mass before it is < top_p times
// the total; logz is max + log(sum exp(l' - max)) in float64, rounded to fp32.
//
// Draft token (speculative verification, server/engine/engine.h): with draft x >= 0,
// *draft_logprob = l'_x - logz when x is kept (else -inf: p(x) = 0), every
// sample of a sampled row (T > 0) is drawn from the kept tokens other than x
// (the residual), and greedy rows sample as usual. A kept set of x alone has no
// residual: the sample is then x (p(x) = 1, so a verifier accepts it).
//
// Raw mode (RowControls::logprobs_mode == kRaw with top_logprobs > 0) needs the
// whole raw row [0, valid_vocab): only the materialized path can serve it.
//
// Thread safety: pure function of its arguments; distinct rows may be finished
// concurrently.
// Outcomes: kOk; kFailedPrecondition when `candidates` is empty (no token
// left to sample); kInvalidArgument when raw mode is asked without `raw_row`.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/kernel_status.h"
#include "kernels/common/row_controls.h"
#include "kernels/common/row_params.h"

namespace flashsampler::kernels {

struct Candidate {
  float logit;  // transformed logit l', finite
  int32_t id;
};

// (l' descending, token id ascending): the canonical order of kept tokens.
inline bool CandidateBefore(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// The same order as a function object, which std algorithms inline (a
// function pointer they would call).
struct CandidateOrder {
  bool operator()(const Candidate& a, const Candidate& b) const { return CandidateBefore(a, b); }
};

struct CandidateRowOutputs {
  int32_t* token_id = nullptr;  // sample 0
  float* logz = nullptr;        // optional
  float* logprob = nullptr;     // optional: sample 0 under the sampled distribution
  RowSampleDetail* detail = nullptr;  // optional
  float* draft_logprob = nullptr;     // required when draft_token >= 0
};

// `candidates` is reordered and truncated in place (it is scratch).
// `raw_row` / `valid_vocab`: the row's raw logits, needed for raw mode only.
KernelStatus SampleFromCandidates(std::vector<Candidate>* candidates, const RowParams& params,
                                  const RowControls& controls, const float* raw_row,
                                  int64_t valid_vocab, CandidateRowOutputs outputs,
                                  int32_t draft_token = -1);

}  // namespace flashsampler::kernels
