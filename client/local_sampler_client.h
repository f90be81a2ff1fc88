// LocalSamplerClient: a blocking client of flashsampler-server's local
// channel (--local_socket; the frames are client/local_frame.h's), for an
// engine on the same host. It sends the same SampleRequest messages as
// SamplerClient, without gRPC, over one Unix-domain connection. Its use is a
// request whose tensors are in registered memory regions (SamplerClient's
// RegisterSystemSharedMemory / RegisterCudaIpc, over gRPC, once): then the
// request is a descriptor of a few hundred bytes, and the round trip is what
// this path saves.
//
// Outcomes of Sample: the response; the server's status for the request
// (the codes are SamplerClient's: INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
// DEADLINE_EXCEEDED, ...), after which the connection serves the next
// request; or a connection-level failure: UNAVAILABLE when the connection
// broke or the server drains (its goodbye), DEADLINE_EXCEEDED when no answer
// came within the timeout plus a second. After a connection-level failure
// every call fails with it: Connect again.
//
// Thread safety: calls on one client are serialized (one request in flight
// per connection, as on a SampleStream); for concurrency, one client per
// thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "flashsampler/v1/sampler.pb.h"

namespace flashsampler {

class LocalSamplerClient {
 public:
  struct Options {
    // How long Sample busy-polls the socket for the answer before it sleeps
    // in a blocking read (local::PollForData): the wake-up it spares costs
    // tens of microseconds on a VM. The calling thread's core spins meanwhile;
    // an engine thread that waits for the token anyway loses nothing. Zero:
    // block at once.
    absl::Duration busy_poll = absl::ZeroDuration();
  };
  // Connects to the socket at `path`. UNAVAILABLE when nobody listens there.
  static absl::StatusOr<std::unique_ptr<LocalSamplerClient>> Connect(const std::string& path,
                                                                     Options options);
  static absl::StatusOr<std::unique_ptr<LocalSamplerClient>> Connect(const std::string& path) {
    return Connect(path, Options());
  }
  ~LocalSamplerClient();
  LocalSamplerClient(const LocalSamplerClient&) = delete;
  LocalSamplerClient& operator=(const LocalSamplerClient&) = delete;

  // `timeout` is the request's deadline at the server (its frame carries it,
  // at most ~71 minutes); the client waits a second longer for the answer.
  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& request,
                                            absl::Duration timeout = absl::Seconds(60));
  // True after a connection-level failure (the server refused the connection,
  // e.g. RESOURCE_EXHAUSTED past its connection limit, closed it, or broke
  // it): every later Sample fails at once with that status.
  bool broken() const;

 private:
  LocalSamplerClient(int fd, Options options) : fd_(fd), options_(options) {}

  const int fd_;
  const Options options_;
  mutable absl::Mutex mu_;
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // a connection-level failure, sticky
  absl::Duration receive_timeout_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::string out_ ABSL_GUARDED_BY(mu_);
  std::string in_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashsampler
