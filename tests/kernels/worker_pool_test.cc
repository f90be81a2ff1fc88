// Tests of kernels/cpu/worker_pool.h.
#include "kernels/cpu/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace flashsampler::kernels {
namespace {

TEST(WorkerPoolTest, RunsEveryWorkerIndexOncePerJob) {
  for (int threads : {1, 2, 3, 8}) {
    WorkerPool pool(threads);
    ASSERT_EQ(pool.num_threads(), threads);
    for (int job = 0; job < 200; ++job) {
      std::vector<int> calls(threads, 0);  // plain ints: RunOnAll publishes them
      pool.RunOnAll([&](int worker) { ++calls[worker]; });
      for (int w = 0; w < threads; ++w) ASSERT_EQ(calls[w], 1) << threads << " " << w;
    }
  }
}

TEST(WorkerPoolTest, WorkerZeroIsTheCaller) {
  WorkerPool pool(3);
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::thread::id> ids(3);
  pool.RunOnAll([&](int worker) { ids[worker] = std::this_thread::get_id(); });
  EXPECT_EQ(ids[0], caller);
  EXPECT_NE(ids[1], caller);
  EXPECT_NE(ids[2], caller);
  EXPECT_NE(ids[1], ids[2]);
}

TEST(WorkerPoolTest, SharedCounterSplitsWork) {
  WorkerPool pool(4);
  constexpr int kItems = 100000;
  std::vector<int> done(kItems, 0);
  std::atomic<int> next{0};
  pool.RunOnAll([&](int) {
    for (int i = next.fetch_add(1); i < kItems; i = next.fetch_add(1)) done[i] += 1;
  });
  for (int i = 0; i < kItems; ++i) ASSERT_EQ(done[i], 1) << i;
}

TEST(WorkerPoolTest, DestroysIdlePool) {
  for (int i = 0; i < 20; ++i) WorkerPool pool(3);  // start and stop, no jobs
}

}  // namespace
}  // namespace flashsampler::kernels
