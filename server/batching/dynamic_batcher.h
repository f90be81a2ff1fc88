// DynamicBatcher: the single owner of the Engine, and the dynamic batcher in
// front of it. gRPC callback threads must not block on compute, so they hand
// validated requests to Submit; one worker thread coalesces the rows of all
// queued requests (unary calls and stream messages alike) into one
// Engine::Sample launch of at most max_batch_rows rows, runs it, and scatters
// the rows back to their requests (server/batching/batch_assembly.h).
//
// Batch formation: the worker waits until max_batch_rows rows are queued, or
// the oldest queued request has waited max_queue_delay, or Stop() was called;
// with max_queue_delay = 0 it launches whatever is queued the moment the
// engine is free. Requests are served in arrival order; one larger than
// max_batch_rows is split over consecutive launches and answered once all of
// its rows are done. Requests with sampling controls never share a launch
// with plain ones, nor (on an engine whose serves_draft_rows() is false for the kind)
// requests with draft rows with ones without: a launch ends at the first
// request of another kind, so arrival order is kept. Just before a launch is formed, queued requests whose
// deadline has passed or whose caller has cancelled are answered without
// compute, which also frees their queue rows.
//
// Admission: at most max_queue_rows rows wait in the queue (rows already
// handed to a launch do not count); a request that does not fit is refused at
// once with ResourceExhausted.
//
// Completion: after a launch the worker hands the requests' `done` callbacks
// to a CompletionPool of `completion_threads` threads (answering a gRPC call
// costs a few microseconds each; done one by one on the worker they would
// delay the next launch by tens to hundreds of microseconds) and forms the next
// launch at once. It posts them a few per pool callback (at least 4, at most
// completion_threads callbacks a launch): each posted callback is a pool lock
// round and may wake a thread, which cost more than answering a request. A launch of a single request with nothing queued behind it
// delays no one: the worker answers that request itself, sparing the hand-off.
//
// Idle: with idle_spin > 0 the worker polls the queue (without the lock) for
// up to that long after a launch before it blocks on the mutex.
//
// Thread safety: every public method may be called from any thread, but
// `done` must not block (it may hold up the next launch) nor call Stop() (it
// may run on the worker, which Stop() joins). `done` runs on a completion
// thread, on the worker thread (requests answered without compute, failed
// launches, and a lone request's launch with nothing queued behind it), or
// inline in Submit when the request is refused.
// Outcomes delivered to `done`, exactly once per Submit: the request's result
// (only the outputs it asked for); Unavailable when no engine is loaded yet,
// the engine is unhealthy or the batcher is stopping; ResourceExhausted when
// the queue is full; DeadlineExceeded when the deadline passed before the
// request ran; Cancelled when the caller went away before it ran; the engine's
// error for a failed launch. A launch of several requests that fails with an
// error one request's rows can cause (InvalidArgument, FailedPrecondition: a
// row with no token left, Unimplemented) while the engine stays healthy is
// re-run request by request, so only the requests at fault get the error;
// any other error (Internal: the engine failed) answers every request of the
// launch.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/batching/batch_assembly.h"
#include "server/batching/completion_pool.h"
#include "server/engine/engine.h"

namespace flashsampler {

class ServerMetrics;

// Why a queued call must not run, or OK when it may. A call whose deadline
// has passed is DEADLINE_EXCEEDED. A call the client cancelled is CANCELLED,
// except when the cancellation comes in the last stretch before the deadline:
// a client cancels at its own deadline, which passes before the server's by
// the time the call's headers took to arrive (more than milliseconds for a
// call queued behind megabytes on a busy connection), so such a cancellation
// is that deadline and counted as one. The stretch is 5% of the call's time
// budget (deadline - enqueued), at least 2 ms and at most 50 ms.
absl::Status ClassifyQueuedCall(absl::Time enqueued, absl::Time deadline, absl::Time now, bool cancelled);

struct BatcherOptions {
  int64_t max_batch_rows = 256;   // rows per Engine::Sample launch
  absl::Duration max_queue_delay = absl::ZeroDuration();
  int64_t max_queue_rows = 4096;  // admission bound, rows waiting for a launch
  int completion_threads = 4;     // threads answering finished requests, >= 1
  // After a launch, while nothing is queued, the worker polls the queue for
  // this long before it blocks: a request arriving meanwhile starts without a
  // thread wake-up (measured ~60 us on the GPU machine, a VM). Costs one
  // core while it polls; zero blocks at once.
  absl::Duration idle_spin = absl::ZeroDuration();
};

class DynamicBatcher {
 public:
  using Done = std::function<void(absl::StatusOr<SampleResult>)>;

