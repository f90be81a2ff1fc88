// ServerMetrics: the families and their values in the text exposition, the
// bounded code label, device memory read at scrape time, and the HTTP
// endpoint on a free loopback port.
#include "server/telemetry/metrics.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/http_get.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ServerMetrics, RecordsRequestsLaunchesAndModelInfo) {
  ServerMetrics metrics(/*max_batch_rows=*/64);
  for (int i = 0; i < 4; ++i) metrics.RequestStarted();
  metrics.RequestFinished(RpcMethod::kSample, grpc::StatusCode::OK, 5, absl::Microseconds(300));
  metrics.RequestFinished(RpcMethod::kSample, grpc::StatusCode::RESOURCE_EXHAUSTED, 7,
                          absl::Microseconds(20));
  metrics.RequestFinished(RpcMethod::kSampleStream, grpc::StatusCode::OK, 2, absl::Seconds(20));
  metrics.RequestFinished(RpcMethod::kVerify, grpc::StatusCode::OK, 9, absl::Microseconds(500));
  metrics.RequestStarted();  // still in flight
  metrics.RecordLaunch(7, 0.002, "fused");
  metrics.RecordLaunch(64, 0.004, "fused_controlled");
  metrics.RecordQueueWait(0.0001);
  metrics.SetQueueRows(12);
  ModelShape shape;
  shape.vocab_size = 32000;
  shape.valid_vocab = 31990;
  shape.hidden_size = 1024;
  shape.weight_dtype = WeightDType::kBFloat16;
  metrics.SetModelInfo(shape, "cpu", 1);

  metrics.SetQueueCapacityRows(4096);
  metrics.SetServing(true);
  metrics.RecordUploads(1, 524288);
  metrics.RecordUploads(2, 1048576);
  const std::string text = metrics.Scrape();
  EXPECT_THAT(text, HasSubstr("flashsampler_uploads_total 3"));
  EXPECT_THAT(text, HasSubstr("flashsampler_uploaded_bytes_total 1572864"));
  EXPECT_THAT(text, HasSubstr("flashsampler_queue_capacity_rows 4096"));
  EXPECT_THAT(text, HasSubstr("flashsampler_serving 1"));
  EXPECT_THAT(text, HasSubstr("flashsampler_requests_total{code=\"OK\",method=\"Sample\"} 1"));
  EXPECT_THAT(text, HasSubstr("flashsampler_requests_total{code=\"RESOURCE_EXHAUSTED\",method=\"Sample\"} 1"));
  EXPECT_THAT(text, HasSubstr("flashsampler_requests_total{code=\"OK\",method=\"SampleStream\"} 1"));
  // Rows of refused requests are not counted.
  EXPECT_THAT(text, HasSubstr("flashsampler_rows_total{method=\"Sample\"} 5"));
  EXPECT_THAT(text, HasSubstr("flashsampler_rows_total{method=\"SampleStream\"} 2"));
  // Verify: counted like Sample, its rows are its positions (sum of gamma + 1).
  EXPECT_THAT(text, HasSubstr("flashsampler_requests_total{code=\"OK\",method=\"Verify\"} 1"));
  EXPECT_THAT(text, HasSubstr("flashsampler_rows_total{method=\"Verify\"} 9"));
  EXPECT_THAT(text, HasSubstr("flashsampler_inflight_requests 1"));
  EXPECT_THAT(text, HasSubstr("flashsampler_queue_rows 12"));
  // Buckets: 50 us is the first bound; 20 s lands only in +Inf.
  EXPECT_THAT(text, HasSubstr("flashsampler_request_duration_seconds_bucket{method=\"Sample\",le=\"5e-05\"} 1"));
  EXPECT_THAT(text, HasSubstr("flashsampler_request_duration_seconds_bucket{method=\"SampleStream\",le=\"10\"} 0"));
  EXPECT_THAT(text, HasSubstr("flashsampler_request_duration_seconds_count{method=\"SampleStream\"} 1"));
  EXPECT_THAT(text, HasSubstr("flashsampler_batch_rows_bucket{le=\"4\"} 0"));
  EXPECT_THAT(text, HasSubstr("flashsampler_batch_rows_bucket{le=\"8\"} 1"));
  EXPECT_THAT(text, HasSubstr("flashsampler_batch_rows_bucket{le=\"64\"} 2"));
  EXPECT_THAT(text, HasSubstr("flashsampler_batch_rows_sum 71"));
  EXPECT_THAT(text, HasSubstr("flashsampler_compute_duration_seconds_count 2"));
  EXPECT_THAT(text, HasSubstr("flashsampler_launches_total{path=\"fused\"} 1"));
  EXPECT_THAT(text, HasSubstr("flashsampler_launches_total{path=\"fused_controlled\"} 1"));
  EXPECT_THAT(text, HasSubstr("flashsampler_queue_duration_seconds_count 1"));
  EXPECT_THAT(text, HasSubstr("flashsampler_model_info{backend=\"cpu\",dtype=\"BF16\",hidden_size=\"1024\","
                              "shards=\"1\",valid_vocab=\"31990\",vocab_size=\"32000\"} 1"));
  // The CPU engine reports no device: no device memory families at all.
  EXPECT_THAT(text, Not(HasSubstr("flashsampler_device_memory")));
}

