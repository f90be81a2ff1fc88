#include "server/security/bearer_token_auth.h"

#include <string>
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

}  // namespace
}  // namespace flashsampler
