// Replays the safetensors fuzz target's seeds and crash inputs through its
// driver (SafetensorsFile::Open, GetTensor, LmHead::Load on each input).
#include "fuzz/safetensors_fuzz_driver.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/fuzz/replay_inputs.h"

namespace flashsampler::fuzz {
namespace {

using flashsampler::testing::ReadFuzzInputs;

const uint8_t* Bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

TEST(SafetensorsFuzzDriver, ReplaysCorpusAndRegressions) {
  const auto inputs = ReadFuzzInputs("safetensors");
  ASSERT_GE(inputs.size(), 5u) << "fuzz/corpus/safetensors lost its seeds";
  for (const auto& [path, bytes] : inputs) {
    SCOPED_TRACE(path);
    CheckSafetensorsBytes(Bytes(bytes), bytes.size());  // aborts on a contract violation
  }
}

TEST(SafetensorsFuzzDriver, ShortAndEmptyFilesAreHandled) {
  CheckSafetensorsBytes(nullptr, 0);
  const std::string seven = "\x02\x00\x00\x00\x00\x00\x00";
  CheckSafetensorsBytes(Bytes(seven), seven.size());
  const std::string empty_header("\x02\x00\x00\x00\x00\x00\x00\x00{}", 10);
  CheckSafetensorsBytes(Bytes(empty_header), empty_header.size());
}

}  // namespace
}  // namespace flashsampler::fuzz
