#include "server/security/token_file_watcher.h"

#include <cstdio>
#include <utility>

#include "client/credential_files.h"

namespace flashsampler {

TokenFileWatcher::TokenFileWatcher(std::string path, BearerTokenAuth* auth, absl::Duration interval,
                                   std::string token_in_use)
    : path_(std::move(path)), auth_(auth), interval_(interval), current_(std::move(token_in_use)) {
  if (interval_ > absl::ZeroDuration()) thread_ = std::thread([this] { Run(); });
}

TokenFileWatcher::~TokenFileWatcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status TokenFileWatcher::RefreshNow() {
  absl::StatusOr<std::string> token = ReadBearerToken(path_, "auth_token_file");
  absl::MutexLock lock(&mu_);
  if (!token.ok()) {
    const std::string error(token.status().message());
    if (error != last_error_) {
      std::fprintf(stderr, "flashsampler-server: %s; the current bearer token stays in use\n", error.c_str());
      last_error_ = error;
    }
    return token.status();
  }
  last_error_.clear();
  if (*token == current_) return absl::OkStatus();
  auth_->Replace(*token);
  current_ = *std::move(token);
  std::fprintf(stderr, "flashsampler-server: a new bearer token from --auth_token_file is in use\n");
  return absl::OkStatus();
}

void TokenFileWatcher::Run() {
  const auto stopped = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopped), interval_)) return;
    }
    RefreshNow().IgnoreError();  // logged there; the current token stays
  }
}

}  // namespace flashsampler
