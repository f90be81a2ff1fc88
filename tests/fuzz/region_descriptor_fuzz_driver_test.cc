// Replays the region-descriptor fuzz target's seeds and crash inputs through
// its driver (fuzz/region_descriptor_fuzz_driver.h).
#include "fuzz/region_descriptor_fuzz_driver.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/fuzz/replay_inputs.h"

namespace flashsampler::fuzz {
namespace {

using flashsampler::testing::ReadFuzzInputs;

const uint8_t* Bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

TEST(RegionDescriptorFuzzDriver, ReplaysCorpusAndRegressions) {
  const auto inputs = ReadFuzzInputs("region_descriptor");
  ASSERT_GE(inputs.size(), 6u) << "fuzz/corpus/region_descriptor lost its seeds";
  for (const auto& [path, bytes] : inputs) {
    SCOPED_TRACE(path);
    CheckRegionDescriptors(Bytes(bytes), bytes.size());  // aborts on a contract violation
  }
}

TEST(RegionDescriptorFuzzDriver, EmptyAndGarbageInputsAreHandled) {
  CheckRegionDescriptors(nullptr, 0);
  const std::string ones(300, '\xff');
  CheckRegionDescriptors(Bytes(ones), ones.size());
  std::string counting;
  for (int i = 0; i < 4096; ++i) counting.push_back(static_cast<char>(i * 37 + i / 256));
  CheckRegionDescriptors(Bytes(counting), counting.size());
}

}  // namespace
}  // namespace flashsampler::fuzz