// requests_total's series are cached after first use: repeated answers add
// to the one series, codes never seen have none, and every method keeps its own.
TEST(ServerMetrics, RepeatedAnswersCountInOneSeriesPerMethodAndCode) {
  ServerMetrics metrics(8);
  for (int i = 0; i < 5; ++i) {
    metrics.RequestStarted();
    metrics.RequestFinished(RpcMethod::kSampleStream, grpc::StatusCode::OK, 1, absl::Microseconds(80));
  }
  metrics.RequestStarted();
  metrics.RequestFinished(RpcMethod::kSampleStream, grpc::StatusCode::CANCELLED, 1, absl::Microseconds(80));
  metrics.RequestStarted();
  metrics.RequestFinished(RpcMethod::kSample, grpc::StatusCode::OK, 3, absl::Microseconds(80));
  const std::string text = metrics.Scrape();
  EXPECT_THAT(text, HasSubstr("flashsampler_requests_total{code=\"OK\",method=\"SampleStream\"} 5"));
  EXPECT_THAT(text, HasSubstr("flashsampler_requests_total{code=\"CANCELLED\",method=\"SampleStream\"} 1"));
  EXPECT_THAT(text, HasSubstr("flashsampler_requests_total{code=\"OK\",method=\"Sample\"} 1"));
  EXPECT_THAT(text, Not(HasSubstr("code=\"CANCELLED\",method=\"Sample\"")));
  EXPECT_THAT(text, Not(HasSubstr("code=\"INTERNAL\"")));
  EXPECT_THAT(text, HasSubstr("flashsampler_rows_total{method=\"SampleStream\"} 5"));
  EXPECT_THAT(text, HasSubstr("flashsampler_inflight_requests 0"));
}

TEST(ServerMetrics, DeviceMemoryIsReadAtScrapeTime) {
  ServerMetrics metrics(8);
  int64_t used = 100;
  metrics.SetDeviceMemorySource([&] {
    return std::vector<DeviceMemoryInfo>{{0, used, 1000}, {1, 7, 2000}};
  });
  EXPECT_THAT(metrics.Scrape(), HasSubstr("flashsampler_device_memory_used_bytes{device=\"0\"} 100"));
  used = 300;
  const std::string text = metrics.Scrape();
  EXPECT_THAT(text, HasSubstr("flashsampler_device_memory_used_bytes{device=\"0\"} 300"));
  EXPECT_THAT(text, HasSubstr("flashsampler_device_memory_total_bytes{device=\"1\"} 2000"));
  metrics.SetDeviceMemorySource(nullptr);
  EXPECT_THAT(metrics.Scrape(), Not(HasSubstr("flashsampler_device_memory")));
}

TEST(ServerMetrics, CodeNamesAreTheCanonicalOnes) {
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::OK), "OK");
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::UNAUTHENTICATED), "UNAUTHENTICATED");
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::DATA_LOSS), "DATA_LOSS");
  // (No out-of-range case: a grpc::StatusCode outside the enum's values is
  // undefined behaviour to form, as UBSan reports.)
}

TEST(ServerMetrics, ServesTheExpositionOverHttp) {
  ServerMetrics metrics(8);
  metrics.RecordLaunch(3, 0.001, "cpu");
  absl::StatusOr<int> port = metrics.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  absl::StatusOr<std::string> body = testing::HttpGet(absl::StrCat("127.0.0.1:", *port), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("flashsampler_batch_rows_count 1"));
  EXPECT_THAT(*body, HasSubstr("# TYPE flashsampler_rows_total counter"));
  // A second endpoint on the same port cannot be bound.
  ServerMetrics other(8);
  absl::StatusOr<int> clash = other.Serve(absl::StrCat("127.0.0.1:", *port));
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace flashsampler
