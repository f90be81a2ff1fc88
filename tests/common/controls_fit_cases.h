// The goodness-of-fit cases of the sampling controls, shared by the CPU
// (tests/kernels/controlled_sampler_test.cc) and GPU
// (tests/gpu/controlled_sample_test.cc) suites so that both backends are held
// to the same inputs: a vocabulary of 24 logits and one case per control and
// for the sensible combinations.
//
// The logits: three head tokens (p ~ 0.2 .. 0.3 at the tested temperatures)
// spread over tiles and Philox words, and a tail in [-2, 0] (p < 0.05 each).
// So every token is either z-tested with enough power at 2^21 samples
// (p >= 0.15) or too small to be z-tested, and the filters keep at least five
// tokens (five chi-square bins) in every case.
#pragma once

#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/row_controls.h"

namespace flashsampler::testing {

inline std::vector<float> ControlsTestLogits() {
  std::vector<float> l(24);
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> tail(-2.0f, 0.0f);
  for (float& x : l) x = tail(rng);
  l[0] = 3.0f;
  l[13] = 2.95f;
  l[23] = 2.9f;
  return l;
}

inline RowControls FilterControls(int32_t top_k, float top_p, float min_p) {
  RowControls c;
  c.top_k = top_k;
  c.top_p = top_p;
  c.min_p = min_p;
  return c;
}

// Head 0 is in the prompt (repetition only), head 13 twice in the output and
// tail token 9 once; tail token 7 (prompt) has a negative logit, which the
// repetition penalty multiplies.
inline RowControls PenalisedControls() {
  RowControls c;
  c.repetition_penalty = 1.1f;
  c.presence_penalty = 0.2f;
  c.frequency_penalty = 0.2f;
  c.prompt_token_ids = {0, 7};
  c.output_token_ids = {13, 9, 13};
  return c;
}

// Head 13 banned, head 23 and tail token 2 outside the bitmask, tail token 1
// raised to a head by its bias, head 0 lowered a little.
inline RowControls MaskedControls() {
  RowControls c;
  c.logit_bias = {{1, 4.0f}, {0, -0.1f}};
  c.banned_token_ids = {13};
  c.allowed_bitmask = {0xFFFFFFFFu & ~(1u << 23) & ~(1u << 2)};
  return c;
}

struct ControlsFitCase {
  std::string name;
  float temperature;
  RowControls controls;
};

// GoogleTest prints a case by its name.
inline void PrintTo(const ControlsFitCase& c, std::ostream* os) { *os << c.name; }

inline std::vector<ControlsFitCase> EveryControlFitCase() {
  RowControls temperature_only;
  temperature_only.top_logprobs = 2;  // no filter, but a controlled row
  RowControls penalised_top_k = PenalisedControls();
  penalised_top_k.top_k = 7;
  RowControls masked_top_p = MaskedControls();
  masked_top_p.top_p = 0.9f;
  return {{"TemperatureOnly", 0.8f, temperature_only},
          {"TopK", 1.0f, FilterControls(6, 1.0f, 0.0f)},
          {"TopKAboveFusedLimit", 1.0f, FilterControls(100, 1.0f, 0.0f)},
          {"TopP", 1.3f, FilterControls(0, 0.85f, 0.0f)},
          {"MinP", 0.9f, FilterControls(0, 1.0f, 0.01f)},
          {"TopKTopPMinP", 1.5f, FilterControls(8, 0.95f, 0.02f)},
          {"Penalties", 0.9f, PenalisedControls()},
          {"PenaltiesWithTopK", 0.9f, penalised_top_k},
          {"BiasBansBitmask", 1.0f, MaskedControls()},
          {"BiasBansBitmaskTopP", 1.0f, masked_top_p}};
}

}  // namespace flashsampler::testing
