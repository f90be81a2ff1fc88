// TokenPanelsOf: a test's row-major W [vocab, hidden] in the token-panel
// layout the CPU samplers take (kernels/cpu/fixed_order_logits.h): fp32
// values, or the bits of a 16-bit head (bf16 or fp16 alike).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/fixed_order_logits.h"

namespace flashsampler::testing {

template <typename Element>  // float or uint16_t
std::vector<Element> TokenPanelsOf(const std::vector<Element>& w, int64_t hidden) {
  const int64_t vocab = static_cast<int64_t>(w.size()) / hidden;
  std::vector<Element> panels(static_cast<size_t>(kernels::TokenPanelElements(vocab, hidden)),
                              Element{0});
  kernels::PackTokenPanels(w.data(), 0, vocab, hidden, panels.data());
  return panels;
}

}  // namespace flashsampler::testing
