#include "loadtest/load_report.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashsampler::load {
namespace {

using ::testing::HasSubstr;

std::vector<StepResult> TwoSteps() {
  StepResult a;
  a.concurrency = 4;
  a.duration_s = 2;
  a.requests = 5;
  a.ok = 4;
  a.errors["UNAVAILABLE"] = 1;
  a.achieved_rps = 2;
  a.rows_per_s = 16;
  a.latencies_us = {100, 200, 300, 4000};
  a.latency = Summarize(a.latencies_us);
  StepResult b;
  b.concurrency = 16;
  b.duration_s = 2;
  return {a, b};
}

RunDescription ClosedUnaryRun() {
  RunDescription run;
  run.loop = "closed";
  run.mode = "unary";
  run.rows_per_request = 8;
  run.backend = "cpu";
  run.vocab_size = 4096;
  return run;
}

TEST(LoadReport, JsonHoldsEveryStepWithLatenciesInMicroseconds) {
  const nlohmann::json j = nlohmann::json::parse(ReportJson(ClosedUnaryRun(), TwoSteps()));
  EXPECT_EQ(j["tool"], "flashsampler-load");
  EXPECT_EQ(j["loop"], "closed");
  EXPECT_EQ(j["rows_per_request"], 8);
  EXPECT_EQ(j["model"]["vocab_size"], 4096);
  ASSERT_EQ(j["steps"].size(), 2u);
  const nlohmann::json& s = j["steps"][0];
  EXPECT_EQ(s["concurrency"], 4);
  EXPECT_EQ(s["requests"], 5);
  EXPECT_EQ(s["ok"], 4);
  EXPECT_EQ(s["errors"]["UNAVAILABLE"], 1);
  EXPECT_EQ(s["latency_us"]["count"], 4);
  EXPECT_EQ(s["latency_us"]["p50"], 200);
  EXPECT_EQ(s["latency_us"]["p99.9"], 4000);
  EXPECT_EQ(s["latency_us"]["max"], 4000);
  EXPECT_TRUE(j["steps"][1]["errors"].is_object());
  EXPECT_EQ(j["steps"][1]["latency_us"]["count"], 0);
}

TEST(LoadReport, CsvHasOneRowPerBucketSummingToTheSamples) {
  const std::string csv = HistogramCsv(TwoSteps());
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0], "step,concurrency,target_rps,lower_us,upper_us,count");
  int64_t total = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> cells = absl::StrSplit(lines[i], ',');
    ASSERT_EQ(cells.size(), 6u) << lines[i];
    EXPECT_EQ(cells[0], "0");  // the second step has no samples, so no rows
    total += std::stoll(cells[5]);
  }
  EXPECT_EQ(total, 4);
}

TEST(LoadReport, TableShowsErrorsAndPercentilesInMilliseconds) {
  const std::string table = ReportTable(ClosedUnaryRun(), TwoSteps());
  EXPECT_THAT(table, HasSubstr("UNAVAILABLE=1"));
  EXPECT_THAT(table, HasSubstr("4.000"));  // max 4000 µs
  EXPECT_THAT(table, HasSubstr("concurrency"));
}

}  // namespace
}  // namespace flashsampler::load
