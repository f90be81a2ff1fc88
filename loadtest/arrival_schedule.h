// ArrivalSchedule: the intended send times of an open-loop load step.
//
// Open loop means requests are due at times fixed in advance, whatever the
// server does; latency is measured from the intended time, so a client or
// server that falls behind shows up as queueing delay instead of silently
// lowering the offered rate (coordinated omission).
//   constant: the k-th request (k = 0, 1, ...) is due at k / rate seconds;
//   poisson:  gaps are i.i.d. Exponential(rate), drawn from a seeded
//             mt19937_64 by an explicit inverse transform (not
//             std::exponential_distribution, whose algorithm varies between
//             standard libraries), so a seed gives the same schedule everywhere.
// Not thread-safe: one scheduler thread owns it.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "absl/status/statusor.h"

namespace flashsampler::load {

enum class Arrival { kConstant, kPoisson };

absl::StatusOr<Arrival> ParseArrival(const std::string& name);  // "constant" | "poisson"

class ArrivalSchedule {
 public:
  // rate > 0 requests per second.
  ArrivalSchedule(double rate, Arrival arrival, uint64_t seed);

  // Seconds from the start of the step at which the next request is due;
  // non-decreasing.
  double Next();

 private:
  const double rate_;
  const Arrival arrival_;
  std::mt19937_64 gen_;
  int64_t index_ = 0;
  double poisson_time_ = 0;
};

}  // namespace flashsampler::load
