#include "fuzz/local_frame_fuzz_driver.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "client/local_frame.h"
#include "flashsampler/v1/sampler.pb.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/request_fuzz_driver.h"
#include "server/api/request_parser.h"

namespace flashsampler::fuzz {
namespace {

void ParseLikeTheServer(const std::string& payload) {
  v1::SampleRequest request;
  if (!request.ParseFromString(payload)) return;
  // The request fuzz driver's model, so its valid requests are valid here.
  ModelShape shape;
  shape.vocab_size = kFuzzVocabSize;
  shape.valid_vocab = kFuzzVocabSize;
  shape.hidden_size = kFuzzHiddenSize;
  shape.weight_dtype = WeightDType::kBFloat16;
  absl::StatusOr<ParsedSampleRequest> parsed =
      ParseSampleRequest(request, shape, RequestLimits{kFuzzMaxBatchRows}, [] { return uint64_t{1}; });
  if (parsed.ok()) {
    FUZZ_CHECK(parsed->batch.rows >= 1 && parsed->batch.rows <= kFuzzMaxBatchRows, "rows outside the limit");
  }
}

}  // namespace

void CheckLocalFrames(const uint8_t* data, size_t size) {
  int fds[2];
  FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, "socketpair");
  // The client's side writes the whole stream, then closes; a thread, so a
  // stream larger than the socket's buffer cannot block the reader.
  std::thread writer([&] {
    size_t sent = 0;
    (void)local::SendBytes(fds[0], absl::string_view(reinterpret_cast<const char*>(data), size), &sent,
                           /*block=*/true);
    close(fds[0]);
  });
  size_t at = 0;  // bytes of the stream accounted for
  std::string payload;
  while (true) {
    absl::StatusOr<local::FrameHeader> header = local::ReadFrame(fds[1], kLocalFrameLimit, &payload);
    if (!header.ok()) {
      const absl::StatusCode code = header.status().code();
      const size_t left = size - at;
      if (code == absl::StatusCode::kOutOfRange) {
        FUZZ_CHECK(left == 0, "a clean end with bytes left");
      } else if (code == absl::StatusCode::kUnavailable) {
        // Cut inside a frame: a partial header, or a sound header whose payload is short.
        bool short_payload = false;
        if (left >= local::kFrameHeaderBytes) {
          absl::StatusOr<local::FrameHeader> h = local::DecodeFrameHeader(data + at, kLocalFrameLimit);
          short_payload = h.ok() && left - local::kFrameHeaderBytes < h->payload_bytes;
        }
        FUZZ_CHECK(left > 0 && (left < local::kFrameHeaderBytes || short_payload), "Unavailable without a cut");
      } else {
        FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kResourceExhausted,
                   "an undocumented status for a bad frame");
        FUZZ_CHECK(left >= local::kFrameHeaderBytes, "a header refused before it was whole");
        const absl::StatusOr<local::FrameHeader> h = local::DecodeFrameHeader(data + at, kLocalFrameLimit);
        FUZZ_CHECK(!h.ok() && h.status().code() == code, "ReadFrame and DecodeFrameHeader disagree");
      }
      break;
    }
    FUZZ_CHECK(size - at >= local::kFrameHeaderBytes + payload.size(), "a frame longer than the stream");
    FUZZ_CHECK(header->payload_bytes == payload.size() && payload.size() <= kLocalFrameLimit,
               "the payload is not the header's length");
    const uint32_t kind = static_cast<uint32_t>(header->kind);
    FUZZ_CHECK(kind >= 1 && kind <= 3, "an unknown kind was read");
    uint8_t again[local::kFrameHeaderBytes];
    local::EncodeFrameHeader(*header, again);
    FUZZ_CHECK(std::memcmp(again, data + at, sizeof(again)) == 0, "the header does not round-trip");
    FUZZ_CHECK(payload.empty() ||
                   std::memcmp(payload.data(), data + at + local::kFrameHeaderBytes, payload.size()) == 0,
               "the payload is not the stream's bytes");
    at += local::kFrameHeaderBytes + payload.size();
    if (header->kind == local::FrameKind::kSampleRequest) ParseLikeTheServer(payload);
  }
  // Unblock a writer whose stream the reader stopped reading (a bad frame).
  shutdown(fds[1], SHUT_RDWR);
  writer.join();
  close(fds[1]);
}

}  // namespace flashsampler::fuzz
