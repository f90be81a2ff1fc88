#include "loadtest/load_report.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace flashsampler::load {

std::string ReportJson(const RunDescription& run, const std::vector<StepResult>& steps) {
  nlohmann::json j;
  j["tool"] = "flashsampler-load";
  j["date_utc"] = run.date_utc;
  j["address"] = run.address;
  j["loop"] = run.loop;
  j["mode"] = run.mode;
  j["transport"] = run.transport;
  j["arrival"] = run.arrival;
  j["channels"] = run.channels;
  j["rows_per_request"] = run.rows_per_request;
  j["temperature"] = run.temperature;
  j["warmup_s"] = run.warmup_s;
  j["duration_s"] = run.duration_s;
  j["tls"] = run.tls;
  j["auth_token"] = run.auth_token;
  j["model"] = {{"vocab_size", run.vocab_size}, {"hidden_size", run.hidden_size}, {"backend", run.backend}};
  nlohmann::json out = nlohmann::json::array();
  for (const StepResult& s : steps) {
    nlohmann::json errors = nlohmann::json::object();
    for (const auto& [code, n] : s.errors) errors[code] = n;
    out.push_back({{"concurrency", s.concurrency},
                   {"target_rps", s.target_rps},
                   {"duration_s", s.duration_s},
                   {"requests", s.requests},
                   {"ok", s.ok},
                   {"errors", errors},
                   {"not_sent", s.not_sent},
                   {"achieved_rps", s.achieved_rps},
                   {"rows_per_s", s.rows_per_s},
                   {"latency_us",
                    {{"count", s.latency.count},
                     {"mean", s.latency.mean_us},
                     {"p50", s.latency.p50_us},
                     {"p90", s.latency.p90_us},
                     {"p99", s.latency.p99_us},
                     {"p99.9", s.latency.p999_us},
                     {"max", s.latency.max_us}}}});
  }
  j["steps"] = out;
  return j.dump(2) + "\n";
}

std::string HistogramCsv(const std::vector<StepResult>& steps) {
  std::string csv = "step,concurrency,target_rps,lower_us,upper_us,count\n";
  for (size_t i = 0; i < steps.size(); ++i) {
    for (const HistogramBucket& b : LogHistogram(steps[i].latencies_us)) {
      absl::StrAppendFormat(&csv, "%d,%d,%g,%.6g,%.6g,%d\n", i, steps[i].concurrency,
                            steps[i].target_rps, b.lower_us, b.upper_us, b.count);
    }
  }
  return csv;
}

std::string ReportTable(const RunDescription& run, const std::vector<StepResult>& steps) {
  std::string t = absl::StrFormat(
      "%s loop, %s, %s transport, %d rows/request, %d channel(s), %.1f s per step after %.1f s warm-up\n",
      run.loop, run.mode, run.transport, run.rows_per_request, run.channels, run.duration_s, run.warmup_s);
  absl::StrAppendFormat(&t, "%-12s %10s %10s %9s %9s %9s %9s %9s %9s  %s\n",
                        run.loop == "open" ? "target_rps" : "concurrency", "achieved", "ok",
                        "p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "max_ms", "not_sent", "errors");
  for (const StepResult& s : steps) {
    std::vector<std::string> errors;
    for (const auto& [code, n] : s.errors) errors.push_back(absl::StrCat(code, "=", n));
    const std::string step =
        run.loop == "open" ? absl::StrFormat("%.1f", s.target_rps) : absl::StrCat(s.concurrency);
    const LatencySummary& l = s.latency;
    absl::StrAppendFormat(&t, "%-12s %10.1f %10d %9.3f %9.3f %9.3f %9.3f %9.3f %9d  %s\n", step,
                          s.achieved_rps, s.ok, l.p50_us / 1e3, l.p90_us / 1e3, l.p99_us / 1e3,
                          l.p999_us / 1e3, l.max_us / 1e3, s.not_sent,
                          errors.empty() ? "-" : absl::StrJoin(errors, " "));
  }
  return t;
}

absl::Status WriteTextFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace flashsampler::load