  // `metrics` (may be null) receives queue, launch and queue-depth figures.
  // `on_engine_failure` runs on the worker thread after an engine error that
  // left the engine unhealthy (the server flips health to NOT_SERVING).
  DynamicBatcher(BatcherOptions options, ServerMetrics* metrics = nullptr,
                 std::function<void()> on_engine_failure = nullptr);
  ~DynamicBatcher();  // Stop()s

  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Installs the engine once it is loaded (at most once); before that Submit
  // answers Unavailable.
  void SetEngine(std::unique_ptr<Engine> engine);
  bool ready() const;
  // The engine's shape, backend and device memory; empty until an engine is set.
  ModelShape shape() const;
  // What a request parser needs to know of the engine, in one call: its
  // shape, and how it takes hidden states (WireInput, server/engine/engine.h; unset for an
  // engine that takes fp32 only, or before an engine is set).
  struct EngineInput {
    ModelShape shape;
    std::optional<WireInput> wire;
  };
  EngineInput engine_input() const;
  std::string backend_name() const;
  std::vector<DeviceMemoryInfo> DeviceMemory() const;
  const BatcherOptions& options() const { return options_; }

  // `batch` (validated, 1 <= rows) must stay alive until `done` has been
  // called. `deadline`: the caller's deadline; `cancelled`, when set, is polled
  // before the request is launched (it must be cheap and thread-safe).
  // `admitted`, when set, runs once the request is admitted (its rows count
  // in the queue) and before it joins the queue, on the calling thread,
  // outside the batcher's lock; the caller may still change the batch there
  // (no launch sees it yet): the CUDA path starts its rows' copy to the GPU
  // (server/api/wire_upload.h). It does not run for a refused request.
  void Submit(const SampleBatch* batch, Done done, absl::Time deadline = absl::InfiniteFuture(),
              std::function<bool()> cancelled = nullptr, std::function<void()> admitted = nullptr);

  // Rows waiting for a launch right now.
  int64_t queued_rows() const;
  // True while the worker is inside a launch (a hint, read without the
  // lock): a request admitted now waits for it, time in which its rows can
  // cross the bus; one admitted while the engine is idle is launched at once.
  bool launch_running() const { return launch_running_.load(std::memory_order_relaxed); }

  // Refuses new work, runs what is queued (without waiting for the delay),
  // joins the worker and waits until every `done` has returned. Idempotent.
  void Stop();

 private:
  struct Job;
  struct Launch;
  void WorkerLoop();
  // Waits for work and forms the next launch; false when stopping and drained.
  // Requests answered without compute are moved to `refused`.
  bool NextLaunch(Launch* launch, std::vector<std::pair<std::shared_ptr<Job>, absl::Status>>* refused);
  void RunLaunch(Engine* engine, Launch& launch);
  // One engine launch of `slices` (a lone whole request without a copy),
  // checked for the draft log-probabilities the scatter needs, and recorded
  // in the launch metrics.
  absl::StatusOr<SampleResult> SampleSlices(Engine* engine, const std::vector<RowSlice>& slices);
  // After a launch of several requests failed with a request's error: each
  // request's slice alone, each request answered with its own outcome.
  void RunSlicesAlone(Engine* engine, Launch& launch);
  // Answers every request of `launch` with `status` (and drops the queued
  // rest of a split request).
  void FailLaunch(Engine* engine, Launch& launch, const absl::Status& status);
  // A request answered early: its rows still queued (only ever at the
  // queue's front) leave the queue.
  void DropQueuedRest(const std::shared_ptr<Job>& job);
  // Scatters one slice's result into its request; true once all the
  // request's rows are done (it is then to be answered).
  bool CompleteSlice(Job& job, const RowSlice& slice, const SampleResult& result,
                     int64_t launch_row);
  // Answers finished requests: inline (on this thread), else through the
  // completion pool, a few requests per posted callback.
  void Answer(std::vector<std::shared_ptr<Job>> jobs, bool inline_completion);
  void PublishQueueRows() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls queued_jobs_ for up to options_.idle_spin while it is 0.
  void SpinWhileIdle() const;

  const BatcherOptions options_;
  ServerMetrics* const metrics_;
  const std::function<void()> on_engine_failure_;
  mutable absl::Mutex mu_;
  std::unique_ptr<Engine> engine_ ABSL_GUARDED_BY(mu_);
  // engine_.get(), published once by SetEngine, for the lock-free readers
  // on the request path (ready, engine_input): the engine, once set, lives
  // as long as the batcher, and what they read of it is immutable or
  // callable from any thread.
  std::atomic<const Engine*> loaded_{nullptr};
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_rows_ ABSL_GUARDED_BY(mu_) = 0;  // with the rows of admitting_ requests
  // Requests admitted whose `admitted` callback is running: counted in
  // queued_rows_, not yet in queue_; the worker does not stop before they
  // are queued.
  int admitting_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // queue_.size() and stopping_, mirrored (written under mu_) for the lock-free
  // idle poll and the inline-completion decision.
  std::atomic<int64_t> queued_jobs_{0};
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> launch_running_{false};  // launch_running()
  CompletionPool completions_;  // before worker_: it outlives the worker's last Post
  std::thread worker_;
};

}  // namespace flashsampler
