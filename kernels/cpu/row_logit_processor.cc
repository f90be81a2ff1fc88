#include "kernels/cpu/row_logit_processor.h"

#include <algorithm>
#include <cmath>

namespace flashsampler::kernels {

RowLogitProcessor::RowLogitProcessor(const RowControls& c, float scale)
    : bitmask_(&c.allowed_bitmask),
      scale_(scale),
      repetition_(c.repetition_penalty),
      presence_(c.presence_penalty),
      frequency_(c.frequency_penalty) {
  touched_ = MergeTouchedTokens(c);
}

bool RowLogitProcessor::Allowed(int64_t token) const {
  if (bitmask_->empty()) return true;
  return (((*bitmask_)[token >> 5] >> (token & 31)) & 1u) != 0;
}

void RowLogitProcessor::Process(int64_t token0, int64_t n, const float* raw, float* out) const {
  for (int64_t j = 0; j < n; ++j) out[j] = raw[j] * scale_;
  if (!bitmask_->empty()) {
    for (int64_t j = 0; j < n; ++j) {
      if (!Allowed(token0 + j)) out[j] = -INFINITY;
    }
  }
  auto it = std::lower_bound(touched_.begin(), touched_.end(), token0,
                             [](const TouchedToken& t, int64_t id) { return t.id < id; });
  for (; it != touched_.end() && it->id < token0 + n; ++it) {
    const int64_t j = it->id - token0;
    if (it->banned != 0 || !Allowed(it->id)) {
      out[j] = -INFINITY;
      continue;
    }
    // vLLM's order: bias, then repetition (on the biased logit's sign), then
    // frequency and presence (touched_tokens.h).
    out[j] = TouchedLogit(raw[j], *it, repetition_, frequency_, presence_, scale_);
  }
}

}  // namespace flashsampler::kernels
