// CompletionPool: a few threads that run the completion callbacks of finished
// launches (answering gRPC calls: serializing responses, reactor Finish), so
// the DynamicBatcher's single worker can go on to the next launch instead of
// answering every request of the last one itself, one after another.
//
// Thread safety: Post may be called from any thread, concurrently. Callbacks
// run on the pool's threads, each exactly once, in no particular order
// relative to each other (callers that need an order, like a stream's
// responses, post one callback at a time). Drain() blocks until every callback
// posted before it has returned; the destructor drains and joins. Posting after
// the destructor started is a bug.
// Outcomes: none; a callback must not throw.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace flashsampler {

class CompletionPool {
 public:
  // threads >= 1.
  explicit CompletionPool(int threads);
  ~CompletionPool();

  CompletionPool(const CompletionPool&) = delete;
  CompletionPool& operator=(const CompletionPool&) = delete;

  void Post(std::function<void()> callback);
  void Drain();

 private:
  void Run();

  absl::Mutex mu_;
  std::deque<std::function<void()>> pending_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // callbacks taken but not yet returned
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace flashsampler
