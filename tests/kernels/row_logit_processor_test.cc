// Tests of kernels/cpu/row_logit_processor.h: each control's fp32 formula in
// vLLM's order, untouched tokens cost exactly one multiply, and processing a
// row in slices gives bit-identical values to processing it whole.
#include "kernels/cpu/row_logit_processor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace flashsampler::kernels {
namespace {

TEST(RowLogitProcessor, AppliesEachControlInVllmOrder) {
  RowControls c;
  c.logit_bias = {{1, 0.5f}, {4, -3.0f}};
  c.banned_token_ids = {2};
  c.allowed_bitmask = {~(1u << 6)};
  c.repetition_penalty = 2.0f;
  c.presence_penalty = 0.25f;
  c.frequency_penalty = 0.5f;
  c.prompt_token_ids = {3};
  c.output_token_ids = {1, 4, 4};
  const float scale = 0.5f;
  const std::vector<float> raw = {1.0f, 2.0f, 3.0f, -1.0f, 1.0f, 7.0f, 9.0f, -2.0f};
  std::vector<float> out(raw.size());
  RowLogitProcessor(c, scale).Process(0, 8, raw.data(), out.data());
  EXPECT_EQ(out[0], 1.0f * scale);                                 // untouched
  EXPECT_EQ(out[1], ((2.0f + 0.5f) / 2.0f - 0.5f - 0.25f) * scale);  // bias, rep (x > 0), freq, presence
  EXPECT_EQ(out[2], -INFINITY);                                    // banned
  EXPECT_EQ(out[3], (-1.0f * 2.0f) * scale);                       // prompt: rep multiplies x <= 0
  EXPECT_EQ(out[4], ((1.0f - 3.0f) * 2.0f - 0.5f * 2 - 0.25f) * scale);  // biased sign decides
  EXPECT_EQ(out[5], 7.0f * scale);
  EXPECT_EQ(out[6], -INFINITY);                                    // not in the bitmask
  EXPECT_EQ(out[7], -2.0f * scale);
}

TEST(RowLogitProcessor, SlicesMatchTheWholeRow) {
  const int64_t v = 1000;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int32_t> token(0, v - 1);
  std::vector<float> raw(v);
  for (float& x : raw) x = normal(rng);
  RowControls c;
  for (int i = 0; i < 30; ++i) c.output_token_ids.push_back(token(rng));
  for (int i = 0; i < 30; ++i) c.prompt_token_ids.push_back(token(rng));
  for (int i = 0; i < 10; ++i) c.banned_token_ids.push_back(token(rng));
  for (int i = 0; i < 10; ++i) c.logit_bias.emplace_back(i * 97, 1.5f);
  c.allowed_bitmask.assign((v + 31) / 32, 0xFFFF7FFFu);
  c.repetition_penalty = 1.3f;
  c.presence_penalty = 0.4f;
  c.frequency_penalty = -0.2f;
  const RowLogitProcessor processor(c, 1.0f / 0.7f);
  std::vector<float> whole(v), sliced(v);
  processor.Process(0, v, raw.data(), whole.data());
  for (int64_t t0 = 0; t0 < v; t0 += 37) {
    const int64_t n = std::min<int64_t>(37, v - t0);
    processor.Process(t0, n, raw.data() + t0, sliced.data() + t0);
  }
  for (int64_t i = 0; i < v; ++i) {
    if (std::isinf(whole[i])) {
      EXPECT_EQ(sliced[i], whole[i]) << i;
    } else {
      EXPECT_EQ(std::memcmp(&sliced[i], &whole[i], sizeof(float)), 0) << i;
    }
  }
}

}  // namespace
}  // namespace flashsampler::kernels
