// MetricsHttpServer: the plain-HTTP endpoint Prometheus scrapes (GET /metrics).
//
// Why our own and not prometheus-cpp's Exposer: the Exposer runs on civetweb,
// whose threads get a fixed 100 KiB stack (Debian 12's civetweb 1.15). glibc
// carves every thread's static TLS out of its stack, and with cuBLAS linked
// (≈ 110 KiB of static TLS in libcublasLt) plus OpenBLAS (60 KiB) the total
// exceeds 100 KiB, so civetweb cannot start a thread (pthread_create: EINVAL)
// in a CUDA build. This server uses one std::thread with the default stack.
// It is deliberately small: one connection at a time (scrapes are rare), 2
// seconds for a request to arrive whole (not per read: a client that trickles
// bytes is dropped too) and an 8 KiB request limit so a stuck or hostile
// client cannot hold it for longer, HTTP/1.0-style "Connection: close"
// answers; out of descriptors, it waits 10 ms between accepts.
//
// Thread safety: Start once, then Stop (or the destructor) from any thread.
// `body` is called on the server thread for every GET /metrics.
// Outcomes: Start returns the bound port, or Unavailable when the address
// cannot be resolved or bound; InvalidArgument for an address without a port.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace flashsampler {

class MetricsHttpServer {
 public:
  explicit MetricsHttpServer(std::function<std::string()> body);
  ~MetricsHttpServer();  // Stop()s
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Listens on HOST:PORT (port 0: a free one) and serves until Stop.
  absl::StatusOr<int> Start(const std::string& address);
  void Stop();

 private:
  void Loop();
  void Answer(int connection);

  const std::function<std::string()> body_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};  // Stop writes here to end poll()
  std::thread thread_;
};

}  // namespace flashsampler
