// The float64 reference of the sampling controls (kernels/common/row_controls.h
// states the semantics): the probability of every token under the
// distribution a row with RowControls samples from, computed independently of
// kernels/cpu (no shared code), in double precision throughout.
//
// The filters' boundary decisions (min_p ratio, top_p cut) are compared with
// the fp32 implementation's; ReferenceResult::margin reports how far the
// closest decision was from flipping (relative), so a test can assert that its
// inputs are not on a knife edge where fp32 and float64 may disagree.
//
// Thread safety: pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/row_controls.h"

namespace flashsampler::testing {

struct ReferenceResult {
  std::vector<double> probs;  // [valid_vocab], 0 for removed tokens
  double logz = 0;            // log sum over kept tokens of exp(l)
  std::vector<double> logits; // transformed logits l (-inf when disallowed)
  double margin = 1;          // smallest relative distance of a filter decision to its threshold
};

// `raw`: the row's fp32 raw logits [0, valid_vocab); `temperature` 0 = greedy
// distribution at T = 1 (as the kernels report logz for greedy rows).
ReferenceResult ReferenceControlledDistribution(const std::vector<float>& raw, int64_t valid_vocab,
                                                float temperature, const RowControls& c);

}  // namespace flashsampler::testing
