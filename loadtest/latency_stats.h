// Latency statistics for flashsampler-load: exact percentiles from the sorted
// samples of one step, and a log-spaced histogram of them for the CSV and
// the plots.
//
// Percentiles are nearest-rank: p-th percentile = the ceil(p/100 · n)-th
// smallest sample (the smallest for p = 0), so every reported value is a
// latency that was actually observed and p100 is the maximum. Samples are in
// microseconds. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <vector>

namespace flashsampler::load {

struct LatencySummary {
  int64_t count = 0;
  double mean_us = 0;
  double p50_us = 0;
  double p90_us = 0;
  double p99_us = 0;
  double p999_us = 0;
  double max_us = 0;
};

// `sorted` ascending and non-empty; p in [0, 100].
double Percentile(const std::vector<double>& sorted, double p);

// All zeros for no samples. Sorts a copy.
LatencySummary Summarize(std::vector<double> samples_us);

struct HistogramBucket {
  double lower_us = 0;  // inclusive
  double upper_us = 0;  // exclusive
  int64_t count = 0;
};

// Buckets with edges at 10^(k / buckets_per_decade) µs, from the power of ten
// at or below the smallest sample to the bucket of the largest; empty buckets
// in between are kept so the plot shows gaps. Samples below 1 µs fall into
// the bucket [0, 1).
std::vector<HistogramBucket> LogHistogram(const std::vector<double>& samples_us,
                                          int buckets_per_decade = 10);

}  // namespace flashsampler::load
