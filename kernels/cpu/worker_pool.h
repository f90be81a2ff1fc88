// WorkerPool: a fixed set of persistent threads that run one job at a time.
//
// RunOnAll(fn) calls fn(worker) exactly once for every worker index in
// [0, num_threads()) and returns after all calls have returned. Index 0 runs on
// the calling thread, so a pool of one thread starts no threads at all. Work is
// split inside fn (e.g. by an atomic tile counter): the pool only provides the
// threads, so how work is divided never depends on scheduling here.
//
// The threads are started once and sleep on a condition variable between jobs,
// which keeps the per-call overhead to one wake-up instead of a thread start.
//
// Thread safety: RunOnAll must not be called concurrently or re-entered from fn
// (one job at a time); fn must not throw. Everything fn writes is visible to the
// caller when RunOnAll returns (the completion handshake is under a mutex).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
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

  void RunOnAll(const std::function<void(int worker)>& fn);

 private:
  void ThreadMain(int worker);

  std::mutex mu_;
  std::condition_variable start_cv_;  // signals a new generation (or stop)
  std::condition_variable done_cv_;   // signals pending_ reaching 0
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;  // background workers still inside the current job
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace flashsampler::kernels
