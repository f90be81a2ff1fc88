// libFuzzer target: arbitrary bytes as a .safetensors file, opened and loaded
// as an LM head (fuzz/safetensors_fuzz_driver.h). Seeds: fuzz/corpus/safetensors/.
#include "fuzz/safetensors_fuzz_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flashsampler::fuzz::CheckSafetensorsBytes(data, size);
  return 0;
}
