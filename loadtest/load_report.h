// The outputs of flashsampler-load: a table on stdout, a JSON report (run
// settings + one object per step, latencies in microseconds) and a CSV of
// per-step latency histograms (log-spaced buckets), both read by plot_load.py.
//
// JSON schema (one file per run):
//   {"tool": "flashsampler-load", "date_utc", "address", "loop": "closed"|"open",
//    "mode": "unary"|"stream", "transport": "grpc"|"shm"|"cuda_ipc", "arrival", "channels", "rows_per_request",
//    "temperature", "warmup_s", "duration_s", "tls", "auth_token",
//    "model": {"vocab_size", "hidden_size", "backend"},
//    "steps": [{"concurrency", "target_rps", "duration_s", "requests", "ok",
//               "errors": {"CODE": n}, "not_sent", "achieved_rps", "rows_per_s",
//               "latency_us": {"count", "mean", "p50", "p90", "p99", "p99.9", "max"}}]}
// CSV columns: step,concurrency,target_rps,lower_us,upper_us,count
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "loadtest/step_recorder.h"

namespace flashsampler::load {

struct RunDescription {
  std::string date_utc;
  std::string address;
  std::string loop;  // closed | open
  std::string mode;  // unary | stream
  std::string transport = "grpc";  // grpc | shm | cuda_ipc (loadtest/region_transport.h)
  std::string arrival;
  int channels = 1;
  int64_t rows_per_request = 1;
  double temperature = 1;
  double warmup_s = 0;
  double duration_s = 0;
  bool tls = false;
  bool auth_token = false;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  std::string backend;
};

std::string ReportJson(const RunDescription& run, const std::vector<StepResult>& steps);
std::string HistogramCsv(const std::vector<StepResult>& steps);
// Human-readable: one line per step, latencies in ms.
std::string ReportTable(const RunDescription& run, const std::vector<StepResult>& steps);

absl::Status WriteTextFile(const std::string& path, const std::string& content);

}  // namespace flashsampler::load
