#include "server/security/security_config.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/scoped_temp_dir.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;
using testing::ScopedTempDir;

void ExpectInvalid(const SecurityOptions& options, const std::string& message) {
  absl::StatusOr<SecurityConfig> config = LoadSecurityConfig(options);
  ASSERT_FALSE(config.ok()) << message;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(message));
}

TEST(SecurityConfig, NothingSetIsPlaintextWithoutToken) {
  absl::StatusOr<SecurityConfig> config = LoadSecurityConfig({});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->tls);
  EXPECT_FALSE(config->mtls);
  EXPECT_FALSE(config->auth_token.has_value());
  EXPECT_NE(config->credentials, nullptr);
  EXPECT_EQ(config->Describe(), "plaintext");
}

TEST(SecurityConfig, FlagCombinationsAreChecked) {
  ExpectInvalid({.tls_cert = "/x.pem"}, "--tls_cert and --tls_key must be given together");
  ExpectInvalid({.tls_key = "/x.key"}, "--tls_cert and --tls_key must be given together");
  ExpectInvalid({.tls_client_ca = "/ca.pem"}, "--tls_client_ca needs --tls_cert and --tls_key");
  ExpectInvalid({.tls_cert = "/nonexistent/s.pem", .tls_key = "/nonexistent/s.key"},
                "--tls_cert: cannot read '/nonexistent/s.pem'");
  ExpectInvalid({.auth_token_file = "/nonexistent/token"}, "--auth_token_file");
}

TEST(SecurityConfig, TokenIsTrimmedAndDescribedWithoutItsValue) {
  ScopedTempDir dir("security_config");
  std::ofstream(dir.Path("token")) << "\n  abc.DEF-123  \n";
  absl::StatusOr<SecurityConfig> config =
      LoadSecurityConfig({.auth_token_file = dir.Path("token"), .health_address = "0.0.0.0:8081"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->auth_token, "abc.DEF-123");
  EXPECT_EQ(config->Describe(), "plaintext, bearer token, plaintext health on 0.0.0.0:8081");
  std::ofstream(dir.Path("blank")) << " \n\t\n";
  ExpectInvalid({.auth_token_file = dir.Path("blank")}, "only whitespace");
}

class SecurityConfigWithCertificates : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string command =
        absl::StrCat("bash ", FLASHSAMPLER_MAKE_TEST_CERTS, " ", dir_.path());
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  std::string File(const std::string& name) const { return dir_.Path(name); }
  ScopedTempDir dir_{"security_config_pki"};
};

TEST_F(SecurityConfigWithCertificates, ValidFilesGiveTlsAndMutualTls) {
  absl::StatusOr<SecurityConfig> tls =
      LoadSecurityConfig({.tls_cert = File("server.pem"), .tls_key = File("server.key")});
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(tls->tls);
  EXPECT_FALSE(tls->mtls);
  EXPECT_EQ(tls->Describe(), "TLS");
  absl::StatusOr<SecurityConfig> mtls = LoadSecurityConfig(
      {.tls_cert = File("server.pem"), .tls_key = File("server.key"), .tls_client_ca = File("ca.pem")});
  ASSERT_TRUE(mtls.ok()) << mtls.status();
  EXPECT_TRUE(mtls->mtls);
  EXPECT_EQ(mtls->Describe(), "mTLS");
}

TEST_F(SecurityConfigWithCertificates, MistakesNameTheFlag) {
  ExpectInvalid({.tls_cert = File("client.pem"), .tls_key = File("server.key")},
                "--tls_key does not match the certificate in --tls_cert");
  ExpectInvalid({.tls_cert = File("server.key"), .tls_key = File("server.key")},
                "--tls_cert: no PEM certificate");
  ExpectInvalid({.tls_cert = File("server.pem"), .tls_key = File("server.pem")},
                "--tls_key: no unencrypted PEM private key");
  ExpectInvalid({.tls_cert = File("server.pem"), .tls_key = File("server.key"),
                 .tls_client_ca = File("ca.key")},
                "--tls_client_ca: no PEM certificate");
}

}  // namespace
}  // namespace flashsampler
