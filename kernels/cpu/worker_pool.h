// WorkerPool: a fixed set of persistent threads that run one job at a time.
//
// RunOn(workers, fn) calls fn(worker) exactly once for every worker index in
// [0, min(workers, num_threads())) and returns after all calls have returned;
// RunOnAll(fn) is RunOn(num_threads(), fn). Index 0 runs on the calling
// thread, so a pool of one thread starts no threads at all, and a job of one
// worker wakes none. Work is split inside fn (e.g. by an atomic tile counter):
// the pool only provides the threads, so how work is divided never depends on
// scheduling here.
//
// The threads are started once and each sleeps on its own condition variable
// between jobs, so a job wakes exactly the threads it uses: a 1-row request
// that is one work item costs no wake-up however many threads the pool has
// (waking them all would cost each a futex round trip, and the caller would
// wait for the last of them to check in).
//
// Thread safety: RunOn/RunOnAll must not be called concurrently or re-entered
// from fn (one job at a time); fn must not throw. Everything fn writes is
// visible to the caller when they return (the completion handshake is under a
// mutex).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace flashsampler::kernels {

class WorkerPool {
 public:
  // num_threads >= 1 counts the calling thread: num_threads - 1 threads start.
  explicit WorkerPool(int num_threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int num_threads() const { return static_cast<int>(threads_.size()) + 1; }

  // workers < 1 runs fn(0) alone, like 1.
  void RunOn(int workers, const std::function<void(int worker)>& fn);
  void RunOnAll(const std::function<void(int worker)>& fn) { RunOn(num_threads(), fn); }

 private:
  // One per background thread: the job generation it was last asked to run.
  struct Slot {
    std::condition_variable start_cv;  // signals a new generation (or stop)
    uint64_t generation = 0;
  };
  void ThreadMain(int worker);

  std::mutex mu_;
  std::condition_variable done_cv_;  // signals pending_ reaching 0
  const std::function<void(int)>* job_ = nullptr;
  int pending_ = 0;  // background workers still inside the current job
  bool stop_ = false;
  std::vector<std::unique_ptr<Slot>> slots_;  // [worker - 1]
  std::vector<std::thread> threads_;
};

}  // namespace flashsampler::kernels
