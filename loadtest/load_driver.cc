#include "loadtest/load_driver.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace flashsampler::load {

// What the calls of one step share. `live` counts the calls (unary calls and
// streams) not yet done: the step ends when it is back at zero. `in_flight`
// counts requests sent or queued but not answered (for --max_in_flight).
struct LoadDriver::Step {
  Step(Clock::time_point start, const DriverOptions& o, bool closed)
      : recorder(start + absl::ToChronoNanoseconds(o.warmup),
                 start + absl::ToChronoNanoseconds(o.warmup + o.duration), o.rows_per_request),
        end(start + absl::ToChronoNanoseconds(o.warmup + o.duration)),
        closed_loop(closed) {}

  void BeginCall() {
    absl::MutexLock lock(&mu);
    ++live;
  }
  void EndCall() {
    absl::MutexLock lock(&mu);
    --live;
  }
  void WaitForCalls() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(+[](int64_t* n) { return *n == 0; }, &live));
  }
  void Answered(Clock::time_point due, grpc::StatusCode code) {
    recorder.Record(due, Clock::now(), code);
    in_flight.fetch_sub(1, std::memory_order_relaxed);
  }

  StepRecorder recorder;
  const Clock::time_point end;
  const bool closed_loop;
  std::atomic<int64_t> in_flight{0};
  absl::Mutex mu;
  int64_t live ABSL_GUARDED_BY(mu) = 0;
};

namespace {

struct UnaryCall {
  grpc::ClientContext context;
  v1::SampleResponse response;
  Clock::time_point due;
  int64_t slot = 0;
};

}  // namespace

// One client-side stream position: a queue of due requests and the stream
// (gRPC call) currently carrying them. The call holds a reactor hold for its
// whole life, so it cannot be deleted while this slot may still write to it;
// the hold is released when the slot half-closes it or when a read fails
// (the stream broke), and OnDone then reports the final status. All state is
// under mu_; gRPC operations are started after unlocking.
class LoadDriver::StreamSlot {
 public:
  StreamSlot(LoadDriver* driver, Step* step, int64_t index)
      : driver_(driver), step_(step), index_(index) {}

  // A request is due now (open loop: at `due`).
  void Enqueue(Clock::time_point due) {
    step_->in_flight.fetch_add(1, std::memory_order_relaxed);
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      pending_.push_back(due);
      actions = NextActions();
    }
    Run(actions);
  }

  // No more requests will be enqueued: half-close once the queue is empty.
  void Close() {
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
      actions = NextActions();
    }
    Run(actions);
  }

 private:
  class Call final : public grpc::ClientBidiReactor<v1::SampleRequest, v1::SampleResponse> {
   public:
    Call(StreamSlot* slot) : slot_(slot) {
      const absl::Duration left =
          absl::FromChrono(slot->step_->end - Clock::now()) + slot->driver_->options().timeout;
      slot->driver_->PrepareContext(&context_, left);
      slot->driver_->Stub(slot->index_)->async()->SampleStream(&context_, this);
      AddHold();
    }
    // Write, then read: the next write starts only after this read, so at
    // most one write is ever outstanding (gRPC's rule) even when the
    // response overtakes the write's completion.
    void Send(const v1::SampleRequest* request) { StartWrite(request); }
    void OnWriteDone(bool ok) override {
      if (ok) {
        StartRead(&response_);
      } else {
        slot_->OnBroken(this);
      }
    }
    void OnReadDone(bool ok) override {
      if (ok) {
        slot_->OnResponse();
      } else {
        slot_->OnBroken(this);
      }
    }
    // The call (and its ClientContext) is deleted before the step counts it
    // out: once `live` reaches zero the driver may return and the process
    // tear gRPC down, which must not race a context still being destroyed
    // here (seen as a gRPC ref-count abort at exit, 1 run in ~10 of
    // load_e2e_test's streams). The unary calls do the same.
    void OnDone(const grpc::Status& status) override {
      Step* const step = slot_->OnCallDone(this, status);
      delete this;
      step->EndCall();
    }

    Clock::time_point orphan_due;  // the request in flight when the stream broke
    bool has_orphan = false;

   private:
    StreamSlot* const slot_;
    grpc::ClientContext context_;
    v1::SampleResponse response_;
  };

  // What to do after unlocking.
  struct Actions {
    Call* start = nullptr;       // StartCall on this new call
    Call* send_on = nullptr;     // send the next request on this call
    Call* close = nullptr;       // half-close and release this call
  };

  Actions NextActions() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Actions a;
    if (in_flight_) return a;
    if (!pending_.empty()) {
      if (call_ == nullptr) {
        call_ = new Call(this);
        step_->BeginCall();
        a.start = call_;
      }
      in_flight_ = true;
      a.send_on = call_;
    } else if (closing_ && call_ != nullptr) {
      a.close = call_;
      call_ = nullptr;
    }
    return a;
  }

  void Run(const Actions& a) {
    if (a.send_on != nullptr) a.send_on->Send(&driver_->NextRequest());
    if (a.start != nullptr) a.start->StartCall();
    if (a.close != nullptr) {
      a.close->StartWritesDone();
      a.close->RemoveHold();
    }
  }

  void OnResponse() {
    Clock::time_point due;
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      due = pending_.front();
      pending_.pop_front();
      in_flight_ = false;
      if (step_->closed_loop && Clock::now() < step_->end) {
        pending_.push_back(Clock::now());
        step_->in_flight.fetch_add(1, std::memory_order_relaxed);
      }
      actions = NextActions();
    }
    step_->Answered(due, grpc::StatusCode::OK);
    Run(actions);
  }

  // The stream ended under an in-flight request: it fails with the call's
  // final status (in OnDone); queued requests go to a new stream.
  void OnBroken(Call* call) {
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      call->orphan_due = pending_.front();
      call->has_orphan = true;
      pending_.pop_front();
      in_flight_ = false;
      if (call_ == call) call_ = nullptr;
      // Closed loop: the slot keeps its place in the concurrency with a fresh stream.
      if (step_->closed_loop && Clock::now() < step_->end) {
        pending_.push_back(Clock::now());
        step_->in_flight.fetch_add(1, std::memory_order_relaxed);
      }
      actions = NextActions();
    }
    call->RemoveHold();
    Run(actions);
  }

  // Records the final status of a call that broke under a request; returns
  // the step, which the caller counts the call out of once it is deleted.
  Step* OnCallDone(Call* call, const grpc::Status& status) {
    if (call->has_orphan) {
      // A stream that ended OK with a request unanswered lost it.
      step_->Answered(call->orphan_due,
                      status.ok() ? grpc::StatusCode::DATA_LOSS : status.error_code());
    }
    return step_;
  }

  LoadDriver* const driver_;
  Step* const step_;
  const int64_t index_;
  absl::Mutex mu_;
  std::deque<Clock::time_point> pending_ ABSL_GUARDED_BY(mu_);  // front is in flight when in_flight_
  Call* call_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

