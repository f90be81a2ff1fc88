// Local channel frames: the wire format of flashsampler-server's same-host
// request path (--local_socket, server/local/local_channel_server.h), shared
// by the server and the clients. No gRPC and no protobuf here: a frame's
// payload is a serialized message the caller parses.
//
// Why a second wire: an engine on the same host that passes its tensors
// through registered memory regions sends a request of a few hundred bytes,
// and a gRPC round trip for it costs ~0.12 ms on the 16-core GPU machines
// (BENCHMARKS.md, "A decode step through the service"), more than the 0.08 ms
// the whole service may add to the kernel. A Unix-domain stream socket with
// a fixed header carries the same SampleRequest / SampleResponse messages
// without HTTP/2's framing, flow control and thread hand-offs.
//
// A frame is a 24-byte header, then `payload_bytes` bytes. The header, all
// little-endian:
//   bytes  0- 3  magic 0x314C5346 ("FSL1": FlashSampler local, version 1)
//   bytes  4- 7  kind: 1 SampleRequest, 2 SampleResponse, 3 Status
//   bytes  8-15  call id: chosen by the client, echoed in the answer
//   bytes 16-19  arg: SampleRequest: the deadline, microseconds from receipt
//                (0: none); Status: the status code (gRPC's = absl's
//                numbering); SampleResponse: 0
//   bytes 20-23  payload_bytes
// Payloads: SampleRequest and SampleResponse are the serialized
// flashsampler.v1 messages; Status is the error message in UTF-8.
//
// Thread safety: the functions hold no state. Two threads must not write
// frames to one descriptor at once (frames would interleave), nor read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace flashsampler::local {

inline constexpr uint32_t kFrameMagic = 0x314C5346;  // "FSL1" read as little-endian bytes
inline constexpr size_t kFrameHeaderBytes = 24;

enum class FrameKind : uint32_t { kSampleRequest = 1, kSampleResponse = 2, kStatus = 3 };

struct FrameHeader {
  FrameKind kind = FrameKind::kSampleRequest;
  uint64_t call_id = 0;
  uint32_t arg = 0;
  uint32_t payload_bytes = 0;
};

void EncodeFrameHeader(const FrameHeader& header, uint8_t out[kFrameHeaderBytes]);

// InvalidArgument for a wrong magic or an unknown kind (the byte stream
// cannot be trusted past it); ResourceExhausted when payload_bytes exceeds
// `max_payload_bytes` (the header itself is sound).
absl::StatusOr<FrameHeader> DecodeFrameHeader(const uint8_t in[kFrameHeaderBytes],
                                              uint32_t max_payload_bytes);

// Writes the header and `payload` (header.payload_bytes is set from it;
// InvalidArgument above 4 GiB - 1), retrying on EINTR and partial writes,
// without SIGPIPE. Unavailable when the peer is gone or the socket fails.
absl::Status WriteFrame(int fd, FrameHeader header, absl::string_view payload);

// Appends the frame (header, with payload_bytes set, then `payload`) to
// `*out`: for a writer that must not block (SendBytes with block = false).
void AppendFrame(FrameHeader header, absl::string_view payload, std::string* out);

// Sends `data` from `*sent` on, advancing `*sent`. With `block` false it
// returns OK as soon as the socket would block (the caller finishes later);
// with `block` true, once everything is sent. Unavailable when the peer is
// gone or the socket fails. Never raises SIGPIPE.
absl::Status SendBytes(int fd, absl::string_view data, size_t* sent, bool block);

// Busy-polls `fd` (non-blocking peeks, no system call that sleeps) until
// data or an end of stream is there, an error, or `spin` has passed.
// A thread about to block on the socket calls it to skip the wake-up: a
// sleeping thread costs tens of microseconds to wake on the GPU machines (a
// VM), more than a short request's whole service time. It burns its core
// while it polls.
void PollForData(int fd, absl::Duration spin);

// Reads one frame into `*payload` (resized to its length; memory is taken
// as the payload's bytes arrive, not when the header announces them). OutOfRange when
// the peer closed the connection cleanly before a frame began; Unavailable
// on an error or a connection closed inside a frame; DeadlineExceeded when
// the socket's receive timeout (SO_RCVTIMEO) ran out; DecodeFrameHeader's
// errors for a bad header (then nothing of the payload was read).
absl::StatusOr<FrameHeader> ReadFrame(int fd, uint32_t max_payload_bytes, std::string* payload);

}  // namespace flashsampler::local
