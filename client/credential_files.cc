#include "client/credential_files.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace flashsampler {

absl::StatusOr<std::string> ReadCredentialFile(const std::string& path, const std::string& flag) {
  std::error_code error;
  // libstdc++ throws when a directory is read through a stream.
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", path, "' is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": cannot read '", path, "'"));
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": error reading '", path, "'"));
  if (content.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", path, "' is empty"));
  return content;
}

absl::StatusOr<std::string> ReadBearerToken(const std::string& path, const std::string& flag) {
  absl::StatusOr<std::string> content = ReadCredentialFile(path, flag);
  if (!content.ok()) return content.status();
  std::string token(absl::StripAsciiWhitespace(*content));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", path, "' holds only whitespace"));
  }
  for (const char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, ": the token in '", path, "' must be printable ASCII without spaces"));
    }
  }
  return token;
}

std::string BearerAuthorization(const std::string& token) { return absl::StrCat("Bearer ", token); }

}  // namespace flashsampler
