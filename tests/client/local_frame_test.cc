#include "client/local_frame.h"

#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashsampler::local {
namespace {

using ::testing::HasSubstr;

// A connected pair of Unix-domain stream sockets, closed at the end.
struct SocketPair {
  SocketPair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd), 0); }
  ~SocketPair() {
    for (int f : fd) {
      if (f >= 0) close(f);
    }
  }
  void Close(int i) {
    close(fd[i]);
    fd[i] = -1;
  }
  int fd[2] = {-1, -1};
};

TEST(LocalFrame, HeaderLayoutIsLittleEndianAndRoundTrips) {
  FrameHeader h;
  h.kind = FrameKind::kStatus;
  h.call_id = 0x0102030405060708ull;
  h.arg = 0x0A0B0C0D;
  h.payload_bytes = 0x11;
  uint8_t bytes[kFrameHeaderBytes];
  EncodeFrameHeader(h, bytes);
  // "FSL1", kind 3, the id's low byte first, then arg and length.
  EXPECT_EQ(std::string(reinterpret_cast<char*>(bytes), 4), "FSL1");
  EXPECT_EQ(bytes[4], 3);
  EXPECT_EQ(bytes[8], 0x08);
  EXPECT_EQ(bytes[15], 0x01);
  EXPECT_EQ(bytes[16], 0x0D);
  EXPECT_EQ(bytes[20], 0x11);
  absl::StatusOr<FrameHeader> back = DecodeFrameHeader(bytes, 1 << 20);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, FrameKind::kStatus);
  EXPECT_EQ(back->call_id, h.call_id);
  EXPECT_EQ(back->arg, h.arg);
  EXPECT_EQ(back->payload_bytes, h.payload_bytes);
}

TEST(LocalFrame, BadHeadersAreRefusedWithTheirReason) {
  FrameHeader h;
  h.payload_bytes = 100;
  uint8_t bytes[kFrameHeaderBytes];
  EncodeFrameHeader(h, bytes);
  // Over the limit: the header is sound, the payload too large.
  absl::StatusOr<FrameHeader> large = DecodeFrameHeader(bytes, 99);
  EXPECT_EQ(large.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(large.status().message()), HasSubstr("100 bytes exceeds the limit of 99"));
  EXPECT_TRUE(DecodeFrameHeader(bytes, 100).ok());

  uint8_t bad_magic[kFrameHeaderBytes];
  EncodeFrameHeader(h, bad_magic);
  bad_magic[3] = '2';
  EXPECT_EQ(DecodeFrameHeader(bad_magic, 1000).status().code(), absl::StatusCode::kInvalidArgument);

  for (uint8_t kind : {0, 4, 255}) {
    uint8_t bad_kind[kFrameHeaderBytes];
    EncodeFrameHeader(h, bad_kind);
    bad_kind[4] = kind;
    absl::StatusOr<FrameHeader> decoded = DecodeFrameHeader(bad_kind, 1000);
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << int(kind);
    EXPECT_THAT(std::string(decoded.status().message()), HasSubstr("unknown local-channel frame kind"));
  }
}

