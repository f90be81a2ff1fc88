#include "tests/e2e/raw_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "absl/time/clock.h"

namespace flashsampler::testing {

RawConnection::~RawConnection() { Close(); }

bool RawConnection::Connect(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr) != 1) return false;
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return false;
  return ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
}

bool RawConnection::Send(const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool RawConnection::DrainUntilClosed(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  char buf[4096];
  while (absl::Now() < deadline) {
    pollfd p{fd_, POLLIN, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    const int r = ::poll(&p, 1, ms > 0 ? ms : 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0 && errno != EINTR && errno != EAGAIN) return true;  // reset
  }
  return false;
}

void RawConnection::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string Http2ClientPreface() {
  return std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + Http2Frame(kHttp2Settings, 0, 0, "");
}

std::string Http2Frame(uint8_t type, uint8_t flags, uint32_t stream_id, const std::string& payload) {
  const uint32_t len = static_cast<uint32_t>(payload.size());
  std::string f;
  f.push_back(static_cast<char>((len >> 16) & 0xff));
  f.push_back(static_cast<char>((len >> 8) & 0xff));
  f.push_back(static_cast<char>(len & 0xff));
  f.push_back(static_cast<char>(type));
  f.push_back(static_cast<char>(flags));
  for (int shift = 24; shift >= 0; shift -= 8) {
    f.push_back(static_cast<char>((stream_id >> shift) & (shift == 24 ? 0x7f : 0xff)));
  }
  return f + payload;
}

namespace {

// HPACK "literal header field without indexing, new name" (RFC 7541 6.2.2)
// with raw (non-Huffman) strings shorter than 127 bytes.
std::string HpackLiteral(const std::string& name, const std::string& value) {
  std::string out(1, '\0');
  out.push_back(static_cast<char>(name.size()));
  out += name;
  out.push_back(static_cast<char>(value.size()));
  out += value;
  return out;
}

}  // namespace

std::string GrpcCallHeaders(uint32_t stream_id, const std::string& path) {
  const std::string block = HpackLiteral(":method", "POST") + HpackLiteral(":scheme", "http") +
                            HpackLiteral(":path", path) + HpackLiteral(":authority", "localhost") +
                            HpackLiteral("content-type", "application/grpc") +
                            HpackLiteral("te", "trailers");
  return Http2Frame(kHttp2Headers, kHttp2FlagEndHeaders, stream_id, block);
}

std::string GrpcMessagePrefix(uint32_t length) {
  std::string p(1, '\0');
  for (int shift = 24; shift >= 0; shift -= 8) p.push_back(static_cast<char>((length >> shift) & 0xff));
  return p;
}

}  // namespace flashsampler::testing
