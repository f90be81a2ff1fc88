#include "loadtest/step_recorder.h"

#include <chrono>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashsampler::load {
namespace {

using std::chrono::milliseconds;

TEST(StepRecorder, CountsWhatWasDueInTheWindowAndMeasuresFromTheDueTime) {
  const Clock::time_point t0 = Clock::now();
  // Warm-up [t0, t0+1s), window [t0+1s, t0+3s).
  StepRecorder r(t0 + milliseconds(1000), t0 + milliseconds(3000), /*rows_per_request=*/4);
  r.Record(t0 + milliseconds(500), t0 + milliseconds(1500), grpc::StatusCode::OK);   // warm-up: not counted
  r.Record(t0 + milliseconds(1000), t0 + milliseconds(1002), grpc::StatusCode::OK);  // 2 ms
  r.Record(t0 + milliseconds(2000), t0 + milliseconds(2010), grpc::StatusCode::OK);  // 10 ms
  r.Record(t0 + milliseconds(2990), t0 + milliseconds(3500), grpc::StatusCode::OK);  // 510 ms, done late
  r.Record(t0 + milliseconds(2500), t0 + milliseconds(2501), grpc::StatusCode::UNAVAILABLE);
  r.Record(t0 + milliseconds(2600), t0 + milliseconds(2601), grpc::StatusCode::UNAVAILABLE);
  r.Record(t0 + milliseconds(2700), t0 + milliseconds(2701), grpc::StatusCode::RESOURCE_EXHAUSTED);
  r.Record(t0 + milliseconds(3000), t0 + milliseconds(3001), grpc::StatusCode::OK);  // after the window
  r.RecordNotSent(t0 + milliseconds(1500));
  r.RecordNotSent(t0 + milliseconds(100));  // warm-up
  const StepResult s = r.Finish();
  EXPECT_DOUBLE_EQ(s.duration_s, 2.0);
  EXPECT_EQ(s.requests, 6);
  EXPECT_EQ(s.ok, 3);
  EXPECT_THAT(s.errors, ::testing::ElementsAre(::testing::Pair("RESOURCE_EXHAUSTED", 1),
                                               ::testing::Pair("UNAVAILABLE", 2)));
  EXPECT_EQ(s.not_sent, 1);
  // OK completions inside the window: the warm-up one done at 1.5 s, and the
  // ones done at 1.002 s and 2.01 s; the one done at 3.5 s is outside.
  EXPECT_DOUBLE_EQ(s.achieved_rps, 3 / 2.0);
  EXPECT_DOUBLE_EQ(s.rows_per_s, 4 * 3 / 2.0);
  EXPECT_EQ(s.latency.count, 3);
  EXPECT_NEAR(s.latency.p50_us, 10000, 1);
  EXPECT_NEAR(s.latency.max_us, 510000, 1);
  EXPECT_EQ(s.latencies_us.size(), 3u);
}

TEST(StatusCodeName, IsTheCanonicalName) {
  EXPECT_EQ(StatusCodeName(grpc::StatusCode::OK), "OK");
  EXPECT_EQ(StatusCodeName(grpc::StatusCode::UNAUTHENTICATED), "UNAUTHENTICATED");
  EXPECT_EQ(StatusCodeName(grpc::StatusCode::DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
}

}  // namespace
}  // namespace flashsampler::load
