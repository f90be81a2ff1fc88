// TouchedToken: one token of a row that steps 1-3 of the sampling controls
// (kernels/common/row_controls.h) treat individually: it is banned, biased, or
// occurs in the row's prompt / output ids (penalties). MergeTouchedTokens
// builds a row's list (sorted by id, one entry per id); TouchedLogit computes
// such a token's transformed logit l' from its raw fp32 logit with exactly the
// fp32 operations of row_controls.h. The CPU (RowLogitProcessor) and the CUDA
// backend (controlled_sample.cu) both use these two functions, so they give
// bit-identical l' for every token: every other token's l' is raw * scale (or
// -inf when the allowed bitmask clears it) on both.
//
// Numerics: vLLM's order, all fp32 with one rounding per operation (no fused
// multiply-add on either side: the device code uses the _rn intrinsics):
//   x = raw + bias; if repeated: x = x > 0 ? x / r : x * r;
//   x -= frequency * count; x -= presence * (count > 0); l' = x * scale.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/host_device.h"
#include "kernels/common/row_controls.h"

namespace flashsampler {

struct TouchedToken {
  int32_t id = 0;
  float bias = 0.0f;
  int32_t output_count = 0;  // occurrences in output_token_ids
  int32_t repeated = 0;      // 1: occurs in prompt or output (repetition penalty applies)
  int32_t banned = 0;        // 1: listed in banned_token_ids
};

// The row's touched tokens, sorted by id, one entry per id (bias ids are
// distinct, so merging sums at most one non-zero bias: exact).
inline std::vector<TouchedToken> MergeTouchedTokens(const RowControls& c) {
  std::vector<TouchedToken> all;
  all.reserve(c.logit_bias.size() + c.banned_token_ids.size() + c.prompt_token_ids.size() +
              c.output_token_ids.size());
  for (const auto& [id, bias] : c.logit_bias) all.push_back(TouchedToken{id, bias, 0, 0, 0});
  for (int32_t id : c.banned_token_ids) all.push_back(TouchedToken{id, 0.0f, 0, 0, 1});
  for (int32_t id : c.prompt_token_ids) all.push_back(TouchedToken{id, 0.0f, 0, 1, 0});
  for (int32_t id : c.output_token_ids) all.push_back(TouchedToken{id, 0.0f, 1, 1, 0});
  std::stable_sort(all.begin(), all.end(),
                   [](const TouchedToken& a, const TouchedToken& b) { return a.id < b.id; });
  std::vector<TouchedToken> merged;
  for (const TouchedToken& t : all) {
    if (merged.empty() || merged.back().id != t.id) {
      merged.push_back(t);
      continue;
    }
    TouchedToken& m = merged.back();
    m.bias += t.bias;
    m.output_count += t.output_count;
    m.repeated |= t.repeated;
    m.banned |= t.banned;
  }
  return merged;
}

// l' of a touched token that is allowed (not banned, its bitmask bit set).
FS_HOST_DEVICE FS_FORCE_INLINE float TouchedLogit(float raw, const TouchedToken& t,
                                                  float repetition, float frequency,
                                                  float presence, float scale) {
#if defined(__CUDA_ARCH__)
  float x = __fadd_rn(raw, t.bias);
  if (t.repeated != 0) x = x > 0.0f ? __fdiv_rn(x, repetition) : __fmul_rn(x, repetition);
  x = __fsub_rn(x, __fmul_rn(frequency, static_cast<float>(t.output_count)));
  x = __fsub_rn(x, __fmul_rn(presence, t.output_count > 0 ? 1.0f : 0.0f));
  return __fmul_rn(x, scale);
#else
  float x = raw + t.bias;
  if (t.repeated != 0) x = x > 0.0f ? x / repetition : x * repetition;
  x -= frequency * static_cast<float>(t.output_count);
  x -= presence * (t.output_count > 0 ? 1.0f : 0.0f);
  return x * scale;
#endif
}

}  // namespace flashsampler
