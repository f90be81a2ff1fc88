// LocalChannelServer: flashsampler-server's same-host request path. It
// listens on a Unix-domain stream socket (--local_socket=PATH) and serves
// Sample requests framed as client/local_frame.h describes, through the same
// SamplerService::StartSample as a gRPC stream message: the same validation,
// memory regions, batcher, metrics (method "LocalSample") and drain. It exists
// for engines on the same host whose tensors already travel through
// registered regions: their request is a descriptor of a few hundred bytes,
// and a gRPC round trip costs more than the kernel's budget for the whole
// service (local_frame.h says how much).
//
// A connection behaves like a SampleStream: its requests are answered one at
// a time, in order, each with a SampleResponse frame or a Status frame of
// the same call id. A client that sends ahead finds its frames waiting in
// the socket, which is the flow control. Unlike a stream, a request's error
// does not end the connection. Only a frame that cannot be trusted ends it:
// a bad magic, an unknown kind, a payload over the limit, a frame of a kind
// clients do not send. The server answers it with a Status frame of call id
// 0, then closes. A request still queued when its client hangs up is dropped
// without compute (CANCELLED), as a gRPC call whose client went away; the
// batcher asks (one poll(2) per queued request) before each launch.
//
// Who may connect: the socket file is made mode 0600 before the server
// listens, and a peer (SO_PEERCRED) that is neither this process's user nor
// root gets PERMISSION_DENIED and is closed. There is no TLS and no bearer
// token on this path: the host's user identity is the credential, as for the
// shared-memory regions the requests name.
//
// Threads: one accepting thread and one thread per connection (at most
// `max_connections`; one more gets RESOURCE_EXHAUSTED and is closed). A
// connection's thread reads, parses and submits; the batcher's thread that
// completes the request writes its answer. The two never write at once: the
// reading thread writes (a parse error, the goodbye) only while no request
// of its connection is in flight. With `idle_poll` set, one connection
// thread at a time spins while its request is in flight (the others sleep).
//
// Lifecycle, all from one thread (main):
// - Start binds. A socket file that nobody listens on is replaced; one in use
//   is FAILED_PRECONDITION.
// - BeginDrain, next to SamplerService::BeginDrain: stops accepting. Every
//   connection ends once its current request is answered, with a Status
//   frame UNAVAILABLE of call id 0, then end of stream. Frames already in
//   the socket are still read and refused with UNAVAILABLE, so a client
//   learns the fate of every request it sent.
// - Stop, once the batcher has stopped (no answer can come later): closes
//   what is left, joins every thread and removes the socket file. The
//   destructor Stops.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/api/sampler_service.h"

namespace flashsampler {

struct LocalChannelOptions {
  std::string path;                           // the socket file
  int max_connections = 64;                   // open connections at most
  uint32_t max_request_bytes = 64u << 20;     // a request frame's payload at most
  // After answering, a connection's thread busy-polls its socket this long
  // for the next request before it sleeps in a blocking read; and while its
  // request is in flight it spins this long for the answer before it sleeps
  // on it (one connection of the server at a time), so that it is running
  // when the client's next request comes (main passes the batcher's idle
  // spin, --idle_spin_us: the same trade of a core for a wake-up). Zero:
  // block at once.
  absl::Duration idle_poll = absl::ZeroDuration();
};

// Whether a process accepts connections on the Unix-domain socket file
// `path` (a connect succeeds). The local channel replaces a socket file only
// when nobody does; main refuses a unix: gRPC address that is in use, as gRPC
// would replace the file. Thread-safe.
bool UnixSocketServed(const std::string& path);

class LocalChannelServer {
 public:
  // `service` must outlive the server. InvalidArgument for a path that does
  // not fit a socket address; FailedPrecondition when another process
  // listens on it; other failures as errno says.
  static absl::StatusOr<std::unique_ptr<LocalChannelServer>> Start(LocalChannelOptions options,
                                                                   SamplerService* service);
  ~LocalChannelServer();

  // Stops accepting (the listener is shut; another server may then take the
  // path) and ends each connection after its current request.
  void BeginDrain();
  // Ends every connection and removes the socket file if it is still the
  // one this server bound.
  void Stop();
  const std::string& path() const { return options_.path; }

  class Connection;  // local_channel_server.cc

 private:
  struct SocketFileId {  // the socket file this server bound
    dev_t device;
    ino_t inode;
  };
  LocalChannelServer(LocalChannelOptions options, SamplerService* service, int listen_fd, SocketFileId file);
  void AcceptLoop();
  // Joins and frees the connections whose thread has ended.
  void ReapFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const LocalChannelOptions options_;
  SamplerService* const service_;
  const int listen_fd_;
  const SocketFileId file_;
  std::thread accept_thread_;
  bool stopped_ = false;  // main's thread only
  // Whether a connection thread spins for its answer now (one at most: with
  // several requests in flight, one more core per connection would buy
  // each of them the same few microseconds).
  std::atomic<bool> answer_spinner_{false};
  absl::Mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace flashsampler
