// GumbelBucketBound: a cheap, exact upper bound on GumbelFromBits(r) from the
// top 8 bits of r, used by the CPU sampler to skip the two logarithms of tokens
// that cannot win.
//
// g = GumbelFromBits(r) depends only on k = r >> 8 and grows with k (u grows,
// -log u shrinks, -log of that grows). Bucket j = r >> 24 holds the k in
// [j * 2^16, (j + 1) * 2^16), so its largest g is reached at its top k. The
// table stores that value plus a margin of 1e-4 * max(1, |g|) (far above the
// few-ulp wobble of logf / log1pf, so the bound holds even if the libm is not
// perfectly monotone), capped at kGumbelMax. gumbel_bucket_bound_test checks the
// bound exhaustively over all 2^24 values of k with this build's libm.
//
// Why it prunes well: only the top bucket reaches g > 5.54 (bucket 254's bound)
// and once a row has seen a few hundred tokens its best score is about
// log(count) above a typical logit, so for all but ~1/256 of the tokens
// `logit + bound(r) < best` and the logarithms are never evaluated. Pruning is
// exact because the test is strict and fp32 addition is monotone:
// fl(l + g) <= fl(l + bound) < best means the token cannot win or tie.
//
// Thread safety: immutable after construction.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "kernels/common/gumbel_noise.h"

namespace flashsampler::kernels {

class GumbelBucketBound {
 public:
  static constexpr int kBucketBits = 8;
  static constexpr int kBuckets = 1 << kBucketBits;

  GumbelBucketBound() {
    for (int j = 0; j < kBuckets; ++j) {
      const uint32_t top_r = (static_cast<uint32_t>(j) << (32 - kBucketBits)) |
                             ((1u << (32 - kBucketBits)) - 1u);
      const float g = GumbelFromBits(top_r);
      const float bound = g + 1e-4f * std::max(1.0f, std::fabs(g));
      bound_[j] = std::min(bound, kGumbelMax);
    }
  }

  // Noise words r >= this are in the top bucket, the only one whose bound
  // exceeds below_top_bound().
  static constexpr uint32_t kTopBucketFirstWord = uint32_t{kBuckets - 1} << (32 - kBucketBits);

  // An upper bound of GumbelFromBits(r).
  float operator()(uint32_t r) const { return bound_[r >> (32 - kBucketBits)]; }

  // An upper bound of GumbelFromBits(r) for every r < kTopBucketFirstWord
  // (the bound of the second-highest bucket, ~5.54).
  float below_top_bound() const { return bound_[kBuckets - 2]; }

 private:
  std::array<float, kBuckets> bound_;
};

}  // namespace flashsampler::kernels
