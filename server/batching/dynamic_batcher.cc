#include "server/batching/dynamic_batcher.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <utility>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/batching/spin_wait.h"
#include "server/telemetry/metrics.h"

namespace flashsampler {

// One request in the batcher. `next_row` rows have been handed to launches;
// the request stays in the queue until next_row == rows. Only the worker
// touches next_row .. result after Submit, so they need no lock of their own.
struct DynamicBatcher::Job {
  const SampleBatch* batch = nullptr;
  Done done;
  absl::Time deadline;
  std::function<bool()> cancelled;
  absl::Time enqueued;
  int64_t next_row = 0;
  int64_t rows_done = 0;
  SampleResult result;
};

// The rows of one Engine::Sample call: slices[i] comes from jobs[i].
struct DynamicBatcher::Launch {
  std::vector<std::shared_ptr<Job>> jobs;
  std::vector<RowSlice> slices;
};

DynamicBatcher::DynamicBatcher(BatcherOptions options, ServerMetrics* metrics,
                               std::function<void()> on_engine_failure)
    : options_(options),
      metrics_(metrics),
      on_engine_failure_(std::move(on_engine_failure)),
      completions_(options.completion_threads),
      worker_([this] { WorkerLoop(); }) {}

DynamicBatcher::~DynamicBatcher() { Stop(); }

void DynamicBatcher::SetEngine(std::unique_ptr<Engine> engine) {
  absl::MutexLock lock(&mu_);
  engine_ = std::move(engine);
  loaded_.store(engine_.get(), std::memory_order_release);
}

DynamicBatcher::EngineInput DynamicBatcher::engine_input() const {
  const Engine* engine = loaded_.load(std::memory_order_acquire);
  if (engine == nullptr) return {};
  EngineInput input{engine->shape(), std::nullopt};
  if (engine->reads_wire_hidden(kHostMemory)) {
    input.wire = WireInput{engine->host_staging(), engine->device_upload()};
  }
  return input;
}

bool DynamicBatcher::ready() const {
  const Engine* engine = loaded_.load(std::memory_order_acquire);
  return engine != nullptr && engine->healthy();
}

ModelShape DynamicBatcher::shape() const {
  absl::MutexLock lock(&mu_);
  return engine_ ? engine_->shape() : ModelShape{};
}

std::string DynamicBatcher::backend_name() const {
  absl::MutexLock lock(&mu_);
  return engine_ ? engine_->backend_name() : std::string();
}

std::vector<DeviceMemoryInfo> DynamicBatcher::DeviceMemory() const {
  Engine* engine;
  {
    absl::MutexLock lock(&mu_);
    engine = engine_.get();
  }
  // The engine, once set, lives as long as the batcher; DeviceMemory is
  // callable from any thread, so the queue lock is not held while it runs.
  return engine ? engine->DeviceMemory() : std::vector<DeviceMemoryInfo>{};
}

int64_t DynamicBatcher::queued_rows() const {
  absl::MutexLock lock(&mu_);
  return queued_rows_;
}

void DynamicBatcher::PublishQueueRows() {
  queued_jobs_.store(static_cast<int64_t>(queue_.size()), std::memory_order_release);
  if (metrics_ != nullptr) metrics_->SetQueueRows(queued_rows_);
}

void DynamicBatcher::SpinWhileIdle() const {
  if (options_.idle_spin <= absl::ZeroDuration()) return;
  SpinUntil(
      [this] {
        return queued_jobs_.load(std::memory_order_acquire) != 0 ||
               stop_requested_.load(std::memory_order_acquire);
      },
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(options_.idle_spin));
}

absl::Status ClassifyQueuedCall(absl::Time enqueued, absl::Time deadline, absl::Time now, bool cancelled) {
  if (deadline <= now) return absl::DeadlineExceededError("the deadline passed while the request was queued");
  if (!cancelled) return absl::OkStatus();
  // Also covers gRPC's own deadline cancellation, timed on its clock, which
  // the converted deadline can trail by microseconds. An infinite deadline
  // has no last stretch.
  const absl::Duration stretch =
      deadline == absl::InfiniteFuture()
          ? absl::ZeroDuration()
          : std::clamp((deadline - enqueued) / 20, absl::Milliseconds(2), absl::Milliseconds(50));
  if (deadline - now <= stretch) {
    return absl::DeadlineExceededError("the deadline passed while the request was queued");
  }
  return absl::CancelledError("the call was cancelled before its batch ran");
}

void DynamicBatcher::Submit(const SampleBatch* batch, Done done, absl::Time deadline,
                            std::function<bool()> cancelled, std::function<void()> admitted) {
  absl::Status refusal;
  std::shared_ptr<Job> admitted_job;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      refusal = absl::UnavailableError("server is shutting down");
    } else if (engine_ == nullptr) {
      refusal = absl::UnavailableError("model weights are still loading");
    } else if (!engine_->healthy()) {
      refusal = absl::UnavailableError("the sampling backend failed and is not serving");
    } else if (queued_rows_ + batch->rows > options_.max_queue_rows) {
      refusal = absl::ResourceExhaustedError(absl::StrCat(
          "server overloaded: ", queued_rows_, " rows queued, this request needs ", batch->rows,
          " more and the queue holds ", options_.max_queue_rows, "; retry with backoff"));
    } else {
      auto job = std::make_shared<Job>();
      job->batch = batch;
      job->done = std::move(done);
      job->deadline = deadline;
      job->cancelled = std::move(cancelled);
      job->enqueued = absl::Now();
      queued_rows_ += batch->rows;
      if (!admitted) {
        queue_.push_back(std::move(job));
        PublishQueueRows();
        return;
      }
      ++admitting_;
      admitted_job = std::move(job);
    }
  }
  if (admitted_job == nullptr) {
    done(refusal);
    return;
  }
  admitted();
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(admitted_job));
  --admitting_;
  PublishQueueRows();
}

void DynamicBatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stop_requested_.store(true, std::memory_order_release);
  }
  if (worker_.joinable()) worker_.join();
  completions_.Drain();
}

bool DynamicBatcher::NextLaunch(Launch* launch,
                                std::vector<std::pair<std::shared_ptr<Job>, absl::Status>>* refused) {
  SpinWhileIdle();
  absl::MutexLock lock(&mu_);
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || (stopping_ && admitting_ == 0);
  };
  mu_.Await(absl::Condition(&has_work));
  if (queue_.empty()) return false;  // stopping and drained (nothing is being admitted)
  // Let the batch fill: until it is full, the oldest request has waited
  // max_queue_delay, or Stop() asks to drain now.
  auto full_or_stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queued_rows_ >= options_.max_batch_rows || stopping_;
  };
  // Skipped at zero delay: a timed wait whose deadline has passed still
  // sleeps the thread's timer slack (measured ~45 us per launch on the GPU
  // machine).
  if (options_.max_queue_delay > absl::ZeroDuration()) {
    mu_.AwaitWithDeadline(absl::Condition(&full_or_stopping),
                          queue_.front()->enqueued + options_.max_queue_delay);
  }

  // Requests that must not run: answered without compute, rows released. No
  // job has rows in flight here (one worker, one launch at a time), so even a
  // partly launched request can be dropped.
  const absl::Time now = absl::Now();
  for (auto it = queue_.begin(); it != queue_.end();) {
    Job& job = **it;
    const bool cancelled = job.deadline > now && job.cancelled && job.cancelled();
    absl::Status status = ClassifyQueuedCall(job.enqueued, job.deadline, now, cancelled);
    if (status.ok()) {
      ++it;
      continue;
    }
    queued_rows_ -= job.batch->rows - job.next_row;
    refused->emplace_back(std::move(*it), std::move(status));
    it = queue_.erase(it);
  }

  // The launch plan (server/batching/batch_assembly.h): arrival order, at most
  // max_batch_rows rows, controlled and plain requests never mixed, nor
  // requests with and without draft rows where the engine cannot serve them
  // together (Engine::serves_draft_rows). Each
  // request has >= 1 row, so only the first max_batch_rows can take part.
  std::vector<PendingRequest> pending;
  const size_t considered = static_cast<size_t>(
      std::min<int64_t>(static_cast<int64_t>(queue_.size()), options_.max_batch_rows));
  pending.reserve(considered);
  for (size_t i = 0; i < considered; ++i) pending.push_back({queue_[i]->batch, queue_[i]->next_row});
  DraftMixing mixing;
  mixing.plain = engine_ == nullptr || engine_->serves_draft_rows(false);
  mixing.controlled = engine_ == nullptr || engine_->serves_draft_rows(true);
  launch->slices = PlanLaunch(pending, options_.max_batch_rows, mixing);
  for (const RowSlice& slice : launch->slices) {
    // Only the last slice can leave rows of its job queued: every earlier
    // job was taken whole and popped, so this slice's job is at the front.
    std::shared_ptr<Job>& job = queue_.front();
    launch->jobs.push_back(job);
    job->next_row += slice.rows;
    queued_rows_ -= slice.rows;
    if (job->next_row == job->batch->rows) queue_.pop_front();
  }
  PublishQueueRows();
  return true;
}

