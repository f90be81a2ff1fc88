#include "server/sample_executor.h"

#include <utility>

#include "absl/status/status.h"

namespace flashsampler {

SampleExecutor::SampleExecutor(std::function<void()> on_engine_failure)
    : on_engine_failure_(std::move(on_engine_failure)), worker_([this] { WorkerLoop(); }) {}

SampleExecutor::~SampleExecutor() { Stop(); }

void SampleExecutor::SetEngine(std::unique_ptr<Engine> engine) {
  absl::MutexLock lock(&mu_);
  engine_ = std::move(engine);
}

bool SampleExecutor::ready() const {
  absl::MutexLock lock(&mu_);
  return engine_ != nullptr && engine_->healthy();
}

ModelShape SampleExecutor::shape() const {
  absl::MutexLock lock(&mu_);
  return engine_ ? engine_->shape() : ModelShape{};
}

std::string SampleExecutor::backend_name() const {
  absl::MutexLock lock(&mu_);
  return engine_ ? engine_->backend_name() : std::string();
}

void SampleExecutor::Submit(const SampleBatch* batch, Done done, std::function<bool()> cancelled) {
  absl::Status refusal;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      refusal = absl::UnavailableError("server is shutting down");
    } else if (engine_ == nullptr) {
      refusal = absl::UnavailableError("model weights are still loading");
    } else if (!engine_->healthy()) {
      refusal = absl::UnavailableError("the sampling backend failed and is not serving");
    } else {
      queue_.push_back(Job{batch, std::move(done), std::move(cancelled)});
      return;
    }
  }
  done(refusal);
}

void SampleExecutor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (worker_.joinable()) worker_.join();
}

void SampleExecutor::WorkerLoop() {
  for (;;) {
    Job job;
    Engine* engine;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&has_work));
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
      engine = engine_.get();  // jobs are only queued once an engine is set
    }
    if (job.cancelled && job.cancelled()) {
      job.done(absl::CancelledError("the call was cancelled before its batch ran"));
      continue;
    }
    // The engine is only touched by this thread; the lock is not held while
    // computing, so Submit never waits for a batch to finish.
    absl::StatusOr<SampleResult> result = engine->Sample(*job.batch);
    const bool failed = !result.ok() && !engine->healthy();
    job.done(std::move(result));
    if (failed && on_engine_failure_) on_engine_failure_();
  }
}

}  // namespace flashsampler
