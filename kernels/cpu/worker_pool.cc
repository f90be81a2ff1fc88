#include "kernels/cpu/worker_pool.h"

#include <algorithm>

namespace flashsampler::kernels {

WorkerPool::WorkerPool(int num_threads) {
  const int background = num_threads > 1 ? num_threads - 1 : 0;
  slots_.reserve(background);
  for (int i = 0; i < background; ++i) slots_.push_back(std::make_unique<Slot>());
  threads_.reserve(background);
  for (int i = 0; i < background; ++i) {
    threads_.emplace_back([this, worker = i + 1] { ThreadMain(worker); });
  }
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  for (auto& slot : slots_) slot->start_cv.notify_one();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::RunOn(int workers, const std::function<void(int)>& fn) {
  const int background = std::min(workers, num_threads()) - 1;
  if (background <= 0) {
    fn(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    pending_ = background;
    for (int i = 0; i < background; ++i) ++slots_[i]->generation;
  }
  for (int i = 0; i < background; ++i) slots_[i]->start_cv.notify_one();
  fn(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void WorkerPool::ThreadMain(int worker) {
  Slot& slot = *slots_[worker - 1];
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      slot.start_cv.wait(lock, [&] { return stop_ || slot.generation != seen; });
      if (stop_) return;
      seen = slot.generation;
      job = job_;
    }
    (*job)(worker);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

}  // namespace flashsampler::kernels
