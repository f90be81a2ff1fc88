#include "tests/e2e/server_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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
std::string AddressAfter(const char* line, const char* marker) {
  const char* at = std::strstr(line, marker);
  if (at == nullptr) return "";
  std::string address(at + std::strlen(marker));
  while (!address.empty() && (address.back() == '\n' || address.back() == '\r')) address.pop_back();
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
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe failed");
  std::vector<std::string> args = {ServerBinary(), "--address=127.0.0.1:0"};
  args.insert(args.end(), flags_.begin(), flags_.end());
  pid_ = fork();
  if (pid_ < 0) return absl::InternalError("fork failed");
  if (pid_ == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  // stdout: an optional "metrics on HOST:PORT/metrics" line, then "server
  // listening on HOST:PORT", then "health listening on HOST:PORT" when there is
  // a health-only port. fdopen takes ownership of out[0].
  const bool health_port = std::any_of(flags_.begin(), flags_.end(), [](const std::string& f) {
    return f.rfind("--health_address=", 0) == 0;
  });
  FILE* stream = fdopen(out[0], "r");
  char line[512] = {0};
  while ((address_.empty() || (health_port && health_address_.empty())) &&
         fgets(line, sizeof line, stream) != nullptr) {
    if (std::string metrics = AddressAfter(line, "metrics on "); !metrics.empty()) {
      metrics_address_ = metrics.substr(0, metrics.find('/'));
    } else if (std::string health = AddressAfter(line, "health listening on "); !health.empty()) {
      health_address_ = health;
    } else if (std::string main = AddressAfter(line, "server listening on "); !main.empty()) {
      address_ = main;
    }
  }
  fclose(stream);
  if (address_.empty()) return absl::InternalError(absl::StrCat("server printed no address: ", line));
  if (health_port && health_address_.empty()) {
    return absl::InternalError(absl::StrCat("server printed no health address: ", line));
  }

  SamplerClient client(health_port ? health_address_ : address_,
                       health_port ? ChannelSecurity() : security_);
  const absl::Time deadline = absl::Now() + ready_timeout;
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
