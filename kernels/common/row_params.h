// RowParams: the per-row sampling parameters every backend consumes, already
// validated and resolved by the server (seed drawn, stream assigned).
//
// temperature == 0 means greedy argmax (no noise; ties to the lowest id), and
// logz / logprobs are then those of softmax(logits), i.e. temperature 1.
// Otherwise temperature > 0 and finite, and the row samples softmax(l / T)
// with noise keyed by (seed, offset, stream, token id) (gumbel_noise.h).
#pragma once

#include <cstdint>

namespace flashsampler {

struct RowParams {
  float temperature = 1.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;
  uint32_t stream = 0;
};

// Multiplier applied to a row's logits: 1/T for sampled rows, 1 for greedy.
// Every backend multiplies by this fp32 reciprocal (never divides by T), so the
// transformed logits round identically on host and device.
inline float LogitScale(const RowParams& p) {
  return p.temperature > 0.0f ? 1.0f / p.temperature : 1.0f;
}

}  // namespace flashsampler
