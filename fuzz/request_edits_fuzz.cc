// libFuzzer target: the input as edits to a valid SampleRequest, then
// validation (fuzz/request_fuzz_driver.h). Seeds: fuzz/corpus/request_edits/.
#include "fuzz/request_fuzz_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flashsampler::fuzz::CheckRequestEdits(data, size);
  return 0;
}