void DynamicBatcher::RunLaunch(Engine* engine, Launch& launch) {
  const absl::Time start = absl::Now();
  for (size_t i = 0; i < launch.jobs.size(); ++i) {
    Job& job = *launch.jobs[i];
    if (launch.slices[i].first_row != 0) continue;  // a later part of a split request
    job.result = ResultFor(*job.batch);
    if (metrics_ != nullptr) metrics_->RecordQueueWait(absl::ToDoubleSeconds(start - job.enqueued));
  }
  absl::StatusOr<SampleResult> result = SampleSlices(engine, launch.slices);
  if (!result.ok()) {
    const absl::StatusCode code = result.status().code();
    const bool request_error = code == absl::StatusCode::kInvalidArgument ||
                               code == absl::StatusCode::kFailedPrecondition ||
                               code == absl::StatusCode::kUnimplemented;
    if (request_error && launch.slices.size() > 1 && engine->healthy()) {
      RunSlicesAlone(engine, launch);
    } else {
      FailLaunch(engine, launch, result.status());
    }
    return;
  }
  // A launch of one request with nothing queued behind it: no next launch
  // waits for this thread, so it answers the request itself (one thread
  // hand-off less, ~35 us measured at 1 request in flight). Larger launches
  // go to the pool even then: answering ~25 requests here (~10 us each)
  // would delay the launch their successors are about to join.
  const bool inline_completion =
      launch.jobs.size() == 1 && queued_jobs_.load(std::memory_order_acquire) == 0;
  std::vector<std::shared_ptr<Job>> answered;
  answered.reserve(launch.jobs.size());
  int64_t launch_row = 0;
  for (size_t i = 0; i < launch.jobs.size(); ++i) {
    if (CompleteSlice(*launch.jobs[i], launch.slices[i], *result, launch_row)) {
      answered.push_back(std::move(launch.jobs[i]));
    }
    launch_row += launch.slices[i].rows;
  }
  Answer(std::move(answered), inline_completion);
}

absl::StatusOr<SampleResult> DynamicBatcher::SampleSlices(Engine* engine,
                                                          const std::vector<RowSlice>& slices) {
  const absl::Time start = absl::Now();
  // Host wire rows of an engine that takes fp32 (the parser left rows in the
  // weights' 16-bit dtype in their message) are widened here, straight into
  // the launch.
  const bool widen_wire_rows = !engine->reads_wire_hidden(kHostMemory);
  // One whole request runs on the request's own batch: no copy.
  const bool whole_request = slices.size() == 1 && slices[0].first_row == 0 &&
                             slices[0].rows == slices[0].batch->rows &&
                             !(widen_wire_rows && !slices[0].batch->wire_hidden.empty());
  SampleBatch concatenated;
  if (!whole_request) {
    concatenated = ConcatenateSlices(slices, engine->shape().hidden_size, widen_wire_rows);
  }
  const SampleBatch& batch = whole_request ? *slices[0].batch : concatenated;
  // The engine is only touched by this thread; the lock is not held while
  // computing, so Submit never waits for a launch to finish.
  absl::StatusOr<SampleResult> result = engine->Sample(batch);
  // The scatter reads draft_logprobs for requests with drafts: a backend that
  // ignores draft_tokens (breaking the Engine contract) fails the launch
  // instead of handing out unverified tokens.
  if (result.ok() && !batch.draft_tokens.empty() &&
      static_cast<int64_t>(result->draft_logprobs.size()) != batch.rows) {
    result = absl::UnimplementedError(absl::StrCat("the ", engine->backend_name(),
                                                   " backend does not serve Verify (draft rows)"));
  }
  if (metrics_ != nullptr) {
    metrics_->RecordLaunch(batch.rows, absl::ToDoubleSeconds(absl::Now() - start),
                           result.ok() ? LaunchPathName(result->path) : "error");
  }
  return result;
}

bool DynamicBatcher::CompleteSlice(Job& job, const RowSlice& slice, const SampleResult& result,
                                   int64_t launch_row) {
  ScatterSlice(result, launch_row, slice, &job.result);
  job.rows_done += slice.rows;
  return job.rows_done == job.batch->rows;
}

