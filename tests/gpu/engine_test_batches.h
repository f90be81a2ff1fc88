// Random engine batches shared by the GPU engine tests (single GPU and
// sharded), so both compare engines on the same kind of rows: N(0, 1) hidden
// states, every fifth row greedy, the rest at T in {0.5, 0.75, 1, 1.25},
// distinct seeds, offsets 0..2, stream = row; logz and logprobs requested.
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <random>

#include "server/engine.h"

namespace flashsampler::testing {

inline SampleBatch RandomEngineBatch(int64_t rows, int64_t hidden_size, uint64_t seed) {
  SampleBatch b;
  b.rows = rows;
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  b.hidden.resize(static_cast<size_t>(rows * hidden_size));
  for (float& v : b.hidden) v = normal(gen);
  b.params.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    b.params[r].temperature = (r % 5 == 0) ? 0.0f : 0.5f + 0.25f * (r % 4);
    b.params[r].seed = seed * 1000 + r;
    b.params[r].offset = r % 3;
    b.params[r].stream = static_cast<uint32_t>(r);
  }
  b.want_logz = b.want_logprobs = true;
  return b;
}

}  // namespace flashsampler::testing
