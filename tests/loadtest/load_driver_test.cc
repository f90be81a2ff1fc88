// LoadDriver against an in-process fake Sampler: counts, error accounting and
// the stream reopen path. No timing is asserted; only what was due and
// answered.
#include "loadtest/load_driver.h"

#include <grpcpp/grpcpp.h>

#include <atomic>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashsampler::load {
namespace {

// Unary: every `fail_every`-th call is RESOURCE_EXHAUSTED. Stream: answers
// each request, and ends the stream with UNAVAILABLE after `stream_limit`
// answers (as a draining server would).
class FakeSampler final : public v1::Sampler::CallbackService {
 public:
  static constexpr int kFailEvery = 4;
  static constexpr int kStreamLimit = 5;

  grpc::ServerUnaryReactor* Sample(grpc::CallbackServerContext* context, const v1::SampleRequest*,
                                   v1::SampleResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (++unary_calls % kFailEvery == 0) {
      reactor->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full"));
    } else {
      response->add_token_ids(1);
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }

  grpc::ServerBidiReactor<v1::SampleRequest, v1::SampleResponse>* SampleStream(
      grpc::CallbackServerContext*) override {
    class Echo final : public grpc::ServerBidiReactor<v1::SampleRequest, v1::SampleResponse> {
     public:
      Echo() { StartRead(&request_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        response_.add_token_ids(1);
        StartWrite(&response_);
      }
      void OnWriteDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::CANCELLED);
        } else if (++answered_ == kStreamLimit) {
          Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining"));
        } else {
          StartRead(&request_);
        }
      }
      void OnDone() override { delete this; }

     private:
      v1::SampleRequest request_;
      v1::SampleResponse response_;
      int answered_ = 0;
    };
    return new Echo;
  }

  std::atomic<int64_t> unary_calls{0};
};

class LoadDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  LoadDriver Driver(bool stream) {
    std::vector<std::unique_ptr<v1::Sampler::Stub>> stubs;
    for (int i = 0; i < 2; ++i) {
      stubs.push_back(v1::Sampler::NewStub(grpc::CreateChannel(
          "127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials())));
    }
    DriverOptions options;
    options.stream = stream;
    options.warmup = absl::Milliseconds(100);
    options.duration = absl::Milliseconds(500);
    options.open_loop_streams = 3;
    options.rows_per_request = 2;
    return LoadDriver(std::move(stubs), ChannelSecurity(), {v1::SampleRequest()}, options);
  }

  static void ExpectConsistent(const StepResult& r) {
    int64_t errors = 0;
    for (const auto& [code, n] : r.errors) errors += n;
    EXPECT_EQ(r.ok + errors, r.requests);
    EXPECT_EQ(r.latency.count, r.ok);
    EXPECT_EQ(static_cast<int64_t>(r.latencies_us.size()), r.ok);
    EXPECT_DOUBLE_EQ(r.rows_per_s, 2 * r.achieved_rps);
    EXPECT_DOUBLE_EQ(r.duration_s, 0.5);
  }

  FakeSampler fake_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(LoadDriverTest, ClosedLoopUnaryCountsErrorsByCode) {
  LoadDriver driver = Driver(false);
  const StepResult r = driver.RunClosedLoop(3);
  EXPECT_EQ(r.concurrency, 3);
  EXPECT_GT(r.ok, 0);
  ExpectConsistent(r);
  ASSERT_THAT(r.errors, ::testing::ElementsAre(::testing::Pair("RESOURCE_EXHAUSTED", ::testing::Gt(0))));
}

TEST_F(LoadDriverTest, OpenLoopConstantRateSendsExactlyWhatWasDue) {
  LoadDriver driver = Driver(false);
  // Due times k / 200 s; the window [0.1 s, 0.6 s) holds k = 20 .. 119.
  const StepResult r = driver.RunOpenLoop(200);
  EXPECT_EQ(r.target_rps, 200);
  EXPECT_EQ(r.not_sent, 0);
  EXPECT_EQ(r.requests, 100);
  ExpectConsistent(r);
  // Exactly the due calls went out: 20 in the warm-up, 100 in the window.
  EXPECT_EQ(fake_.unary_calls.load(), 120);
  // The server fails every fourth call it receives, 30 of the 120. Four
  // sender threads over two channels may hand it calls out of their due
  // order, so how many of the 30 fall in the window depends on the scheduler;
  // every one of them is counted by its code, and no more than were failed.
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_GE(r.errors.at("RESOURCE_EXHAUSTED"), 10);
  EXPECT_LE(r.errors.at("RESOURCE_EXHAUSTED"), 30);
}

TEST_F(LoadDriverTest, StreamsThatTheServerEndsAreReopened) {
  LoadDriver driver = Driver(true);
  const StepResult closed = driver.RunClosedLoop(2);
  ExpectConsistent(closed);
  // Each stream carries kStreamLimit answers and then fails the next request
  // with the stream's status; new streams keep the loop going (more answers
  // than the two first streams carry, and their UNAVAILABLE counted).
  EXPECT_GT(closed.ok, 2 * FakeSampler::kStreamLimit);
  ASSERT_THAT(closed.errors, ::testing::ElementsAre(::testing::Pair("UNAVAILABLE", ::testing::Gt(0))));
  EXPECT_LE(closed.errors.at("UNAVAILABLE"), closed.ok / FakeSampler::kStreamLimit + 2);

  const StepResult open = driver.RunOpenLoop(200);
  ExpectConsistent(open);
  EXPECT_EQ(open.requests, 100);
  EXPECT_GT(open.ok, 0);
}

}  // namespace
}  // namespace flashsampler::load
