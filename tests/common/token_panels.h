// TokenPanelsOf: a test's row-major W [vocab, hidden] in the token-panel
// layout the CPU samplers take (kernels/cpu/fixed_order_logits.h).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/fixed_order_logits.h"

namespace flashsampler::testing {

inline std::vector<float> TokenPanelsOf(const std::vector<float>& w, int64_t hidden) {
  const int64_t vocab = static_cast<int64_t>(w.size()) / hidden;
  std::vector<float> panels(static_cast<size_t>(kernels::TokenPanelFloats(vocab, hidden)), 0.0f);
  kernels::PackTokenPanels(w.data(), 0, vocab, hidden, panels.data());
  return panels;
}

}  // namespace flashsampler::testing
