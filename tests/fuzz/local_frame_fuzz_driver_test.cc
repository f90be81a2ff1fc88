// Replays the local-frame fuzz target's seeds and crash inputs through its
// driver (fuzz/local_frame_fuzz_driver.h).
#include "fuzz/local_frame_fuzz_driver.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/fuzz/replay_inputs.h"

namespace flashsampler::fuzz {
namespace {

using flashsampler::testing::ReadFuzzInputs;

const uint8_t* Bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

TEST(LocalFrameFuzzDriver, ReplaysCorpusAndRegressions) {
  const auto inputs = ReadFuzzInputs("local_frame");
  ASSERT_GE(inputs.size(), 9u) << "fuzz/corpus/local_frame lost its seeds";
  for (const auto& [path, bytes] : inputs) {
    SCOPED_TRACE(path);
    CheckLocalFrames(Bytes(bytes), bytes.size());  // aborts on a contract violation
  }
}

TEST(LocalFrameFuzzDriver, EmptyAndGarbageInputsAreHandled) {
  CheckLocalFrames(nullptr, 0);
  const std::string ones(300, '\xff');
  CheckLocalFrames(Bytes(ones), ones.size());
  // Larger than a socket's buffer: the writer must not block the reader.
  std::string big(1 << 20, '\0');
  CheckLocalFrames(Bytes(big), big.size());
}

}  // namespace
}  // namespace flashsampler::fuzz
