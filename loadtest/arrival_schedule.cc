#include "loadtest/arrival_schedule.h"

#include <cmath>

#include "absl/status/status.h"

namespace flashsampler::load {

absl::StatusOr<Arrival> ParseArrival(const std::string& name) {
  if (name == "constant") return Arrival::kConstant;
  if (name == "poisson") return Arrival::kPoisson;
  return absl::InvalidArgumentError("--arrival must be constant or poisson, got '" + name + "'");
}

ArrivalSchedule::ArrivalSchedule(double rate, Arrival arrival, uint64_t seed)
    : rate_(rate), arrival_(arrival), gen_(seed) {}

double ArrivalSchedule::Next() {
  if (arrival_ == Arrival::kConstant) {
    // k / rate rather than a running sum: no drift over millions of requests.
    return static_cast<double>(index_++) / rate_;
  }
  const double t = poisson_time_;
  // u in (0, 1]: 53 random bits, offset by one ulp so log(u) is finite.
  const double u = (static_cast<double>(gen_() >> 11) + 1.0) * 0x1.0p-53;
  poisson_time_ += -std::log(u) / rate_;
  ++index_;
  return t;
}

}  // namespace flashsampler::load