TEST(LocalFrame, FramesCrossASocketWholeInOrder) {
  SocketPair pair;
  // 3 MiB: more than a Unix socket's buffer, so the writer's sends are
  // partial and the reader's reads piecewise while the other side works.
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + 3);
  std::thread writer([&] {
    FrameHeader h;
    h.call_id = 1;
    h.arg = 500;
    EXPECT_TRUE(WriteFrame(pair.fd[0], h, big).ok());
    h.kind = FrameKind::kStatus;
    h.call_id = 2;
    EXPECT_TRUE(WriteFrame(pair.fd[0], h, "").ok());  // an empty payload
    std::string appended;
    h.kind = FrameKind::kSampleResponse;
    h.call_id = 3;
    AppendFrame(h, "answer", &appended);
    size_t sent = 0;
    EXPECT_TRUE(SendBytes(pair.fd[0], appended, &sent, /*block=*/true).ok());
    EXPECT_EQ(sent, appended.size());
  });
  std::string payload;
  absl::StatusOr<FrameHeader> first = ReadFrame(pair.fd[1], 4 << 20, &payload);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->kind, FrameKind::kSampleRequest);
  EXPECT_EQ(first->arg, 500u);
  EXPECT_EQ(first->payload_bytes, big.size());
  EXPECT_TRUE(payload == big);
  absl::StatusOr<FrameHeader> second = ReadFrame(pair.fd[1], 4 << 20, &payload);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->call_id, 2u);
  EXPECT_TRUE(payload.empty());
  absl::StatusOr<FrameHeader> third = ReadFrame(pair.fd[1], 4 << 20, &payload);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->call_id, 3u);
  EXPECT_EQ(payload, "answer");
  writer.join();
  // The writer closes between frames: a clean end of stream.
  pair.Close(0);
  EXPECT_EQ(ReadFrame(pair.fd[1], 4 << 20, &payload).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(LocalFrame, AStreamThatEndsInsideAFrameIsUnavailable) {
  for (size_t cut : {size_t{5}, kFrameHeaderBytes + 3}) {
    SocketPair pair;
    std::string frame;
    FrameHeader h;
    AppendFrame(h, "0123456789", &frame);
    size_t sent = 0;
    ASSERT_TRUE(SendBytes(pair.fd[0], frame.substr(0, cut), &sent, true).ok());
    pair.Close(0);
    std::string payload;
    EXPECT_EQ(ReadFrame(pair.fd[1], 1 << 20, &payload).status().code(), absl::StatusCode::kUnavailable)
        << "cut at " << cut;
  }
}

// A header that announces 32 MiB followed by 10 bytes and the end: the reader
// never took memory for the 32 MiB that did not come.
TEST(LocalFrame, AnAnnouncedPayloadTakesMemoryOnlyAsItsBytesArrive) {
  SocketPair pair;
  FrameHeader h;
  h.payload_bytes = 32u << 20;
  uint8_t head[kFrameHeaderBytes];
  EncodeFrameHeader(h, head);
  const std::string sent_bytes = std::string(reinterpret_cast<const char*>(head), sizeof(head)) + "0123456789";
  size_t sent = 0;
  ASSERT_TRUE(SendBytes(pair.fd[0], sent_bytes, &sent, true).ok());
  pair.Close(0);
  std::string payload;
  EXPECT_EQ(ReadFrame(pair.fd[1], 64u << 20, &payload).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LE(payload.capacity(), size_t{1} << 20);
}

TEST(LocalFrame, ANonBlockingSendStopsWhereTheSocketIsFull) {
  SocketPair pair;
  const std::string data(8 << 20, 'x');  // far more than the socket buffers
  size_t sent = 0;
  ASSERT_TRUE(SendBytes(pair.fd[0], data, &sent, /*block=*/false).ok());
  EXPECT_GT(sent, 0u);
  EXPECT_LT(sent, data.size());
  // The rest follows once the reader drains the socket.
  std::thread reader([&] {
    std::string sink(data.size(), '\0');
    size_t got = 0;
    while (got < data.size()) {
      const ssize_t r = recv(pair.fd[1], sink.data() + got, data.size() - got, 0);
      ASSERT_GT(r, 0);
      got += static_cast<size_t>(r);
    }
    EXPECT_TRUE(sink == data);
  });
  EXPECT_TRUE(SendBytes(pair.fd[0], data, &sent, /*block=*/true).ok());
  EXPECT_EQ(sent, data.size());
  reader.join();
}

TEST(LocalFrame, PollingForDataConsumesNothingAndGivesUp) {
  SocketPair pair;
  // Nothing comes: the poll ends by itself, and the socket is still empty.
  PollForData(pair.fd[1], absl::Milliseconds(2));
  char byte;
  EXPECT_LT(recv(pair.fd[1], &byte, 1, MSG_DONTWAIT), 0);
  // A frame waits: the poll returns, and the frame reads whole.
  FrameHeader h;
  h.call_id = 9;
  ASSERT_TRUE(WriteFrame(pair.fd[0], h, "abc").ok());
  PollForData(pair.fd[1], absl::Hours(1));
  std::string payload;
  absl::StatusOr<FrameHeader> read = ReadFrame(pair.fd[1], 100, &payload);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->call_id, 9u);
  EXPECT_EQ(payload, "abc");
  // An end of stream ends the poll too.
  pair.Close(0);
  PollForData(pair.fd[1], absl::Hours(1));
  EXPECT_EQ(ReadFrame(pair.fd[1], 100, &payload).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(LocalFrame, WritingToAClosedPeerIsAnErrorNotASignal) {
  SocketPair pair;
  pair.Close(1);
  FrameHeader h;
  const absl::Status s = WriteFrame(pair.fd[0], h, "payload");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

}  // namespace
}  // namespace flashsampler::local
