// HttpGet: a minimal blocking HTTP/1.0 GET over a loopback TCP socket, for
// tests that scrape /metrics (no HTTP client dependency just for that).
//
// Thread safety: reentrant. Outcomes: the response body for status 200;
// Unavailable when the connection fails; Internal for any other status or a
// malformed response.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace flashsampler::testing {

// `host_port` is "HOST:PORT" with a numeric IPv4 host, `path` starts with '/'.
absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path);

}  // namespace flashsampler::testing
