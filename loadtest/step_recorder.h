// StepRecorder: collects the outcome of every request of one load step
// (one concurrency of a closed-loop sweep, or one rate of an open-loop sweep)
// and turns it into a StepResult.
//
// The measurement window is [window_start, window_end): warm-up requests
// (due before window_start) are discarded. A request is counted, and its
// latency kept, when it was *due* in the window (open loop: its intended send
// time; closed loop: its send time); latency runs from that time to its
// completion. Throughput counts OK responses that *completed* in the window,
// so a server that falls behind shows lower throughput, not a longer window.
// Record and RecordNotSent may be called from any number of threads at once
// (one mutex); Finish once, after the last call completed.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <grpcpp/support/status.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "loadtest/latency_stats.h"

namespace flashsampler::load {

using Clock = std::chrono::steady_clock;

struct StepResult {
  int concurrency = 0;    // closed loop: requests (or streams) kept in flight; 0 for open loop
  double target_rps = 0;  // open loop: the offered rate; 0 for closed loop
  double duration_s = 0;  // length of the measurement window
  int64_t requests = 0;   // due in the window and answered (OK or error)
  int64_t ok = 0;
  std::map<std::string, int64_t> errors;  // gRPC status code name -> count, due in the window
  int64_t not_sent = 0;   // open loop: due in the window but dropped (--max_in_flight reached)
  double achieved_rps = 0;  // OK responses completed in the window per second
  double rows_per_s = 0;
  LatencySummary latency;             // of the OK requests due in the window
  std::vector<double> latencies_us;   // the same, unsorted, for the histogram
};

class StepRecorder {
 public:
  StepRecorder(Clock::time_point window_start, Clock::time_point window_end, int64_t rows_per_request);

  void Record(Clock::time_point due, Clock::time_point done, grpc::StatusCode code);
  void RecordNotSent(Clock::time_point due);
  StepResult Finish();

 private:
  bool InWindow(Clock::time_point t) const { return t >= window_start_ && t < window_end_; }

  const Clock::time_point window_start_;
  const Clock::time_point window_end_;
  const int64_t rows_per_request_;
  absl::Mutex mu_;
  StepResult result_ ABSL_GUARDED_BY(mu_);
  int64_t ok_completed_in_window_ ABSL_GUARDED_BY(mu_) = 0;
};

// "OK", "UNAVAILABLE", ... (the canonical names shared by gRPC and absl).
std::string StatusCodeName(grpc::StatusCode code);

}  // namespace flashsampler::load