LoadDriver::LoadDriver(std::vector<std::unique_ptr<v1::Sampler::Stub>> stubs,
                       ChannelSecurity security, std::vector<v1::SampleRequest> requests,
                       DriverOptions options)
    : stubs_(std::move(stubs)),
      security_(std::move(security)),
      requests_(std::move(requests)),
      options_(options) {}

LoadDriver::~LoadDriver() = default;

const v1::SampleRequest& LoadDriver::NextRequest() {
  return requests_[next_request_.fetch_add(1, std::memory_order_relaxed) % requests_.size()];
}

void LoadDriver::PrepareContext(grpc::ClientContext* context, absl::Duration timeout) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  security_.Apply(context);
}

void LoadDriver::IssueUnary(Step* step, int64_t slot, Clock::time_point due) {
  auto* call = new UnaryCall;
  call->due = due;
  call->slot = slot;
  PrepareContext(&call->context, options_.timeout);
  step->BeginCall();
  step->in_flight.fetch_add(1, std::memory_order_relaxed);
  Stub(slot)->async()->Sample(&call->context, &NextRequest(), &call->response,
                              [this, step, call](grpc::Status status) {
                                step->Answered(call->due, status.error_code());
                                // The next call of a closed-loop chain starts
                                // before this one is counted out, so `live`
                                // cannot touch zero mid-step.
                                if (step->closed_loop && Clock::now() < step->end) {
                                  IssueUnary(step, call->slot, Clock::now());
                                }
                                delete call;
                                step->EndCall();
                              });
}

StepResult LoadDriver::RunClosedLoop(int concurrency) {
  Step step(Clock::now(), options_, /*closed=*/true);
  std::vector<std::unique_ptr<StreamSlot>> slots;
  for (int i = 0; i < concurrency; ++i) {
    if (options_.stream) {
      slots.push_back(std::make_unique<StreamSlot>(this, &step, i));
      slots.back()->Enqueue(Clock::now());
    } else {
      IssueUnary(&step, i, Clock::now());
    }
  }
  std::this_thread::sleep_until(step.end);
  for (auto& slot : slots) slot->Close();
  step.WaitForCalls();
  StepResult result = step.recorder.Finish();
  result.concurrency = concurrency;
  return result;
}

StepResult LoadDriver::RunOpenLoop(double rate) {
  const Clock::time_point start = Clock::now();
  Step step(start, options_, /*closed=*/false);
  std::vector<std::unique_ptr<StreamSlot>> slots;
  if (options_.stream) {
    for (int i = 0; i < options_.open_loop_streams; ++i) {
      slots.push_back(std::make_unique<StreamSlot>(this, &step, i));
    }
  }
  // The whole schedule first (the Poisson draws are sequential), then the
  // senders walk their shares of it.
  ArrivalSchedule schedule(rate, options_.arrival, options_.arrival_seed);
  std::vector<Clock::time_point> due_times;
  for (;;) {
    const Clock::time_point due =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(schedule.Next()));
    if (due >= step.end) break;
    due_times.push_back(due);
  }
  const int senders = options_.stream ? 1 : std::max(1, options_.open_loop_senders);
  auto send_share = [&](int sender) {
    for (size_t k = static_cast<size_t>(sender); k < due_times.size(); k += senders) {
      const Clock::time_point due = due_times[k];
      std::this_thread::sleep_until(due);
      if (step.in_flight.load(std::memory_order_relaxed) >= options_.max_in_flight) {
        step.recorder.RecordNotSent(due);
      } else if (options_.stream) {
        slots[k % slots.size()]->Enqueue(due);
      } else {
        IssueUnary(&step, static_cast<int64_t>(k), due);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int s = 1; s < senders; ++s) threads.emplace_back(send_share, s);
  send_share(0);
  for (std::thread& t : threads) t.join();
  std::this_thread::sleep_until(step.end);
  for (auto& slot : slots) slot->Close();
  step.WaitForCalls();
  StepResult result = step.recorder.Finish();
  result.target_rps = rate;
  return result;
}

}  // namespace flashsampler::load
