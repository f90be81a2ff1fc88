// libFuzzer target: the input as a program of region registrations,
// resolutions, region-backed requests, unregistrations and listings
// (fuzz/region_descriptor_fuzz_driver.h). Seeds: fuzz/corpus/region_descriptor/.
#include "fuzz/region_descriptor_fuzz_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flashsampler::fuzz::CheckRegionDescriptors(data, size);
  return 0;
}
