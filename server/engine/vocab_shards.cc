#include "server/engine/vocab_shards.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flashsampler {

absl::StatusOr<std::vector<VocabShard>> PlanVocabShards(int64_t valid_vocab,
                                                        const std::vector<int>& devices,
                                                        const std::vector<double>& weights,
                                                        int64_t alignment) {
  const int64_t n = static_cast<int64_t>(devices.size());
  if (n == 0) return absl::InvalidArgumentError("vocabulary sharding needs at least one device");
  if (std::set<int>(devices.begin(), devices.end()).size() != devices.size()) {
    return absl::InvalidArgumentError("a device appears twice in the device list");
  }
  for (int d : devices) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("device ordinal ", d, " is negative"));
  }
  if (alignment < 4 || alignment % 4 != 0) {
    return absl::InvalidArgumentError("the shard alignment must be a positive multiple of 4");
  }
  if (!weights.empty() && static_cast<int64_t>(weights.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("the shard split has ", weights.size(),
                                                   " entries for ", n, " devices"));
  }
  for (double w : weights) {
    if (!(w > 0.0) || !std::isfinite(w)) {
      return absl::InvalidArgumentError("shard split weights must be finite and > 0");
    }
  }
  const int64_t tiles = (valid_vocab + alignment - 1) / alignment;
  if (valid_vocab < 1 || tiles < n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot split ", valid_vocab, " tokens into ", n, " shards of at least ", alignment,
        " tokens"));
  }
  double total = 0.0;
  for (int64_t k = 0; k < n; ++k) total += weights.empty() ? 1.0 : weights[k];

  // Tile boundaries at the rounded cumulative shares, then nudged so that every
  // shard keeps at least one tile (boundary k in [k, tiles - (n - k)]).
  std::vector<int64_t> cut(n + 1, 0);
  cut[n] = tiles;
  double cumulative = 0.0;
  for (int64_t k = 1; k < n; ++k) {
    cumulative += weights.empty() ? 1.0 : weights[k - 1];
    const int64_t c = std::llround(cumulative / total * static_cast<double>(tiles));
    cut[k] = std::clamp<int64_t>(c, cut[k - 1] + 1, tiles - (n - k));
  }
  std::vector<VocabShard> shards(n);
  for (int64_t k = 0; k < n; ++k) {
    shards[k].device = devices[k];
    shards[k].begin = cut[k] * alignment;
    shards[k].end = std::min(cut[k + 1] * alignment, valid_vocab);
  }
  return shards;
}

}  // namespace flashsampler
