// Fuzz driver for the local channel's frames (client/local_frame.h): the
// input is the byte stream a client sends to flashsampler-server's
// --local_socket. Shared by the libFuzzer target (fuzz/local_frame_fuzz.cc)
// and the replay test (tests/fuzz/local_frame_fuzz_driver_test.cc).
//
// The bytes go through a real socket pair (so ReadFrame's piecewise reads run)
// and are read frame by frame, as the server's connection thread reads them,
// with a payload limit of kLocalFrameLimit bytes; each SampleRequest payload
// is parsed as the server parses it (ParseFromString, then
// ParseSampleRequest against a small model).
//
// Checks (FUZZ_CHECK aborts; memory errors are left to ASan/UBSan):
//  - a frame read is exactly the header at the stream's position followed by
//    payload_bytes <= kLocalFrameLimit bytes of it, its kind one of the three,
//    and encoding its header again gives the same 24 bytes;
//  - a frame that cannot be read ends the stream with the documented status:
//    InvalidArgument for a bad magic or kind, ResourceExhausted for a payload
//    over the limit (both decided by the header alone), Unavailable for a
//    stream that ends inside a frame, OutOfRange only where a frame would
//    begin at the stream's end;
//  - the frames and the error account for the stream's bytes: nothing is
//    skipped, nothing read twice.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashsampler::fuzz {

inline constexpr uint32_t kLocalFrameLimit = 1 << 16;

void CheckLocalFrames(const uint8_t* data, size_t size);

}  // namespace flashsampler::fuzz
