#include "client/channel_security.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/scoped_temp_dir.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;
using testing::ScopedTempDir;

TEST(LoadChannelSecurity, DefaultsToPlaintextWithoutToken) {
  absl::StatusOr<ChannelSecurity> s = LoadChannelSecurity({});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NE(s->credentials, nullptr);
  EXPECT_TRUE(s->authorization.empty());
}

TEST(LoadChannelSecurity, ReadsTheTokenIntoTheAuthorizationValue) {
  ScopedTempDir dir("channel_security");
  std::ofstream(dir.Path("token")) << "abc\n";
  absl::StatusOr<ChannelSecurity> s = LoadChannelSecurity({.auth_token_file = dir.Path("token")});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->authorization, "Bearer abc");
}

TEST(LoadChannelSecurity, RejectsInconsistentOrMissingFilesNamingTheFlag) {
  auto message = [](const ChannelSecurityOptions& o) {
    absl::StatusOr<ChannelSecurity> s = LoadChannelSecurity(o);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.status().message());
  };
  EXPECT_THAT(message({.tls_cert = "/c.pem"}), HasSubstr("--tls_cert and --tls_key"));
  EXPECT_THAT(message({.tls_key = "/c.key"}), HasSubstr("--tls_cert and --tls_key"));
  EXPECT_THAT(message({.tls_server_name = "localhost"}), HasSubstr("--tls_server_name needs TLS"));
  EXPECT_THAT(message({.tls_ca = "/nonexistent/ca.pem"}), HasSubstr("--tls_ca"));
  EXPECT_THAT(message({.tls_ca = "", .tls_cert = "/nonexistent/c.pem", .tls_key = "/nonexistent/c.key"}),
              HasSubstr("--tls_cert"));
  EXPECT_THAT(message({.auth_token_file = "/nonexistent/token"}), HasSubstr("--auth_token_file"));
}

}  // namespace
}  // namespace flashsampler
