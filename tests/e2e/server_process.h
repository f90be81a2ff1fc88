// ServerProcess: runs the real flashsampler-server binary on a free loopback
// port for end-to-end tests, and stops it with a signal.
//
// Start() spawns the binary (posix_spawn) with --address=127.0.0.1:0, reads
// the "listening on HOST:PORT" line from its stdout (and, before it, the
// "metrics on HOST:PORT/metrics" line when --metrics_address is given, and the
// "health listening on" line when a --health_address flag is given) and waits
// until health answers SERVING: on the plaintext health port when there is
// one, else on the main port with `security` (TLS, client certificate, token).
// The whole start, the reads included, is bounded by `ready_timeout`: a server
// that never prints its address fails Start with DEADLINE_EXCEEDED instead of
// hanging the test. Not thread-safe; one test thread drives it.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/channel_security.h"

namespace flashsampler::testing {

class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> extra_flags, ChannelSecurity security = {});
  ~ServerProcess();  // SIGKILLs a server still running

  absl::Status Start(absl::Duration ready_timeout = absl::Seconds(60));
  const std::string& address() const { return address_; }
  const std::string& health_address() const { return health_address_; }  // empty: none
  // HOST:PORT of /metrics; empty when the server was started without it.
  const std::string& metrics_address() const { return metrics_address_; }
  pid_t pid() const { return pid_; }  // -1 when not started or exited
  // Whether the process is still alive; one that has exited is reaped here and
  // its status kept for WaitForExit / Stop.
  bool running();

  // Sends `signal_number` and waits up to `timeout` for exit. Returns the exit
  // status (WEXITSTATUS) or DeadlineExceeded if it did not exit in time.
  absl::StatusOr<int> Stop(int signal_number, absl::Duration timeout);
  void SendSignal(int signal_number);
  // Waits up to `timeout` for a process that stops by itself (e.g. after a
  // failed start); its exit status, or DeadlineExceeded.
  absl::StatusOr<int> WaitForExit(absl::Duration timeout);

 private:
  std::vector<std::string> flags_;
  ChannelSecurity security_;
  std::string health_address_;
  pid_t pid_ = -1;
  std::optional<int> exit_status_;  // waitpid status, once reaped
  std::string address_;
  std::string metrics_address_;
};

// Path of a binary built next to the tests (set by CMake; the environment
// variable FLASHSAMPLER_SERVER_BIN overrides the server's).
std::string ServerBinary();
std::string CliBinary();

}  // namespace flashsampler::testing
