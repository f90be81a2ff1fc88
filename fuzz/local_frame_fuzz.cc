// libFuzzer target: the input as the byte stream a client sends to the local
// channel (fuzz/local_frame_fuzz_driver.h). Seeds: fuzz/corpus/local_frame/.
#include "fuzz/local_frame_fuzz_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flashsampler::fuzz::CheckLocalFrames(data, size);
  return 0;
}
