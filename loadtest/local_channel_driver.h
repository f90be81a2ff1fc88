// LocalChannelDriver: flashsampler-load's closed loop over the local channel
// (--local_socket; client/local_sampler_client.h) instead of gRPC.
//
// RunClosedLoop(c) opens c connections, one thread each, and keeps one
// request in flight on each (the local channel answers a connection's
// requests one at a time, as a SampleStream does): each answer sends the
// next request at once. Latency runs from the send; the window and the
// counting are StepRecorder's, as for LoadDriver. A connection that fails
// records the failure and is opened again for the next request.
//
// Thread safety: one thread calls RunClosedLoop; it runs its own threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "client/local_sampler_client.h"
#include "flashsampler/v1/sampler.pb.h"
#include "loadtest/load_driver.h"
#include "loadtest/step_recorder.h"

namespace flashsampler::load {

class LocalChannelDriver {
 public:
  // `requests` are sent round-robin and must be non-empty; of `options`,
  // warmup, duration, timeout and rows_per_request apply.
  LocalChannelDriver(std::string socket_path, LocalSamplerClient::Options client_options,
                     std::vector<v1::SampleRequest> requests, DriverOptions options);

  StepResult RunClosedLoop(int concurrency);

 private:
  const std::string socket_path_;
  const LocalSamplerClient::Options client_options_;
  const std::vector<v1::SampleRequest> requests_;
  const DriverOptions options_;
  std::atomic<uint64_t> next_request_{0};
};

}  // namespace flashsampler::load
