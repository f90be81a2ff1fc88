// BearerTokenAuth: checks that a call carries `authorization: Bearer <token>`
// with the server's token (--auth_token_file).
//
// The comparison runs in time independent of the presented value: both tokens
// are hashed with SHA-256 and the digests compared with CRYPTO_memcmp, so
// neither a matching prefix nor the presented length changes the timing.
// Neither token ever appears in a status message or a log.
//
// Thread safety: Check and Replace may be called from any number of threads
// at once; a call checked while Replace runs sees the old token or the new
// one, whole. Check returns OK, or Unauthenticated when the header is
// missing, not a Bearer credential, or carries another token. Replace (a
// rotated token file, TokenFileWatcher) makes `token` the only one accepted.
#pragma once

#include <array>
#include <map>
#include <string>

#include <grpcpp/support/string_ref.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace flashsampler {

class BearerTokenAuth {
 public:
  explicit BearerTokenAuth(const std::string& token);

  absl::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;
  void Replace(const std::string& token);

 private:
  mutable absl::Mutex mu_;
  std::array<unsigned char, 32> token_digest_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashsampler
