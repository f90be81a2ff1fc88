// Random engine batches shared by the GPU engine tests (single GPU and
// sharded), so both compare engines on the same kind of rows: N(0, 1) hidden
// states, every fifth row greedy, the rest at T in {0.5, 0.75, 1, 1.25},
// distinct seeds, offsets 0..2, stream = row; logz and logprobs requested;
// RandomControlledEngineBatch adds random sampling controls.
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <random>

#include "server/engine/engine.h"

namespace flashsampler::testing {

// `rows` rows of N(0, 1) hidden states drawn from `gen`, and their params.
inline SampleBatch PlainRowsFrom(std::mt19937& gen, int64_t rows, int64_t hidden_size,
                                 uint64_t seed) {
  SampleBatch b;
  b.rows = rows;
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

inline SampleBatch RandomEngineBatch(int64_t rows, int64_t hidden_size, uint64_t seed) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  return PlainRowsFrom(gen, rows, hidden_size, seed);
}

// The same rows with random sampling controls: every kind (top-k 1..100,
// top-p, min-p, penalties over random prompt / output tokens, bias, bans,
// bitmasks, top lists in both modes, 1 or 2 samples); every sixth row plain.
inline SampleBatch RandomControlledEngineBatch(int64_t rows, int64_t hidden_size, int64_t vocab,
                                              int64_t valid_vocab, uint64_t seed) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  SampleBatch b = PlainRowsFrom(gen, rows, hidden_size, seed);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(valid_vocab - 1));
  b.controls.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    RowControls& c = b.controls[r];
    if (r % 6 == 5) continue;  // a plain row inside a controlled batch
    if (r % 3 == 0) c.top_k = 1 + static_cast<int32_t>(gen() % 100);
    if (r % 2 == 0) c.top_p = 0.5f + 0.45f * unit(gen);
    if (r % 4 == 1) c.min_p = 0.1f * unit(gen);
    if (r % 5 == 2) {
      c.repetition_penalty = 1.2f;
      c.frequency_penalty = 0.3f;
      c.presence_penalty = 0.1f;
      for (int i = 0; i < 30; ++i) c.output_token_ids.push_back(token(gen));
      for (int i = 0; i < 30; ++i) c.prompt_token_ids.push_back(token(gen));
    }
    if (r % 7 == 3) {
      c.logit_bias = {{token(gen), 4.0f}};
      c.banned_token_ids = {token(gen)};
      c.allowed_bitmask.assign((vocab + 31) / 32, 0xFFFF00FFu);
    }
    c.top_logprobs = static_cast<int32_t>(r % 4) * 5;
    if (r % 8 == 7) c.logprobs_mode = LogprobsMode::kRaw;
    c.num_samples = 1 + static_cast<int32_t>(r % 2);
  }
  return b;
}

}  // namespace flashsampler::testing
