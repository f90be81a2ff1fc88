#include "tests/e2e/server_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/sampler_client.h"

namespace flashsampler::testing {

std::string ServerBinary() { return FLASHSAMPLER_SERVER_BIN; }
std::string CliBinary() { return FLASHSAMPLER_CLI_BIN; }

ServerProcess::ServerProcess(std::vector<std::string> extra_flags) : flags_(std::move(extra_flags)) {}

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
  // The "listening on" line names the port; a "metrics on" line may come first.
  // fdopen takes ownership of out[0].
  FILE* stream = fdopen(out[0], "r");
  char line[512] = {0};
  const char* marker = "listening on ";
  const char* metrics_marker = "metrics on ";
  const char* at = nullptr;
  while (at == nullptr && fgets(line, sizeof line, stream) != nullptr) {
    if (const char* m = std::strstr(line, metrics_marker); m != nullptr) {
      metrics_address_ = std::string(m + std::strlen(metrics_marker));
      metrics_address_ = metrics_address_.substr(0, metrics_address_.find('/'));
    }
    at = std::strstr(line, marker);
  }
  fclose(stream);
  if (at == nullptr) return absl::InternalError(absl::StrCat("server printed no address: ", line));
  address_ = std::string(at + std::strlen(marker));
  while (!address_.empty() && (address_.back() == '\n' || address_.back() == '\r')) address_.pop_back();

  SamplerClient client(address_);
  const absl::Time deadline = absl::Now() + ready_timeout;
  while (absl::Now() < deadline) {
    if (!running()) return absl::InternalError("server exited during start-up");
    auto health = client.CheckHealth("", absl::Seconds(2));
    if (health.ok() && *health == grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError("server did not become SERVING");
}

bool ServerProcess::running() {
  if (pid_ <= 0) return false;
  int status;
  return waitpid(pid_, &status, WNOHANG) == 0;
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
  if (pid_ <= 0) return absl::FailedPreconditionError("not started");
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return absl::InternalError(absl::StrCat("server died by signal ", WTERMSIG(status)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError("server did not exit in time");
}

}  // namespace flashsampler::testing
