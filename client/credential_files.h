// Credential files: reading the PEM and bearer-token files that the server and
// the clients (flashsampler-cli, flashsampler-load) are pointed at by flags.
//
// Every error is InvalidArgument and names the flag the path came from, so
// that a start-up failure tells the operator which flag to fix. Contents are
// never put into error messages (they may be secrets). Stateless; any thread.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace flashsampler {

// The whole file. Empty, missing or unreadable files are InvalidArgument.
absl::StatusOr<std::string> ReadCredentialFile(const std::string& path, const std::string& flag);

// A bearer token: the file's content with leading and trailing whitespace
// removed. It must be non-empty and printable ASCII without spaces (what an
// HTTP/2 header value and RFC 6750's token68 allow), else InvalidArgument.
absl::StatusOr<std::string> ReadBearerToken(const std::string& path, const std::string& flag);

// The `authorization` metadata value that carries `token`.
std::string BearerAuthorization(const std::string& token);

}  // namespace flashsampler
