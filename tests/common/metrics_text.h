// Reading a Prometheus text exposition in tests: the value of one series, and
// a bounded wait on the live /metrics of a server until a condition holds.
// Tests synchronise on this state (requests admitted, rows queued) instead of
// sleeping: a loaded or sanitized machine changes how long things take, never
// what the server reports.
//
// Thread safety: reentrant. WaitForMetrics returns OK once `ready` holds for a
// scrape, DeadlineExceeded when `timeout` passes first, or the scrape's error
// if /metrics cannot be read.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace flashsampler::testing {

// The value of one series ("name{labels}", labels in the exposition's order)
// in a text exposition; 0 when the series is absent (counters that never moved
// are not exported).
double SeriesValue(const std::string& exposition, const std::string& series);

// Scrapes http://`metrics_address`/metrics until `ready(exposition)` is true.
// Polls every few milliseconds: the bound is `timeout`, the poll interval only
// sets how soon after the state changes the wait returns.
absl::Status WaitForMetrics(const std::string& metrics_address,
                            const std::function<bool(const std::string&)>& ready,
                            absl::Duration timeout = absl::Seconds(120));

}  // namespace flashsampler::testing
