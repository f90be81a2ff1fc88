// Replays the request fuzz targets' seeds and crash inputs through their
// drivers, and checks the drivers themselves see what they must.
#include "fuzz/request_fuzz_driver.h"

#include <string>

#include "fuzz/fuzz_check.h"
#include "gtest/gtest.h"
#include "server/api/verify_request.h"
#include "tests/fuzz/replay_inputs.h"

namespace flashsampler::fuzz {
namespace {

using flashsampler::testing::ReadFuzzInputs;

const uint8_t* Bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

TEST(RequestFuzzDriver, ReplaysRequestBytesCorpusAndRegressions) {
  const auto inputs = ReadFuzzInputs("request_bytes");
  ASSERT_GE(inputs.size(), 5u) << "fuzz/corpus/request_bytes lost its seeds";
  for (const auto& [path, bytes] : inputs) {
    SCOPED_TRACE(path);
    CheckRequestBytes(Bytes(bytes), bytes.size());  // aborts on a contract violation
  }
}

TEST(RequestFuzzDriver, ReplaysRequestEditsCorpusAndRegressions) {
  const auto inputs = ReadFuzzInputs("request_edits");
  ASSERT_GE(inputs.size(), 5u) << "fuzz/corpus/request_edits lost its seeds";
  for (const auto& [path, bytes] : inputs) {
    SCOPED_TRACE(path);
    CheckRequestEdits(Bytes(bytes), bytes.size());
  }
}

TEST(RequestFuzzDriver, EmptyAndGarbageInputsAreHandled) {
  CheckRequestBytes(nullptr, 0);
  CheckRequestEdits(nullptr, 0);
  const std::string garbage = "\xff\xff\xff\xff\x0f\x12\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01";
  CheckRequestBytes(Bytes(garbage), garbage.size());
  CheckRequestEdits(Bytes(garbage), garbage.size());
}

TEST(RequestFuzzDriver, ValidFuzzRequestHasTheFuzzModelShape) {
  for (v1::DType dtype : {v1::DTYPE_FP32, v1::DTYPE_FP16, v1::DTYPE_BF16}) {
    const v1::SampleRequest r = ValidFuzzRequest(3, dtype, 5);
    ASSERT_EQ(r.hidden_states().shape_size(), 2);
    EXPECT_EQ(r.hidden_states().shape(0), 3);
    EXPECT_EQ(r.hidden_states().shape(1), kFuzzHiddenSize);
    EXPECT_EQ(static_cast<int64_t>(r.hidden_states().data().size()),
              3 * kFuzzHiddenSize * (dtype == v1::DTYPE_FP32 ? 4 : 2));
    EXPECT_EQ(r.params_size(), 1);
  }
}

// The Verify seed is a request the parser accepts, so the fuzzer starts next
// to ParseVerifyRequest's checks rather than at its first rejection.
TEST(RequestFuzzDriver, ValidFuzzVerifyRequestIsAccepted) {
  const v1::VerifyRequest r = ValidFuzzVerifyRequest({0, 2, 5}, 3);
  ModelShape shape;
  shape.vocab_size = shape.valid_vocab = kFuzzVocabSize;
  shape.hidden_size = kFuzzHiddenSize;
  uint64_t seed = 1;
  absl::StatusOr<ParsedVerifyRequest> parsed =
      ParseVerifyRequest(r, shape, RequestLimits{kFuzzMaxBatchRows}, [&seed] { return seed++; });
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->batch.rows, 1 + 3 + 6);
  const std::string bytes = r.SerializeAsString();
  CheckRequestBytes(Bytes(bytes), bytes.size());
}

// The replays above fail only through FUZZ_CHECK aborting: make sure it does.
TEST(RequestFuzzDriverDeathTest, FuzzCheckAborts) {
  EXPECT_DEATH(
      {
        const bool never = false;
        FUZZ_CHECK(never, "expected");
      },
      "FUZZ_CHECK\\(never\\) failed: expected");
}

}  // namespace
}  // namespace flashsampler::fuzz
