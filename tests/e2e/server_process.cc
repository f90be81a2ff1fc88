#include "tests/e2e/server_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/sampler_client.h"

namespace flashsampler::testing {

// FLASHSAMPLER_SERVER_BIN in the environment overrides the build path (binaries
// carried to another machine, e.g. the GPU device machine).
std::string ServerBinary() {
  const char* env = std::getenv("FLASHSAMPLER_SERVER_BIN");
  return env != nullptr && *env != '\0' ? env : FLASHSAMPLER_SERVER_BIN;
}
std::string CliBinary() { return FLASHSAMPLER_CLI_BIN; }

namespace {

// The HOST:PORT after `marker` in a line the server printed, or empty.
std::string AddressAfter(const std::string& line, const char* marker) {
  const size_t at = line.find(marker);
  if (at == std::string::npos) return "";
  std::string address = line.substr(at + std::strlen(marker));
  while (!address.empty() && address.back() == '\r') address.pop_back();
  return address;
}

}  // namespace

ServerProcess::ServerProcess(std::vector<std::string> extra_flags, ChannelSecurity security)
    : flags_(std::move(extra_flags)), security_(std::move(security)) {}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

absl::Status ServerProcess::Start(absl::Duration ready_timeout) {
  const absl::Time deadline = absl::Now() + ready_timeout;
  // The read end is close-on-exec so that no other child inherits it; the
  // write end becomes the server's stdout (dup2 clears the flag on fd 1).
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  std::vector<std::string> args = {ServerBinary(), "--address=127.0.0.1:0"};
  args.insert(args.end(), flags_.begin(), flags_.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // posix_spawn, not fork + exec: this process already runs gRPC's threads
  // (started by its static initialisation), and a forked child that touches
  // the heap before exec can block forever on a lock one of them held at the
  // fork. The likely cause of a hang under ASan in CI: the server printed
  // nothing, and the unbounded read that stood here waited for a line nobody
  // would write (server/README-dev.md, "Tests under load").
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  const int spawned = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (spawned != 0) {
    close(out[0]);
    pid_ = -1;
    return absl::InternalError(absl::StrCat("posix_spawn ", argv[0], ": ", std::strerror(spawned)));
  }
  // stdout: an optional "metrics on HOST:PORT/metrics" line, then "server
  // listening on HOST:PORT", then "health listening on HOST:PORT" when there is
  // a health-only port. Each read waits at most until the deadline.
  const bool health_port = std::any_of(flags_.begin(), flags_.end(), [](const std::string& f) {
    return f.rfind("--health_address=", 0) == 0;
  });
  std::string pending;  // bytes read, not yet a whole line
  std::string last_line;
  bool eof = false;
  while ((address_.empty() || (health_port && health_address_.empty())) && !eof) {
    const size_t newline = pending.find('\n');
    if (newline != std::string::npos) {
      last_line = pending.substr(0, newline);
      pending.erase(0, newline + 1);
      if (std::string metrics = AddressAfter(last_line, "metrics on "); !metrics.empty()) {
        metrics_address_ = metrics.substr(0, metrics.find('/'));
      } else if (std::string health = AddressAfter(last_line, "health listening on ");
                 !health.empty()) {
        health_address_ = health;
      } else if (std::string main = AddressAfter(last_line, "server listening on ");
                 !main.empty()) {
        address_ = main;
      }
      continue;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    pollfd readable = {out[0], POLLIN, 0};
    // At most a second a poll: an infinite ready_timeout stays a valid int.
    const int wait_ms =
        static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left), 999)) + 1;
    const int ready = poll(&readable, 1, wait_ms);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char chunk[512];
    const ssize_t n = read(out[0], chunk, sizeof chunk);
    if (n > 0) {
      pending.append(chunk, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      eof = true;
    }
  }
  close(out[0]);
  if (address_.empty() || (health_port && health_address_.empty())) {
    const std::string what = address_.empty() ? "no address" : "no health address";
    if (eof) return absl::InternalError(absl::StrCat("server printed ", what, ": ", last_line));
    return absl::DeadlineExceededError(
        absl::StrCat("server printed ", what, " within ", absl::FormatDuration(ready_timeout)));
  }

  SamplerClient client(health_port ? health_address_ : address_,
                       health_port ? ChannelSecurity() : security_);
  while (absl::Now() < deadline) {
    if (!running()) return absl::InternalError("server exited during start-up");
    auto health = client.CheckHealth("", absl::Seconds(2));
    if (health.ok() && *health == grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(50));  // poll interval of the bounded readiness wait
  }
  return absl::DeadlineExceededError("server did not become SERVING");
}

bool ServerProcess::running() {
  if (pid_ <= 0) return false;
  int status;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  // Reaped here: keep its status for WaitForExit (a second waitpid would fail).
  if (r == pid_) exit_status_ = status;
  pid_ = -1;
  return false;
}

void ServerProcess::SendSignal(int signal_number) {
  if (pid_ > 0) kill(pid_, signal_number);
}

absl::StatusOr<int> ServerProcess::Stop(int signal_number, absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("not started");
  kill(pid_, signal_number);
  return WaitForExit(timeout);
}

absl::StatusOr<int> ServerProcess::WaitForExit(absl::Duration timeout) {
  auto exit_code = [](int status) -> absl::StatusOr<int> {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return absl::InternalError(absl::StrCat("server died by signal ", WTERMSIG(status)));
  };
  if (pid_ <= 0) {
    if (exit_status_.has_value()) return exit_code(*exit_status_);
    return absl::FailedPreconditionError("not started");
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      exit_status_ = status;
      return exit_code(status);
    }
    absl::SleepFor(absl::Milliseconds(20));  // poll interval of the bounded wait for exit
  }
  return absl::DeadlineExceededError("server did not exit in time");
}

}  // namespace flashsampler::testing
