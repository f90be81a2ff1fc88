// Tests of kernels/cpu/worker_pool.h.
#include "kernels/cpu/worker_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// A job of k workers runs exactly indices [0, k), and the threads left out
// neither run it nor miss the next job that needs them (each thread counts
// its own generations).
TEST(WorkerPoolTest, RunOnRunsOnlyTheWorkersAskedFor) {
  WorkerPool pool(4);
  const int plan[] = {1, 3, 2, 4, 0, 1, 1, 4, 2, 7, 3, 1, 4};
  for (int round = 0; round < 50; ++round) {
    for (int k : plan) {
      std::vector<int> calls(4, 0);
      pool.RunOn(k, [&](int worker) { ++calls[worker]; });
      const int expected = std::min(std::max(k, 1), 4);
      for (int w = 0; w < 4; ++w) ASSERT_EQ(calls[w], w < expected ? 1 : 0) << k << " " << w;
    }
  }
}

TEST(WorkerPoolTest, OneWorkerJobRunsOnTheCaller) {
  WorkerPool pool(3);
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran;
  pool.RunOn(1, [&](int worker) {
    EXPECT_EQ(worker, 0);
    ran = std::this_thread::get_id();
  });
  EXPECT_EQ(ran, caller);
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
