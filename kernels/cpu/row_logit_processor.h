// RowLogitProcessor: steps 1-4 of the sampling controls (allowed bitmask and
// bans, logit bias, repetition / frequency / presence penalties, temperature)
// for one row, applied to any slice of its raw logits.
//
// Process(token0, n, raw, out) writes out[j] = l'(token0 + j) computed from the
// raw fp32 logit raw[j], with exactly the fp32 operations listed in
// kernels/common/row_controls.h, so every CPU path (tiles or a full row) gets
// bit-identical transformed logits; disallowed tokens get -inf. Tokens that no
// control touches cost one multiply (l' = x * scale), the others are looked up
// in a sorted list of at most |bias| + |bans| + |prompt| + |output| entries.
//
// Thread safety: immutable after construction; Process may run concurrently.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/row_controls.h"
#include "kernels/common/touched_tokens.h"

namespace flashsampler::kernels {

class RowLogitProcessor {
 public:
  // `controls` must outlive the processor (its bitmask is referenced);
  // `scale` is LogitScale(params) of the row.
  RowLogitProcessor(const RowControls& controls, float scale);

  void Process(int64_t token0, int64_t n, const float* raw, float* out) const;

 private:
  bool Allowed(int64_t token) const;

  std::vector<TouchedToken> touched_;  // MergeTouchedTokens: sorted by id, ids distinct
  const std::vector<uint32_t>* bitmask_;
  float scale_;
  float repetition_;
  float presence_;
  float frequency_;
};

}  // namespace flashsampler::kernels
