// TokenFileWatcher: follows --auth_token_file while the server runs, so a
// rotated token takes effect without a restart.
//
// Every `interval` a background thread reads the file again
// (ReadBearerToken: trimmed, non-empty) and, when it holds another token,
// makes that the only one BearerTokenAuth accepts. A file that cannot be read
// or holds no valid token (missing, empty) changes nothing: the current
// token stays, and the failure is logged once until it changes. Writers must
// replace the file atomically (write a new file, rename it over the old; a
// Kubernetes Secret volume does so): a read in the middle of an in-place
// rewrite can see a valid-looking prefix of the new token and install it
// until the next read.
//
// Thread safety: RefreshNow may be called from any thread, also while the
// background thread runs; the destructor stops that thread and waits for it.
// RefreshNow returns OK when the file held a token (the same or a new one),
// else the read's error (the token in use unchanged).
#pragma once

#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/security/bearer_token_auth.h"

namespace flashsampler {

class TokenFileWatcher {
 public:
  // `auth` must outlive the watcher and accept `token_in_use` (the token it
  // was built from, the server's start-up read): the first read that finds
  // another token in the file replaces it, also when the file changed
  // between that start-up read and this constructor.
  // interval <= 0: no background thread; only RefreshNow reads the file.
  TokenFileWatcher(std::string path, BearerTokenAuth* auth, absl::Duration interval, std::string token_in_use);
  ~TokenFileWatcher();
  TokenFileWatcher(const TokenFileWatcher&) = delete;
  TokenFileWatcher& operator=(const TokenFileWatcher&) = delete;

  absl::Status RefreshNow();

 private:
  void Run();

  const std::string path_;
  BearerTokenAuth* const auth_;
  const absl::Duration interval_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The token `auth_` accepts, and the last failure logged.
  std::string current_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace flashsampler
