// RawConnection: a plain TCP connection to a server's gRPC port, for tests
// that send what no gRPC client would (random bytes, truncated HTTP/2). Has
// helpers to write HTTP/2 frames by hand: the client preface, SETTINGS, a
// HEADERS frame opening a gRPC call (HPACK literals, no compression), DATA.
//
// Outcomes: Connect returns false when the connection fails; Send returns
// false once the peer has closed; DrainUntilClosed reads until the peer closes
// or `timeout` passes and says which. Not thread-safe; one thread per object.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace flashsampler::testing {

class RawConnection {
 public:
  RawConnection() = default;
  ~RawConnection();  // closes the socket (an abrupt disconnect if mid-call)
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  // `address` is HOST:PORT with a numeric IPv4 host, as ServerProcess reports.
  bool Connect(const std::string& address);
  bool Send(const std::string& bytes);
  // True when the peer closed the connection (EOF or reset) within `timeout`.
  bool DrainUntilClosed(absl::Duration timeout);
  void Close();

 private:
  int fd_ = -1;
};

// HTTP/2 framing (RFC 9113), just enough to open gRPC calls.
std::string Http2ClientPreface();  // the connection preface + an empty SETTINGS frame
std::string Http2Frame(uint8_t type, uint8_t flags, uint32_t stream_id, const std::string& payload);
// HEADERS (END_HEADERS) opening a unary or streaming gRPC call to `path`,
// e.g. "/flashsampler.v1.Sampler/Sample".
std::string GrpcCallHeaders(uint32_t stream_id, const std::string& path);
// The 5-byte gRPC message prefix: uncompressed, big-endian `length`.
std::string GrpcMessagePrefix(uint32_t length);

inline constexpr uint8_t kHttp2Data = 0x0;
inline constexpr uint8_t kHttp2Headers = 0x1;
inline constexpr uint8_t kHttp2RstStream = 0x3;
inline constexpr uint8_t kHttp2Settings = 0x4;
inline constexpr uint8_t kHttp2FlagEndStream = 0x1;
inline constexpr uint8_t kHttp2FlagEndHeaders = 0x4;

}  // namespace flashsampler::testing
