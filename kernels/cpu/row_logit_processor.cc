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
  std::vector<TouchedToken> all;
  auto add = [&all](int32_t id) -> TouchedToken& {
    all.push_back(TouchedToken{id, 0.0f, 0, false, false});
    return all.back();
  };
  for (const auto& [id, bias] : c.logit_bias) add(id).bias = bias;
  for (int32_t id : c.banned_token_ids) add(id).banned = true;
  for (int32_t id : c.prompt_token_ids) add(id).repeated = true;
  for (int32_t id : c.output_token_ids) {
    TouchedToken& t = add(id);
    t.repeated = true;
    t.output_count = 1;
  }
  // Merge the entries of each id (bias ids are distinct, so summing is exact).
  std::stable_sort(all.begin(), all.end(),
                   [](const TouchedToken& a, const TouchedToken& b) { return a.id < b.id; });
  for (const TouchedToken& t : all) {
    if (touched_.empty() || touched_.back().id != t.id) {
      touched_.push_back(t);
      continue;
    }
    TouchedToken& m = touched_.back();
    m.bias += t.bias;
    m.output_count += t.output_count;
    m.repeated |= t.repeated;
    m.banned |= t.banned;
  }
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
    if (it->banned || !Allowed(it->id)) {
      out[j] = -INFINITY;
      continue;
    }
    // vLLM's order: bias, then repetition (on the biased logit's sign), then
    // frequency and presence; all fp32, division for positive logits.
    float x = raw[j] + it->bias;
    if (it->repeated) x = x > 0.0f ? x / repetition_ : x * repetition_;
    x -= frequency_ * static_cast<float>(it->output_count);
    x -= presence_ * (it->output_count > 0 ? 1.0f : 0.0f);
    out[j] = x * scale_;
  }
}

}  // namespace flashsampler::kernels
