#include "loadtest/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace flashsampler::load {

double Percentile(const std::vector<double>& sorted, double p) {
  const double n = static_cast<double>(sorted.size());
  // Nearest rank; the tiny slack keeps p·n that is an integer in exact
  // arithmetic (e.g. 99.9 % of 1000) from rounding up to the next rank.
  const double rank = std::ceil(p / 100.0 * n - 1e-9);
  const size_t index = static_cast<size_t>(std::clamp(rank, 1.0, n)) - 1;
  return sorted[index];
}

LatencySummary Summarize(std::vector<double> samples_us) {
  LatencySummary s;
  if (samples_us.empty()) return s;
  std::sort(samples_us.begin(), samples_us.end());
  s.count = static_cast<int64_t>(samples_us.size());
  s.mean_us = std::accumulate(samples_us.begin(), samples_us.end(), 0.0) / s.count;
  s.p50_us = Percentile(samples_us, 50);
  s.p90_us = Percentile(samples_us, 90);
  s.p99_us = Percentile(samples_us, 99);
  s.p999_us = Percentile(samples_us, 99.9);
  s.max_us = samples_us.back();
  return s;
}

std::vector<HistogramBucket> LogHistogram(const std::vector<double>& samples_us,
                                          int buckets_per_decade) {
  if (samples_us.empty() || buckets_per_decade < 1) return {};
  const auto [min_it, max_it] = std::minmax_element(samples_us.begin(), samples_us.end());
  // Bucket k (k >= 1) is [10^((k-1)/b), 10^(k/b)); bucket 0 is [0, 1).
  auto bucket_of = [&](double us) -> int {
    if (us < 1.0) return 0;
    return 1 + static_cast<int>(std::floor(std::log10(us) * buckets_per_decade));
  };
  // Start at the decade edge at or below the smallest sample: bucket d·b + 1
  // begins at 10^d.
  const int min_bucket = bucket_of(*min_it);
  const int first = min_bucket == 0 ? 0 : (min_bucket - 1) / buckets_per_decade * buckets_per_decade + 1;
  const int last = bucket_of(*max_it);
  std::vector<HistogramBucket> buckets(last - first + 1);
  for (int k = first; k <= last; ++k) {
    HistogramBucket& b = buckets[k - first];
    b.lower_us = k == 0 ? 0.0 : std::pow(10.0, (k - 1.0) / buckets_per_decade);
    b.upper_us = std::pow(10.0, static_cast<double>(k) / buckets_per_decade);
  }
  for (const double us : samples_us) ++buckets[bucket_of(us) - first].count;
  return buckets;
}

}  // namespace flashsampler::load
