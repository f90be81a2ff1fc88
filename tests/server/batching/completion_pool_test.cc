// CompletionPool: every posted callback runs exactly once, Drain waits for all
// of them (including ones still running), callbacks run in parallel, and the
// destructor runs what is still pending.
#include "server/batching/completion_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace flashsampler {
namespace {

TEST(CompletionPoolTest, RunsEveryCallbackOnceAndDrainWaitsForThem) {
  CompletionPool pool(4);
  constexpr int kCallbacks = 10000;
  std::vector<std::atomic<int>> runs(kCallbacks);
  for (int i = 0; i < kCallbacks; ++i) {
    pool.Post([&runs, i] { runs[i].fetch_add(1); });
  }
  pool.Drain();
  for (int i = 0; i < kCallbacks; ++i) ASSERT_EQ(runs[i].load(), 1) << "callback " << i;
}

TEST(CompletionPoolTest, DrainWaitsForARunningCallback) {
  CompletionPool pool(2);
  std::atomic<bool> finished{false};
  absl::Notification started;
  pool.Post([&] {
    started.Notify();
    absl::SleepFor(absl::Milliseconds(50));
    finished.store(true);
  });
  started.WaitForNotification();
  pool.Drain();  // the callback was taken off the queue but has not returned
  EXPECT_TRUE(finished.load());
}

// Two callbacks that each wait for the other can only both finish if they run
// on different threads at the same time.
TEST(CompletionPoolTest, CallbacksRunInParallel) {
  CompletionPool pool(2);
  absl::Notification a, b;
  std::atomic<int> met{0};
  pool.Post([&] {
    a.Notify();
    if (b.WaitForNotificationWithTimeout(absl::Seconds(10))) met.fetch_add(1);
  });
  pool.Post([&] {
    b.Notify();
    if (a.WaitForNotificationWithTimeout(absl::Seconds(10))) met.fetch_add(1);
  });
  pool.Drain();
  EXPECT_EQ(met.load(), 2);
}

TEST(CompletionPoolTest, DestructorRunsWhatIsPending) {
  std::atomic<int> runs{0};
  {
    CompletionPool pool(1);
    for (int i = 0; i < 100; ++i) pool.Post([&runs] { runs.fetch_add(1); });
  }
  EXPECT_EQ(runs.load(), 100);
}

}  // namespace
}  // namespace flashsampler
