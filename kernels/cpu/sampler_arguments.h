// What the CPU samplers (CpuTiledSampler, CpuControlledSampler) share below
// their algorithms: the argument checks of their contracts and the thread
// count they resolve. (Both compute a tile's logits with FixedOrderLogits,
// so they produce the same logits bit for bit.)
//
// Thread safety: pure functions.
#pragma once

#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <thread>

#include "kernels/cpu/tiled_sampler.h"

namespace flashsampler::kernels {

inline constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// 0 (greedy), or positive with a finite reciprocal (1/T overflows below ~3e-39).
inline bool ValidSamplerTemperature(float t) {
  return t == 0.0f || (t > 0.0f && std::isfinite(t) && std::isfinite(1.0f / t));
}

// W's sizes fit int32 token ids and the configuration is usable.
inline bool ValidSamplerShape(TokenPanels weight, int64_t vocab, int64_t valid_vocab,
                              int64_t hidden, const CpuSamplerConfig& config) {
  return weight.data != nullptr && vocab > 0 && vocab <= kMaxInt32 && valid_vocab > 0 &&
         valid_vocab <= vocab && hidden > 0 && hidden <= kMaxInt32 && config.tile_rows > 0 &&
         config.num_threads >= 0;
}

// config.num_threads, or every hardware thread for 0.
inline int ResolveSamplerThreads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

// Whether no value is inf or NaN, read off the exponent bits (all ones for
// both). No early exit, so the loop vectorizes: a 256-row decode step of
// D = 4096 is a million values, and a scalar compare-and-branch per value
// cost the CPU backend ~1 ms a launch.
inline bool AllFinite(const float* x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace flashsampler::kernels
