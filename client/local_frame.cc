#include "client/local_frame.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace flashsampler::local {
namespace {

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

absl::Status SocketError(absl::string_view what, int err) {
  return absl::UnavailableError(absl::StrCat("local channel ", what, ": ", std::strerror(err)));
}

// ReadFrame's first piece of a payload; later pieces double what has come.
constexpr size_t kFirstPayloadPiece = 64 << 10;

// Reads exactly `n` bytes. `*got` counts what arrived before an end of
// stream or an error; `*eof` says the stream ended.
absl::Status ReadFull(int fd, uint8_t* data, size_t n, size_t* got, bool* eof) {
  *got = 0;
  *eof = false;
  while (*got < n) {
    const ssize_t r = recv(fd, data + *got, n - *got, 0);
    if (r > 0) {
      *got += static_cast<size_t>(r);
    } else if (r == 0) {
      *eof = true;
      return absl::UnavailableError("local channel closed by the peer inside a frame");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      // A blocking socket says this when its receive timeout (SO_RCVTIMEO) ran out.
      return absl::DeadlineExceededError("local channel: no data within the receive timeout");
    } else if (errno != EINTR) {
      return SocketError("read", errno);
    }
  }
  return absl::OkStatus();
}

}  // namespace

void EncodeFrameHeader(const FrameHeader& header, uint8_t out[kFrameHeaderBytes]) {
  PutU32(out, kFrameMagic);
  PutU32(out + 4, static_cast<uint32_t>(header.kind));
  PutU64(out + 8, header.call_id);
  PutU32(out + 16, header.arg);
  PutU32(out + 20, header.payload_bytes);
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(const uint8_t in[kFrameHeaderBytes],
                                              uint32_t max_payload_bytes) {
  if (GetU32(in) != kFrameMagic) {
    return absl::InvalidArgumentError("not a FlashSampler local-channel frame (bad magic)");
  }
  const uint32_t kind = GetU32(in + 4);
  if (kind < static_cast<uint32_t>(FrameKind::kSampleRequest) ||
      kind > static_cast<uint32_t>(FrameKind::kStatus)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown local-channel frame kind ", kind));
  }
  FrameHeader header;
  header.kind = static_cast<FrameKind>(kind);
  header.call_id = GetU64(in + 8);
  header.arg = GetU32(in + 16);
  header.payload_bytes = GetU32(in + 20);
  if (header.payload_bytes > max_payload_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("local-channel frame of ", header.payload_bytes,
                                                     " bytes exceeds the limit of ",
                                                     max_payload_bytes));
  }
  return header;
}

absl::Status WriteFrame(int fd, FrameHeader header, absl::string_view payload) {
  if (payload.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError("local-channel payload exceeds 4 GiB - 1 bytes");
  }
  header.payload_bytes = static_cast<uint32_t>(payload.size());
  uint8_t head[kFrameHeaderBytes];
  EncodeFrameHeader(header, head);
  iovec parts[2] = {{head, sizeof(head)},
                    {const_cast<char*>(payload.data()), payload.size()}};
  msghdr message{};
  message.msg_iov = parts;
  message.msg_iovlen = payload.empty() ? 1 : 2;
  size_t left = sizeof(head) + payload.size();
  while (left > 0) {
    // MSG_NOSIGNAL: a vanished peer is an error here, not SIGPIPE.
    const ssize_t w = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return SocketError("write", errno);
    }
    left -= static_cast<size_t>(w);
    // Skip what was written: drop whole parts, then advance into the next.
    size_t done = static_cast<size_t>(w);
    while (done > 0 && message.msg_iovlen > 0) {
      if (done >= message.msg_iov->iov_len) {
        done -= message.msg_iov->iov_len;
        ++message.msg_iov;
        --message.msg_iovlen;
      } else {
        message.msg_iov->iov_base = static_cast<char*>(message.msg_iov->iov_base) + done;
        message.msg_iov->iov_len -= done;
        done = 0;
      }
    }
  }
  return absl::OkStatus();
}

void AppendFrame(FrameHeader header, absl::string_view payload, std::string* out) {
  header.payload_bytes = static_cast<uint32_t>(payload.size());
  uint8_t head[kFrameHeaderBytes];
  EncodeFrameHeader(header, head);
  out->append(reinterpret_cast<const char*>(head), sizeof(head));
  out->append(payload.data(), payload.size());
}

absl::Status SendBytes(int fd, absl::string_view data, size_t* sent, bool block) {
  while (*sent < data.size()) {
    const ssize_t w = send(fd, data.data() + *sent, data.size() - *sent,
                           MSG_NOSIGNAL | (block ? 0 : MSG_DONTWAIT));
    if (w >= 0) {
      *sent += static_cast<size_t>(w);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      // Blocking sockets say this only when a send timeout (SO_SNDTIMEO) ran out.
      if (!block) return absl::OkStatus();
      return SocketError("write", errno);
    } else if (errno != EINTR) {
      return SocketError("write", errno);
    }
  }
  return absl::OkStatus();
}

void PollForData(int fd, absl::Duration spin) {
  if (spin <= absl::ZeroDuration()) return;
  const absl::Time end = absl::Now() + spin;
  char byte;
  do {
    const ssize_t r = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
  } while (absl::Now() < end);
}

absl::StatusOr<FrameHeader> ReadFrame(int fd, uint32_t max_payload_bytes, std::string* payload) {
  uint8_t head[kFrameHeaderBytes];
  size_t got = 0;
  bool eof = false;
  if (absl::Status s = ReadFull(fd, head, sizeof(head), &got, &eof); !s.ok()) {
    if (eof && got == 0) return absl::OutOfRangeError("local channel closed by the peer");
    return s;
  }
  absl::StatusOr<FrameHeader> header = DecodeFrameHeader(head, max_payload_bytes);
  if (!header.ok()) return header.status();
  // The payload grows as its bytes arrive, at most doubling what has come:
  // a header that announces a large frame commits memory only for bytes
  // actually sent (a peer that sends the header and stalls holds 64 KiB).
  const size_t total = header->payload_bytes;
  payload->clear();
  for (size_t received = 0; received < total;) {
    const size_t target = std::min(total, std::max(kFirstPayloadPiece, 2 * received));
    payload->resize(target);
    if (absl::Status s = ReadFull(fd, reinterpret_cast<uint8_t*>(payload->data()) + received,
                                  target - received, &got, &eof);
        !s.ok()) {
      return s;
    }
    received = target;
  }
  return header;
}

}  // namespace flashsampler::local
