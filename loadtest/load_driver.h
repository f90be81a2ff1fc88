// LoadDriver: drives flashsampler-server with asynchronous gRPC calls (the
// callback API) over several channels and measures one step at a time.
//
// Closed loop (RunClosedLoop): `concurrency` requests are kept in flight; each
// completion sends the next one at once. Unary: `concurrency` independent
// call chains; stream: `concurrency` SampleStreams, one request in flight on
// each. Latency is measured from the send.
//
// Open loop (RunOpenLoop): each request is sent at its intended time from an
// ArrivalSchedule, whether or not earlier ones were answered; latency is
// measured from the intended time (see ArrivalSchedule). Unary: one call per
// request, sent by --open_loop_senders threads (request k by thread k mod N:
// one thread cannot start more than a few tens of thousands of calls per
// second, and a sender that falls behind adds its lag to every latency).
// Stream: requests go round-robin to
// --open_loop_streams streams; a stream that is busy queues them client-side
// (the server answers one request per stream at a time), and the wait counts.
// When --max_in_flight requests are outstanding, a due request is dropped and
// counted as not_sent instead of growing client memory without bound.
//
// Every step runs warm-up + duration, then waits for its outstanding calls
// (each has the per-request deadline --timeout_s). A stream that ends with an
// error fails its in-flight request with that status; later requests open a
// new stream. One thread calls Run*; gRPC threads run the completions.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "client/channel_security.h"
#include "flashsampler/v1/sampler.grpc.pb.h"
#include "loadtest/arrival_schedule.h"
#include "loadtest/step_recorder.h"

namespace flashsampler::load {

struct DriverOptions {
  bool stream = false;
  absl::Duration warmup = absl::Seconds(1);
  absl::Duration duration = absl::Seconds(5);
  absl::Duration timeout = absl::Seconds(10);  // per request (per stream: window end + timeout)
  int64_t max_in_flight = 10000;                // open loop
  int open_loop_streams = 16;                   // open loop, stream mode
  int open_loop_senders = 4;                    // open loop, unary mode: sending threads
  Arrival arrival = Arrival::kConstant;
  uint64_t arrival_seed = 1;
  int64_t rows_per_request = 1;
};

class LoadDriver {
 public:
  // One stub per channel (used round-robin); `requests` are sent round-robin
  // and must be non-empty; `security` adds the token to every call.
  LoadDriver(std::vector<std::unique_ptr<v1::Sampler::Stub>> stubs, ChannelSecurity security,
             std::vector<v1::SampleRequest> requests, DriverOptions options);
  ~LoadDriver();

  StepResult RunClosedLoop(int concurrency);
  StepResult RunOpenLoop(double rate);

  // For the call objects in load_driver.cc.
  struct Step;
  class StreamSlot;
  const v1::SampleRequest& NextRequest();
  void PrepareContext(grpc::ClientContext* context, absl::Duration timeout) const;
  v1::Sampler::Stub* Stub(int64_t index) const { return stubs_[index % stubs_.size()].get(); }
  void IssueUnary(Step* step, int64_t slot, Clock::time_point due);
  const DriverOptions& options() const { return options_; }

 private:
  std::vector<std::unique_ptr<v1::Sampler::Stub>> stubs_;
  const ChannelSecurity security_;
  const std::vector<v1::SampleRequest> requests_;
  const DriverOptions options_;
  std::atomic<uint64_t> next_request_{0};
};

}  // namespace flashsampler::load
