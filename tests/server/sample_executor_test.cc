#include "server/sample_executor.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace flashsampler {
namespace {

// Returns row index + call number as tokens; fails when asked to.
class FakeEngine final : public Engine {
 public:
  explicit FakeEngine(std::atomic<int>* calls, bool fail = false) : calls_(calls), fail_(fail) {
    shape_.vocab_size = shape_.valid_vocab = 10;
    shape_.hidden_size = 2;
  }
  absl::StatusOr<SampleResult> Sample(const SampleBatch& batch) override {
    const int call = calls_->fetch_add(1);
    if (fail_) {
      healthy_ = false;
      return absl::InternalError("device lost");
    }
    SampleResult r;
    for (int64_t i = 0; i < batch.rows; ++i) r.token_ids.push_back(static_cast<int32_t>(i + call));
    return r;
  }
  const ModelShape& shape() const override { return shape_; }
  std::string backend_name() const override { return "fake"; }
  bool healthy() const override { return healthy_; }

 private:
  std::atomic<int>* calls_;
  bool fail_;
  std::atomic<bool> healthy_{true};
  ModelShape shape_;
};

SampleBatch Batch(int64_t rows) {
  SampleBatch b;
  b.rows = rows;
  b.hidden.assign(rows * 2, 0.0f);
  b.params.resize(rows);
  return b;
}

TEST(SampleExecutor, UnavailableUntilAnEngineIsSet) {
  SampleExecutor executor;
  EXPECT_FALSE(executor.ready());
  SampleBatch b = Batch(1);
  absl::Status status;
  executor.Submit(&b, [&](absl::StatusOr<SampleResult> r) { status = r.status(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
}

TEST(SampleExecutor, RunsJobsInOrderAndDrainsOnStop) {
  std::atomic<int> calls{0};
  SampleExecutor executor;
  executor.SetEngine(std::make_unique<FakeEngine>(&calls));
  ASSERT_TRUE(executor.ready());
  EXPECT_EQ(executor.backend_name(), "fake");
  EXPECT_EQ(executor.shape().hidden_size, 2);
  constexpr int kJobs = 50;
  std::vector<SampleBatch> batches;
  for (int i = 0; i < kJobs; ++i) batches.push_back(Batch(1 + i % 3));
  std::vector<int> first_token(kJobs, -1);
  std::atomic<int> done{0};
  for (int i = 0; i < kJobs; ++i) {
    executor.Submit(&batches[i], [&, i](absl::StatusOr<SampleResult> r) {
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(static_cast<int64_t>(r->token_ids.size()), batches[i].rows);
      first_token[i] = r->token_ids[0];
      done.fetch_add(1);
    });
  }
  executor.Stop();  // must run everything already queued
  EXPECT_EQ(done.load(), kJobs);
  for (int i = 0; i < kJobs; ++i) EXPECT_EQ(first_token[i], i) << "job " << i << " ran out of order";
  // After Stop, new work is refused at once.
  absl::Status status;
  executor.Submit(&batches[0], [&](absl::StatusOr<SampleResult> r) { status = r.status(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
}

TEST(SampleExecutor, EngineFailureIsReportedAndStopsServing) {
  std::atomic<int> calls{0};
  absl::Notification failure_seen;
  SampleExecutor executor([&] { failure_seen.Notify(); });
  executor.SetEngine(std::make_unique<FakeEngine>(&calls, /*fail=*/true));
  SampleBatch b = Batch(2);
  absl::Notification answered;
  absl::Status status;
  executor.Submit(&b, [&](absl::StatusOr<SampleResult> r) {
    status = r.status();
    answered.Notify();
  });
  answered.WaitForNotification();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  failure_seen.WaitForNotification();
  EXPECT_FALSE(executor.ready());
  executor.Submit(&b, [&](absl::StatusOr<SampleResult> r) { status = r.status(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace flashsampler
