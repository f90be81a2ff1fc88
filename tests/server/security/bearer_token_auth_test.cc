#include "server/security/bearer_token_auth.h"

#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace flashsampler {
namespace {

// Checks a call carrying `headers` (the strings outlive the string_refs).
absl::StatusCode CheckHeaders(const BearerTokenAuth& auth,
                              const std::vector<std::pair<std::string, std::string>>& headers) {
  std::multimap<grpc::string_ref, grpc::string_ref> metadata;
  for (const auto& [key, value] : headers) metadata.emplace(key, value);
  return auth.Check(metadata).code();
}

TEST(BearerTokenAuth, AcceptsOnlyTheExactTokenAsABearerCredential) {
  const BearerTokenAuth auth("tok-123_ABC");
  using H = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(CheckHeaders(auth, H{{"authorization", "Bearer tok-123_ABC"}}), absl::StatusCode::kOk);
  // The scheme is case-insensitive (RFC 6750); the token is not.
  EXPECT_EQ(CheckHeaders(auth, H{{"authorization", "bearer tok-123_ABC"}}), absl::StatusCode::kOk);
  EXPECT_EQ(CheckHeaders(auth, H{{"authorization", "Bearer tok-123_abc"}}),
            absl::StatusCode::kUnauthenticated);
  for (const char* value : {"Bearer tok-123_AB", "Bearer tok-123_ABCD", "Bearer ", "Bearer",
                            "Basic tok-123_ABC", "tok-123_ABC", "Bearertok-123_ABC", ""}) {
    EXPECT_EQ(CheckHeaders(auth, H{{"authorization", value}}), absl::StatusCode::kUnauthenticated)
        << "'" << value << "'";
  }
  EXPECT_EQ(CheckHeaders(auth, H{}), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckHeaders(auth, H{{"x-token", "Bearer tok-123_ABC"}}), absl::StatusCode::kUnauthenticated);
  // Two authorization headers are ambiguous, even when one is right.
  EXPECT_EQ(CheckHeaders(auth, H{{"authorization", "Bearer tok-123_ABC"}, {"authorization", "Bearer x"}}),
            absl::StatusCode::kUnauthenticated);
  // Other metadata does not matter.
  EXPECT_EQ(CheckHeaders(auth, H{{"user-agent", "x"}, {"authorization", "Bearer tok-123_ABC"}}),
            absl::StatusCode::kOk);
}

TEST(BearerTokenAuth, StatusNeverEchoesEitherToken) {
  const BearerTokenAuth auth("server-secret");
  std::multimap<grpc::string_ref, grpc::string_ref> metadata;
  const std::string key = "authorization";
  const std::string value = "Bearer client-guess";
  metadata.emplace(key, value);
  const absl::Status status = auth.Check(metadata);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(std::string(status.message()).find("secret"), std::string::npos);
  EXPECT_EQ(std::string(status.message()).find("guess"), std::string::npos);
}

// Replace makes the new token the only one accepted, also while other threads
// check calls: a checker that tries the old token and then the new one across
// the one replacement finds one of them accepted, never neither (each check
// sees one whole token). TSan runs this too.
TEST(BearerTokenAuth, ReplaceSwapsTheTokenWhileCallsAreChecked) {
  BearerTokenAuth auth("old-token");
  using H = std::vector<std::pair<std::string, std::string>>;
  const H old_header{{"authorization", "Bearer old-token"}};
  const H new_header{{"authorization", "Bearer new-token"}};
  std::atomic<bool> done{false};
  std::atomic<int64_t> checks{0};
  std::atomic<int> neither{0};
  std::vector<std::thread> checkers;
  for (int t = 0; t < 4; ++t) {
    checkers.emplace_back([&] {
      while (!done.load()) {
        const bool old_ok = CheckHeaders(auth, old_header) == absl::StatusCode::kOk;
        const bool new_ok = CheckHeaders(auth, new_header) == absl::StatusCode::kOk;
        if (!old_ok && !new_ok) neither.fetch_add(1);
        checks.fetch_add(1);
      }
    });
  }
  const auto await_checks = [&](int64_t n) {
    while (checks.load() < n) std::this_thread::yield();
  };
  await_checks(1000);
  auth.Replace("new-token");
  const int64_t at_replace = checks.load();
  await_checks(at_replace + 1000);
  done.store(true);
  for (std::thread& t : checkers) t.join();
  EXPECT_EQ(CheckHeaders(auth, new_header), absl::StatusCode::kOk);
  EXPECT_EQ(CheckHeaders(auth, old_header), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(neither.load(), 0);
}

}  // namespace
}  // namespace flashsampler
