#include "server/batching/completion_pool.h"

#include <utility>

namespace flashsampler {

CompletionPool::CompletionPool(int threads) {
  if (threads < 1) threads = 1;
  threads_.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

CompletionPool::~CompletionPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();  // Run() returns once pending_ is empty
}

void CompletionPool::Post(std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  pending_.push_back(std::move(callback));
}

void CompletionPool::Drain() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_.empty() && running_ == 0;
  };
  mu_.Await(absl::Condition(&idle));
}

void CompletionPool::Run() {
  for (;;) {
    std::function<void()> callback;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !pending_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (pending_.empty()) return;  // stopping, and nothing left to run
      callback = std::move(pending_.front());
      pending_.pop_front();
      ++running_;
    }
    callback();
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace flashsampler