namespace {
// Each posted chunk answers at least this many requests (or all there are):
// a chunk is one pool lock round and may wake a pool thread, while the
// launch's answers still spread over the pool's threads.
constexpr size_t kMinAnswersPerChunk = 4;
}  // namespace

void DynamicBatcher::Answer(std::vector<std::shared_ptr<Job>> jobs, bool inline_completion) {
  const auto answer = [](std::vector<std::shared_ptr<Job>>& some) {
    for (std::shared_ptr<Job>& job : some) {
      Done done = std::move(job->done);  // released when it returns
      done(std::move(job->result));
    }
  };
  if (jobs.empty()) return;
  if (inline_completion) {
    answer(jobs);
    return;
  }
  // The launch's answers go out in at most completion_threads chunks, one
  // Post (and at most one wake-up) each, instead of one per request.
  const size_t n = jobs.size();
  const size_t chunks = std::max<size_t>(
      1, std::min<size_t>(static_cast<size_t>(options_.completion_threads), n / kMinAnswersPerChunk));
  if (chunks == 1) {
    completions_.Post([answer, jobs = std::move(jobs)]() mutable { answer(jobs); });
    return;
  }
  for (size_t c = 0; c < chunks; ++c) {
    std::vector<std::shared_ptr<Job>> chunk(std::make_move_iterator(jobs.begin() + n * c / chunks),
                                            std::make_move_iterator(jobs.begin() + n * (c + 1) / chunks));
    completions_.Post([answer, chunk = std::move(chunk)]() mutable { answer(chunk); });
  }
}

void DynamicBatcher::DropQueuedRest(const std::shared_ptr<Job>& job) {
  absl::MutexLock lock(&mu_);
  if (!queue_.empty() && queue_.front() == job) {
    queued_rows_ -= job->batch->rows - job->next_row;
    queue_.pop_front();
    PublishQueueRows();
  }
}

void DynamicBatcher::FailLaunch(Engine* engine, Launch& launch, const absl::Status& status) {
  const bool failed = !engine->healthy();
  DropQueuedRest(launch.jobs.back());
  for (const std::shared_ptr<Job>& job : launch.jobs) job->done(status);
  if (failed && on_engine_failure_) on_engine_failure_();
}

void DynamicBatcher::RunSlicesAlone(Engine* engine, Launch& launch) {
  // Each slice is one request's rows (a request appears once per launch).
  // Run them all first, then answer: a request's outcome does not depend on
  // the order of the others'.
  const size_t n = launch.slices.size();
  std::vector<absl::StatusOr<SampleResult>> results;
  results.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!engine->healthy()) {  // an earlier re-run failed the engine: no more compute
      results.push_back(absl::UnavailableError("the engine failed while isolating a failed launch"));
      continue;
    }
    results.push_back(SampleSlices(engine, {launch.slices[i]}));
  }
  // The split request at the end whose slice failed leaves the queue.
  if (!results.back().ok()) DropQueuedRest(launch.jobs.back());
  std::vector<std::shared_ptr<Job>> answered;
  for (size_t i = 0; i < n; ++i) {
    Job& job = *launch.jobs[i];
    if (!results[i].ok()) {
      job.done(results[i].status());
      continue;
    }
    if (CompleteSlice(job, launch.slices[i], *results[i], /*launch_row=*/0)) {
      answered.push_back(launch.jobs[i]);
    }
  }
  Answer(std::move(answered), /*inline_completion=*/false);
  if (!engine->healthy() && on_engine_failure_) on_engine_failure_();
}

void DynamicBatcher::WorkerLoop() {
#if defined(__linux__)
  // The queue delay's timed waits wake within a microsecond instead of after
  // the default 50 us timer slack.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
  for (;;) {
    Launch launch;
    std::vector<std::pair<std::shared_ptr<Job>, absl::Status>> refused;
    const bool more = NextLaunch(&launch, &refused);
    for (auto& [job, status] : refused) job->done(std::move(status));
    if (!more) return;
    if (launch.jobs.empty()) continue;  // everything queued was refused
    Engine* engine;
    {
      absl::MutexLock lock(&mu_);
      engine = engine_.get();  // jobs are only queued once an engine is set
    }
    launch_running_.store(true, std::memory_order_relaxed);
    RunLaunch(engine, launch);
    launch_running_.store(false, std::memory_order_relaxed);
  }
}

}  // namespace flashsampler
