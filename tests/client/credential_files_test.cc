#include "client/credential_files.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/scoped_temp_dir.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;
using testing::ScopedTempDir;

TEST(ReadCredentialFile, ReturnsTheBytesOrNamesTheFlag) {
  ScopedTempDir dir("credential_files");
  std::ofstream(dir.Path("ca.pem")) << "-----BEGIN CERTIFICATE-----\nabc\n";
  absl::StatusOr<std::string> pem = ReadCredentialFile(dir.Path("ca.pem"), "tls_ca");
  ASSERT_TRUE(pem.ok()) << pem.status();
  EXPECT_EQ(*pem, "-----BEGIN CERTIFICATE-----\nabc\n");

  absl::StatusOr<std::string> missing = ReadCredentialFile(dir.Path("nope.pem"), "tls_ca");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("--tls_ca: cannot read"));
  std::ofstream(dir.Path("empty.pem")) << "";
  absl::StatusOr<std::string> empty = ReadCredentialFile(dir.Path("empty.pem"), "tls_key");
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("--tls_key"));
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("empty"));
  // A directory is not a credential file.
  EXPECT_FALSE(ReadCredentialFile(dir.path(), "tls_ca").ok());
}

TEST(ReadBearerToken, TrimsWhitespaceAndRejectsWhatAHeaderCannotCarry) {
  ScopedTempDir dir("bearer_token");
  std::ofstream(dir.Path("t1")) << "\t token-value_1.2~+/= \r\n";
  absl::StatusOr<std::string> token = ReadBearerToken(dir.Path("t1"), "auth_token_file");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "token-value_1.2~+/=");
  EXPECT_EQ(BearerAuthorization(*token), "Bearer token-value_1.2~+/=");

  std::ofstream(dir.Path("spaces")) << "two words\n";
  std::ofstream(dir.Path("blank")) << " \n \n";
  std::ofstream(dir.Path("control")) << "abc\x01" "def";
  for (const char* name : {"spaces", "blank", "control", "missing"}) {
    absl::StatusOr<std::string> bad = ReadBearerToken(dir.Path(name), "auth_token_file");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--auth_token_file")) << name;
    EXPECT_THAT(std::string(bad.status().message()), ::testing::Not(HasSubstr("words"))) << name;
  }
}

}  // namespace
}  // namespace flashsampler
