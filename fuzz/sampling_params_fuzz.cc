// libFuzzer target: the input as a program of requests with arbitrary
// sampling params, resolved, planned into launches and run on the CPU engine
// (fuzz/sampling_params_fuzz_driver.h). Seeds: fuzz/corpus/sampling_params/.
#include "fuzz/sampling_params_fuzz_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flashsampler::fuzz::CheckSamplingParams(data, size);
  return 0;
}
