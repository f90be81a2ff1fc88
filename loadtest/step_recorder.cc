#include "loadtest/step_recorder.h"

#include <utility>

#include "absl/status/status.h"

namespace flashsampler::load {

std::string StatusCodeName(grpc::StatusCode code) {
  // gRPC and absl share the canonical code numbering.
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

StepRecorder::StepRecorder(Clock::time_point window_start, Clock::time_point window_end,
                           int64_t rows_per_request)
    : window_start_(window_start), window_end_(window_end), rows_per_request_(rows_per_request) {
  result_.duration_s = std::chrono::duration<double>(window_end - window_start).count();
}

void StepRecorder::Record(Clock::time_point due, Clock::time_point done, grpc::StatusCode code) {
  absl::MutexLock lock(&mu_);
  if (code == grpc::StatusCode::OK && InWindow(done)) ++ok_completed_in_window_;
  if (!InWindow(due)) return;
  ++result_.requests;
  if (code != grpc::StatusCode::OK) {
    ++result_.errors[StatusCodeName(code)];
    return;
  }
  ++result_.ok;
  result_.latencies_us.push_back(std::chrono::duration<double, std::micro>(done - due).count());
}

void StepRecorder::RecordNotSent(Clock::time_point due) {
  absl::MutexLock lock(&mu_);
  if (InWindow(due)) ++result_.not_sent;
}

StepResult StepRecorder::Finish() {
  absl::MutexLock lock(&mu_);
  StepResult r = std::move(result_);
  result_ = StepResult();
  if (r.duration_s > 0) {
    r.achieved_rps = static_cast<double>(ok_completed_in_window_) / r.duration_s;
    r.rows_per_s = r.achieved_rps * static_cast<double>(rows_per_request_);
  }
  r.latency = Summarize(r.latencies_us);
  return r;
}

}  // namespace flashsampler::load
