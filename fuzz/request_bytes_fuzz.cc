// libFuzzer target: arbitrary bytes as a wire SampleRequest, then validation
// (fuzz/request_fuzz_driver.h). Seeds: fuzz/corpus/request_bytes/.
#include "fuzz/request_fuzz_driver.h"
#include "google/protobuf/stubs/logging.h"

// Protobuf logs every string field with invalid UTF-8 it rejects; at tens of
// thousands of inputs a second that is all the fuzzer would do.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flashsampler::fuzz::CheckRequestBytes(data, size);
  return 0;
}
