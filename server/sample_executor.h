// SampleExecutor: the single owner of the Engine. gRPC callback threads must
// not block on compute, so they hand validated batches to this executor, whose
// one worker thread runs them in arrival order and calls back with the result.
// (The dynamic batcher will coalesce queued batches here.)
//
// Thread safety: Submit, SetEngine, ready and Stop may be called from any
// thread. Callbacks run on the worker thread, or inline in Submit when the
// executor cannot take work.
// Outcomes delivered to `done`, exactly once per Submit: the engine's result;
// Unavailable when no engine is loaded yet or the executor is stopping;
// Cancelled when the caller went away before the job ran; Internal when the
// engine failed (the engine then may report !healthy()).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/engine.h"

namespace flashsampler {

class SampleExecutor {
 public:
  using Done = std::function<void(absl::StatusOr<SampleResult>)>;

  // `on_engine_failure` runs on the worker thread after an engine error that
  // left the engine unhealthy (the server flips health to NOT_SERVING).
  explicit SampleExecutor(std::function<void()> on_engine_failure = nullptr);
  ~SampleExecutor();  // Stop()s

  SampleExecutor(const SampleExecutor&) = delete;
  SampleExecutor& operator=(const SampleExecutor&) = delete;

  // Installs the engine once it is loaded; before that Submit answers Unavailable.
  void SetEngine(std::unique_ptr<Engine> engine);
  bool ready() const;
  // The engine's shape; only meaningful once ready().
  ModelShape shape() const;
  std::string backend_name() const;

  // `batch` must stay alive until `done` has been called. `cancelled`, when
  // set, is polled just before the batch would run: a job whose caller is gone
  // is answered Cancelled without computing.
  void Submit(const SampleBatch* batch, Done done, std::function<bool()> cancelled = nullptr);

  // Refuses new work, runs what is queued, joins the worker. Idempotent.
  void Stop();

 private:
  struct Job {
    const SampleBatch* batch;
    Done done;
    std::function<bool()> cancelled;
  };
  void WorkerLoop();

  const std::function<void()> on_engine_failure_;
  mutable absl::Mutex mu_;
  std::unique_ptr<Engine> engine_ ABSL_GUARDED_BY(mu_);
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace flashsampler
