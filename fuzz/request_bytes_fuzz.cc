// libFuzzer target: arbitrary bytes as a wire SampleRequest, then validation
// (fuzz/request_fuzz_driver.h). Seeds: fuzz/corpus/request_bytes/.
#include "fuzz/request_fuzz_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flashsampler::fuzz::CheckRequestBytes(data, size);
  return 0;
}
