// Replays the sampling-params fuzz target's seeds and crash inputs through its
// driver (resolution of SamplingParams, launch planning, assembly and the CPU
// engine on each launch; fuzz/sampling_params_fuzz_driver.h).
#include "fuzz/sampling_params_fuzz_driver.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/fuzz/replay_inputs.h"

namespace flashsampler::fuzz {
namespace {

using flashsampler::testing::ReadFuzzInputs;

const uint8_t* Bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

TEST(SamplingParamsFuzzDriver, ReplaysCorpusAndRegressions) {
  const auto inputs = ReadFuzzInputs("sampling_params");
  ASSERT_GE(inputs.size(), 8u) << "fuzz/corpus/sampling_params lost its seeds";
  for (const auto& [path, bytes] : inputs) {
    SCOPED_TRACE(path);
    CheckSamplingParams(Bytes(bytes), bytes.size());  // aborts on a contract violation
  }
}

TEST(SamplingParamsFuzzDriver, EmptyAndGarbageInputsAreHandled) {
  CheckSamplingParams(nullptr, 0);
  const std::string ones(300, '\xff');
  CheckSamplingParams(Bytes(ones), ones.size());
  std::string counting;
  for (int i = 0; i < 1024; ++i) counting.push_back(static_cast<char>(i * 37));
  CheckSamplingParams(Bytes(counting), counting.size());
}

}  // namespace
}  // namespace flashsampler::fuzz
