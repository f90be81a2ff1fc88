#include "tests/common/controls_reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace flashsampler::testing {

ReferenceResult ReferenceControlledDistribution(const std::vector<float>& raw, int64_t valid_vocab,
                                                float temperature, const RowControls& c) {
  const int64_t v = valid_vocab;
  std::vector<int> output_count(v, 0);
  std::vector<bool> seen(v, false), banned(v, false);
  for (int32_t t : c.output_token_ids) {
    if (t < v) ++output_count[t], seen[t] = true;
  }
  for (int32_t t : c.prompt_token_ids) {
    if (t < v) seen[t] = true;
  }
  for (int32_t t : c.banned_token_ids) {
    if (t < v) banned[t] = true;
  }
  std::vector<double> bias(v, 0.0);
  for (const auto& [t, b] : c.logit_bias) {
    if (t < v) bias[t] = b;
  }
  const double inv_t = temperature > 0 ? 1.0 / temperature : 1.0;
  ReferenceResult r;
  r.logits.assign(v, -INFINITY);
  for (int64_t i = 0; i < v; ++i) {
    const bool allowed =
        c.allowed_bitmask.empty() || ((c.allowed_bitmask[i / 32] >> (i % 32)) & 1u) != 0;
    if (!allowed || banned[i]) continue;
    double x = double{raw[i]} + bias[i];
    if (seen[i]) x = x > 0 ? x / c.repetition_penalty : x * c.repetition_penalty;
    x -= double{c.frequency_penalty} * output_count[i];
    x -= output_count[i] > 0 ? double{c.presence_penalty} : 0.0;
    r.logits[i] = x * inv_t;
  }
  // Kept tokens, in (l desc, id asc) order.
  std::vector<int64_t> order;
  for (int64_t i = 0; i < v; ++i) {
    if (std::isfinite(r.logits[i])) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return r.logits[a] > r.logits[b] || (r.logits[a] == r.logits[b] && a < b);
  });
  if (order.empty()) return r;
  const double max = r.logits[order[0]];
  if (c.min_p > 0) {
    std::vector<int64_t> kept;
    for (int64_t i : order) {
      const double ratio = std::exp(r.logits[i] - max);
      r.margin = std::min(r.margin, std::abs(ratio - c.min_p) / c.min_p);
      if (ratio >= c.min_p) kept.push_back(i);
    }
    order = kept;
  }
  if (c.top_k > 0 && order.size() > static_cast<size_t>(c.top_k)) order.resize(c.top_k);
  if (c.top_p < 1) {
    double total = 0;
    for (int64_t i : order) total += std::exp(r.logits[i] - max);
    const double target = c.top_p * total;
    double before = 0;
    size_t keep = 0;
    while (keep < order.size() && before < target) {
      r.margin = std::min(r.margin, std::abs(before - target) / target);
      before += std::exp(r.logits[order[keep]] - max);
      ++keep;
    }
    if (keep < order.size()) r.margin = std::min(r.margin, std::abs(before - target) / target);
    order.resize(std::max<size_t>(keep, 1));
  }
  double sum = 0;
  for (int64_t i : order) sum += std::exp(r.logits[i] - max);
  r.logz = max + std::log(sum);
  r.probs.assign(v, 0.0);
  for (int64_t i : order) r.probs[i] = std::exp(r.logits[i] - r.logz);
  return r;
}

}  // namespace flashsampler::testing
