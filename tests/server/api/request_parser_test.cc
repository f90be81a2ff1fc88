#include "server/api/request_parser.h"

#include <unistd.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "client/shared_memory_buffer.h"
#include "kernels/common/half_precision.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kHidden = 4;

ModelShape Shape() {
  ModelShape s;
  s.vocab_size = 100;
  s.valid_vocab = 100;
  s.hidden_size = kHidden;
  return s;
}

v1::SampleRequest Fp32Request(int64_t rows, const std::vector<float>& values) {
  v1::SampleRequest r;
  v1::Tensor* t = r.mutable_hidden_states();
  t->set_dtype(v1::DTYPE_FP32);
  t->add_shape(rows);
  t->add_shape(kHidden);
  t->mutable_data()->assign(reinterpret_cast<const char*>(values.data()),
                            values.size() * sizeof(float));
  r.add_params()->set_temperature(1.0f);
  return r;
}

v1::SampleRequest ValidRequest(int64_t rows) {
  std::vector<float> values(rows * kHidden);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i);
  return Fp32Request(rows, values);
}

absl::StatusOr<ParsedSampleRequest> Parse(const v1::SampleRequest& r, int64_t max_rows = 8) {
  uint64_t next_seed = 1000;
  return ParseSampleRequest(r, Shape(), RequestLimits{max_rows}, [&] { return next_seed++; });
}

void ExpectInvalid(const v1::SampleRequest& r, const std::string& fragment) {
  absl::StatusOr<ParsedSampleRequest> p = Parse(r);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr(fragment));
}

TEST(RequestParser, ValidFp32RequestIsDecodedExactly) {
  v1::SampleRequest r = ValidRequest(3);
  r.mutable_params(0)->set_seed(42);
  r.mutable_params(0)->set_offset(7);
  r.set_return_logz(true);
  r.set_request_id("abc");
  absl::StatusOr<ParsedSampleRequest> p = Parse(r);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->batch.rows, 3);
  ASSERT_EQ(p->batch.hidden.size(), 12u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(p->batch.hidden[i], 0.25f * i);
  ASSERT_EQ(p->batch.params.size(), 3u);
  for (uint32_t row = 0; row < 3; ++row) {
    // One shared entry: same seed and offset, streams 0..B-1.
    EXPECT_EQ(p->batch.params[row].seed, 42u);
    EXPECT_EQ(p->batch.params[row].offset, 7u);
    EXPECT_EQ(p->batch.params[row].stream, row);
    EXPECT_EQ(p->seeds[row], 42u);
  }
  EXPECT_TRUE(p->batch.want_logz);
  EXPECT_FALSE(p->batch.want_logprobs);
  EXPECT_EQ(p->request_id, "abc");
}

TEST(RequestParser, PerRowParamsUseStreamZeroAndDrawMissingSeeds) {
  v1::SampleRequest r = ValidRequest(2);
  r.mutable_params(0)->set_seed(5);
  r.add_params()->set_temperature(0.0f);  // no seed: drawn
  absl::StatusOr<ParsedSampleRequest> p = Parse(r);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->batch.params[0].seed, 5u);
  EXPECT_EQ(p->batch.params[1].seed, 1000u);
  EXPECT_EQ(p->batch.params[0].stream, 0u);
  EXPECT_EQ(p->batch.params[1].stream, 0u);
  EXPECT_EQ(p->batch.params[1].temperature, 0.0f);
  EXPECT_EQ(p->seeds, (std::vector<uint64_t>{5, 1000}));
}

TEST(RequestParser, SharedEntryWithoutSeedDrawsOneSeedForAllRows) {
  absl::StatusOr<ParsedSampleRequest> p = Parse(ValidRequest(3));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->seeds, (std::vector<uint64_t>{1000, 1000, 1000}));
}

TEST(RequestParser, Bf16AndFp16AreWidenedExactly) {
  const std::vector<float> values = {1.5f, -2.0f, 0.0078125f, 3.0f};
  for (v1::DType dtype : {v1::DTYPE_BF16, v1::DTYPE_FP16}) {
    v1::SampleRequest r = ValidRequest(1);
    v1::Tensor* t = r.mutable_hidden_states();
    t->set_dtype(dtype);
    std::string bytes(8, '\0');
    for (int i = 0; i < 4; ++i) {
      const uint16_t bits = dtype == v1::DTYPE_BF16 ? FloatToBf16(values[i]) : FloatToFp16(values[i]);
      std::memcpy(&bytes[2 * i], &bits, 2);
    }
    t->set_data(bytes);
    absl::StatusOr<ParsedSampleRequest> p = Parse(r);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_THAT(p->batch.hidden, ::testing::ElementsAreArray(values)) << v1::DType_Name(dtype);
  }
}

TEST(RequestParser, MissingHiddenStates) {
  v1::SampleRequest r;
  r.add_params();
  ExpectInvalid(r, "hidden_states is missing");
}

TEST(RequestParser, UnknownDType) {
  v1::SampleRequest r = ValidRequest(1);
  r.mutable_hidden_states()->set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectInvalid(r, "DTYPE_UNSPECIFIED");
  r.mutable_hidden_states()->set_dtype(static_cast<v1::DType>(17));
  ExpectInvalid(r, "got 17");
}

TEST(RequestParser, ShapeNotTwoDimensional) {
  v1::SampleRequest r = ValidRequest(1);
  r.mutable_hidden_states()->add_shape(1);
  ExpectInvalid(r, "2 dims");
  r.mutable_hidden_states()->clear_shape();
  ExpectInvalid(r, "got 0 dims");
}

TEST(RequestParser, WrongHiddenSize) {
  v1::SampleRequest r = ValidRequest(2);
  r.mutable_hidden_states()->set_shape(0, 1);
  r.mutable_hidden_states()->set_shape(1, 8);
  ExpectInvalid(r, "hidden size 4, got 8");
}

TEST(RequestParser, ZeroAndNegativeRows) {
  v1::SampleRequest r = ValidRequest(1);
  r.mutable_hidden_states()->set_shape(0, 0);
  r.mutable_hidden_states()->clear_data();
  ExpectInvalid(r, "must be >= 1, got 0");
  r.mutable_hidden_states()->set_shape(0, -3);
  ExpectInvalid(r, "must be >= 1, got -3");
}

TEST(RequestParser, RowsOverTheLimit) {
  ExpectInvalid(ValidRequest(9), "over this server's limit of 8");
}

TEST(RequestParser, HugeShapeClaimsAreRejectedBeforeAnyArithmetic) {
  v1::SampleRequest r = ValidRequest(1);
  r.mutable_hidden_states()->set_shape(0, std::numeric_limits<int64_t>::max());
  ExpectInvalid(r, "over this server's limit");
}

TEST(RequestParser, ByteLengthMismatch) {
  v1::SampleRequest r = ValidRequest(2);
  r.mutable_hidden_states()->mutable_data()->pop_back();
  ExpectInvalid(r, "has 31 bytes");
  r = ValidRequest(2);
  r.mutable_hidden_states()->mutable_data()->append("xxxx");
  ExpectInvalid(r, "needs 32");
}

TEST(RequestParser, NaNAndInfInHiddenStates) {
  std::vector<float> values(8, 1.0f);
  values[6] = std::numeric_limits<float>::quiet_NaN();
  ExpectInvalid(Fp32Request(2, values), "hidden_states[1][2] is NaN");
  values[6] = 1.0f;
  values[1] = -std::numeric_limits<float>::infinity();
  ExpectInvalid(Fp32Request(2, values), "hidden_states[0][1] is infinite");
  // bf16 infinity (0xff80) too.
  v1::SampleRequest r = ValidRequest(1);
  r.mutable_hidden_states()->set_dtype(v1::DTYPE_BF16);
  std::string bytes(8, '\0');
  const uint16_t inf = 0x7f80;
  std::memcpy(&bytes[4], &inf, 2);
  r.mutable_hidden_states()->set_data(bytes);
  ExpectInvalid(r, "hidden_states[0][2] is infinite");
  // The first bad element is named, whatever follows it: a bf16 NaN (0x7fc1)
  // at [0][1] before that infinity; then fp16 infinity (0x7c00) and NaN
  // (0xfe00), and the largest finite fp16 (0x7bff) passes.
  const uint16_t bf16_nan = 0x7fc1;
  std::memcpy(&bytes[2], &bf16_nan, 2);
  r.mutable_hidden_states()->set_data(bytes);
  ExpectInvalid(r, "hidden_states[0][1] is NaN");
  r.mutable_hidden_states()->set_dtype(v1::DTYPE_FP16);
  for (const auto& [bits, message] : {std::pair<uint16_t, const char*>{0x7c00, "hidden_states[0][3] is infinite"},
                                      {0xfe00, "hidden_states[0][3] is NaN"}}) {
    std::string fp16(8, '\0');
    std::memcpy(&fp16[6], &bits, 2);
    r.mutable_hidden_states()->set_data(fp16);
    ExpectInvalid(r, message);
  }
  std::string largest(8, '\0');
  const uint16_t max_fp16 = 0x7bff;
  std::memcpy(&largest[6], &max_fp16, 2);
  r.mutable_hidden_states()->set_data(largest);
  EXPECT_TRUE(Parse(r).ok());
}

TEST(RequestParser, BadTemperatures) {
  for (float t : {-0.5f, std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::infinity()}) {
    v1::SampleRequest r = ValidRequest(2);
    r.add_params()->set_temperature(t);
    ExpectInvalid(r, "params[1].temperature must be finite and >= 0");
  }
}

TEST(RequestParser, ParamsCountNeitherOneNorB) {
  v1::SampleRequest r = ValidRequest(3);
  r.add_params();
  ExpectInvalid(r, "got 2");
  r.clear_params();
  ExpectInvalid(r, "got 0");
}

TEST(RequestParser, ResponseCarriesEverything) {
  v1::SampleRequest r = ValidRequest(2);
  r.set_request_id("req-7");
  absl::StatusOr<ParsedSampleRequest> p = Parse(r);
  ASSERT_TRUE(p.ok());
  SampleResult result{{3, 9}, {1.5f, 2.5f}, {-0.1f, -0.2f}, {}, {}};
  v1::SampleResponse response;
  ASSERT_TRUE(FillSampleResponse(*p, result, &response).ok());
  EXPECT_THAT(response.token_ids(), ::testing::ElementsAre(3, 9));
  EXPECT_THAT(response.logz(), ::testing::ElementsAre(1.5f, 2.5f));
  EXPECT_THAT(response.logprobs(), ::testing::ElementsAre(-0.1f, -0.2f));
  EXPECT_THAT(response.seeds(), ::testing::ElementsAre(1000u, 1000u));
  EXPECT_EQ(response.request_id(), "req-7");
}

TEST(RequestParser, PlainRequestsCarryNoControls) {
  absl::StatusOr<ParsedSampleRequest> p = Parse(ValidRequest(3));
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->batch.controls.empty());
}

TEST(RequestParser, SharedControlsSpaceExtraSamplesByTheRowCount) {
  v1::SampleRequest r = ValidRequest(3);
  r.mutable_params(0)->set_top_k(5);
  r.mutable_params(0)->set_num_samples(2);
  absl::StatusOr<ParsedSampleRequest> p = Parse(r);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->batch.controls.size(), 3u);
  for (const RowControls& c : p->batch.controls) {
    EXPECT_EQ(c.top_k, 5);
    EXPECT_EQ(c.num_samples, 2);
    EXPECT_EQ(c.sample_stream_stride, 3u);  // sample j of row b: stream b + 3 j
  }
}

TEST(RequestParser, PerRowControlsLeaveOtherRowsPlain) {
  v1::SampleRequest r = ValidRequest(2);
  r.add_params()->set_min_p(0.5f);
  absl::StatusOr<ParsedSampleRequest> p = Parse(r);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->batch.controls.size(), 2u);
  EXPECT_FALSE(HasAnyControl(p->batch.controls[0]));
  EXPECT_EQ(p->batch.controls[1].min_p, 0.5f);
  EXPECT_EQ(p->batch.controls[1].sample_stream_stride, 1u);
}

// A stream parses each message into one ParsedSampleRequest: every field is
// the new message's (nothing of an earlier, larger or controlled one stays),
// the result equals a fresh parse, and a message no larger than the last
// reuses its buffers.
TEST(RequestParser, ParsingIntoAnEarlierRequestReplacesItAndKeepsItsBuffers) {
  uint64_t seed = 1;
  const auto draw = [&] { return seed++; };
  ParsedSampleRequest parsed;
  v1::SampleRequest big = ValidRequest(3);
  big.mutable_params(0)->set_top_k(5);
  big.set_return_logz(true);
  big.set_request_id("first");
  ASSERT_TRUE(ParseSampleRequestInto(big, Shape(), RequestLimits{8}, draw, nullptr, nullptr, &parsed).ok());
  ASSERT_EQ(parsed.batch.controls.size(), 3u);
  const float* hidden_buffer = parsed.batch.hidden.data();

  v1::SampleRequest small = ValidRequest(2);
  small.mutable_params(0)->set_seed(77);
  ASSERT_TRUE(ParseSampleRequestInto(small, Shape(), RequestLimits{8}, draw, nullptr, nullptr, &parsed).ok());
  absl::StatusOr<ParsedSampleRequest> fresh = Parse(small);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(parsed.batch.rows, 2);
  EXPECT_EQ(parsed.batch.hidden, fresh->batch.hidden);
  EXPECT_EQ(parsed.batch.params.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(parsed.batch.params[r].seed, fresh->batch.params[r].seed) << r;
    EXPECT_EQ(parsed.batch.params[r].stream, fresh->batch.params[r].stream) << r;
  }
  EXPECT_EQ(parsed.seeds, fresh->seeds);
  EXPECT_TRUE(parsed.batch.controls.empty()) << "the first message's controls stayed";
  EXPECT_FALSE(parsed.batch.want_logz);
  EXPECT_TRUE(parsed.request_id.empty());
  EXPECT_TRUE(parsed.batch.hidden_in_weight_dtype);
  EXPECT_EQ(parsed.batch.hidden.data(), hidden_buffer) << "a smaller message reallocated the hidden states";

  // An invalid message reports its error; the next valid one parses cleanly.
  v1::SampleRequest bad = ValidRequest(2);
  bad.mutable_params(0)->set_temperature(-1.0f);
  EXPECT_EQ(ParseSampleRequestInto(bad, Shape(), RequestLimits{8}, draw, nullptr, nullptr, &parsed).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ParseSampleRequestInto(small, Shape(), RequestLimits{8}, draw, nullptr, nullptr, &parsed).ok());
  EXPECT_EQ(parsed.batch.hidden, fresh->batch.hidden);
}

TEST(RequestParser, ControlErrorsNameTheirEntry) {
  v1::SampleRequest r = ValidRequest(2);
  r.add_params()->set_top_p(0.0f);
  ExpectInvalid(r, "params[1].top_p must lie in (0, 1]");
  r = ValidRequest(1);
  r.mutable_params(0)->add_banned_token_ids(100);
  ExpectInvalid(r, "params[0].banned_token_ids[0] = 100");
  r = ValidRequest(1);
  r.mutable_params(0)->set_allowed_token_bitmask(std::string(16, '\0'));
  absl::StatusOr<ParsedSampleRequest> p = Parse(r);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RequestParser, SharedControlsTooLargeOnceExpandedAreRejected) {
  // 8 rows sharing one entry of 2^22 + 1 banned ids: 8 * (2^22 + 1) > 2^25.
  v1::SampleRequest r = ValidRequest(8);
  r.mutable_params(0)->mutable_banned_token_ids()->Resize((1 << 22) + 1, 3);
  ExpectInvalid(r, "send one params entry per row");
  r.mutable_params(0)->mutable_banned_token_ids()->Resize(1 << 20, 3);  // 2^23 once expanded: fine
  EXPECT_TRUE(Parse(r).ok());
}

TEST(RequestParser, ResponseRowsCarrySamplesAndTopLogprobs) {
  v1::SampleRequest r = ValidRequest(2);
  r.mutable_params(0)->set_top_logprobs(2);
  absl::StatusOr<ParsedSampleRequest> p = Parse(r);
  ASSERT_TRUE(p.ok()) << p.status();
  SampleResult result;
  result.token_ids = {4, 8};
  result.details.resize(2);
  result.details[0] = RowSampleDetail{{4}, {-0.5f}, {2}, {{8, -0.25f}, {4, -0.5f}}};
  result.details[1] = RowSampleDetail{{8}, {-0.25f}, {1}, {{8, -0.25f}, {4, -0.5f}}};
  v1::SampleResponse response;
  ASSERT_TRUE(FillSampleResponse(*p, result, &response).ok());
  ASSERT_EQ(response.rows_size(), 2);
  EXPECT_THAT(response.rows(0).sample_token_ids(), ::testing::ElementsAre(4));
  EXPECT_THAT(response.rows(0).sample_logprobs(), ::testing::ElementsAre(-0.5f));
  EXPECT_THAT(response.rows(0).sample_ranks(), ::testing::ElementsAre(2));
  ASSERT_EQ(response.rows(0).top_logprobs_size(), 2);
  EXPECT_EQ(response.rows(0).top_logprobs(0).token_id(), 8);
  EXPECT_EQ(response.rows(0).top_logprobs(0).logprob(), -0.25f);
  // Controls that need no rows (a filter only) leave `rows` empty.
  r.mutable_params(0)->set_top_logprobs(0);
  r.mutable_params(0)->set_top_k(3);
  p = Parse(r);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(FillSampleResponse(*p, result, &response).ok());
  EXPECT_EQ(response.rows_size(), 0);
}

}  // namespace
}  // namespace flashsampler

namespace flashsampler {
namespace {

// The parser rounds H to the weights' dtype (on the gRPC thread) and marks the
// batch, so the engine's single caller thread skips that pass.
TEST(RequestParser, HiddenIsRoundedToTheWeightDType) {
  const std::vector<float> values = {1.00390625f, 1.01171875f, -3.14159265f, 1e-3f,
                                     0.1f,        65519.0f,     -2.5f,         7.0f};
  for (WeightDType dtype : {WeightDType::kBFloat16, WeightDType::kFloat16, WeightDType::kFloat32}) {
    SCOPED_TRACE(WeightDTypeName(dtype));
    ModelShape shape = Shape();
    shape.weight_dtype = dtype;
    uint64_t seed = 1;
    absl::StatusOr<ParsedSampleRequest> p = ParseSampleRequest(
        Fp32Request(2, values), shape, RequestLimits{8}, [&] { return seed++; });
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(p->batch.hidden_in_weight_dtype);
    std::vector<float> expected = values;
    ASSERT_TRUE(RoundHiddenToWeightDType(dtype, expected.data(), 8).ok());
    ASSERT_EQ(p->batch.hidden.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(p->batch.hidden[i], expected[i]) << i;
    if (dtype == WeightDType::kBFloat16) {
      EXPECT_EQ(p->batch.hidden[0], 1.0f);  // halfway between two bf16 values: to even
    }
  }
}

// Values beyond the fp16 range are refused at parse time for fp16 weights.
TEST(RequestParser, HiddenOutsideTheFp16RangeOfTheWeightsIsInvalid) {
  ModelShape shape = Shape();
  shape.weight_dtype = WeightDType::kFloat16;
  uint64_t seed = 1;
  absl::StatusOr<ParsedSampleRequest> p = ParseSampleRequest(
      Fp32Request(1, {1.0f, 70000.0f, 0.0f, 0.0f}), shape, RequestLimits{8}, [&] { return seed++; });
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("fp16 range"));
}

// So are values that round past bf16's largest finite value for bf16
// weights: fp32's range is bf16's, but for the last half ulp below FLT_MAX.
TEST(RequestParser, HiddenOutsideTheBf16RangeOfTheWeightsIsInvalid) {
  ModelShape shape = Shape();
  shape.weight_dtype = WeightDType::kBFloat16;
  uint64_t seed = 1;
  absl::StatusOr<ParsedSampleRequest> p = ParseSampleRequest(
      Fp32Request(2, {1.0f, 2.0f, 3.0f, 4.0f, 1.0f, -FLT_MAX, 0.0f, 0.0f}), shape, RequestLimits{8},
      [&] { return seed++; });
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  // Named as the non-finite check names its values: the field, row and column.
  EXPECT_THAT(std::string(p.status().message()),
              HasSubstr("(hidden_states[1][1]) is outside the bf16 range"));
}

// ---- Memory regions: hidden states read from, results written to, a region ----

v1::Tensor MakeBf16(const std::vector<float>& values, int64_t rows) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_BF16);
  t.add_shape(rows);
  t.add_shape(kHidden);
  std::string* data = t.mutable_data();
  data->resize(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = FloatToBf16(values[i]);
    std::memcpy(data->data() + 2 * i, &bits, 2);
  }
  return t;
}

// With widen_in_batcher, rows sent in the weights' own 16-bit dtype stay in
// the message (one host run, no fp32 copy) and are checked with the same
// errors; other dtypes are widened here as before.
TEST(RequestParser, RowsInTheWeightsOwnDTypeAreLeftForTheBatcherToWiden) {
  uint64_t seed = 1;
  const auto draw = [&] { return seed++; };
  ModelShape shape = Shape();  // bf16 weights
  std::vector<float> values = {1.0f, -2.0f, 0.5f, 3.0f, -0.25f, 1024.0f, 7.0f, 0.0f};
  v1::SampleRequest r;
  *r.mutable_hidden_states() = MakeBf16(values, 2);
  r.add_params()->set_temperature(1.0f);
  ParsedSampleRequest parsed;
  ASSERT_TRUE(ParseSampleRequestInto(r, shape, RequestLimits{8}, draw, nullptr, nullptr, &parsed,
                                     /*widen_in_batcher=*/true).ok());
  EXPECT_EQ(parsed.batch.rows, 2);
  EXPECT_TRUE(parsed.batch.hidden.empty());
  EXPECT_TRUE(parsed.batch.hidden_in_weight_dtype);
  ASSERT_EQ(parsed.batch.wire_hidden.size(), 1u);
  const WireHiddenRows& run = parsed.batch.wire_hidden[0];
  EXPECT_EQ(run.first_row, 0);
  EXPECT_EQ(run.rows, 2);
  EXPECT_EQ(run.data, r.hidden_states().data().data()) << "the rows were copied";
  EXPECT_EQ(run.dtype, WeightDType::kBFloat16);
  EXPECT_EQ(run.device, kHostMemory);

  // A NaN is named as when widening here.
  std::vector<float> bad = values;
  bad[5] = std::nanf("");
  v1::SampleRequest nan_request = r;
  *nan_request.mutable_hidden_states() = MakeBf16(bad, 2);
  const absl::Status deferred =
      ParseSampleRequestInto(nan_request, shape, RequestLimits{8}, draw, nullptr, nullptr, &parsed, true);
  absl::StatusOr<ParsedSampleRequest> widened = Parse(nan_request);
  ASSERT_FALSE(widened.ok());
  EXPECT_EQ(deferred, widened.status());
  EXPECT_THAT(std::string(deferred.message()), HasSubstr("hidden_states[1][1] is NaN"));

  // fp32 on the wire, or fp16 for bf16 weights: widened and rounded here.
  ASSERT_TRUE(ParseSampleRequestInto(ValidRequest(2), shape, RequestLimits{8}, draw, nullptr, nullptr,
                                     &parsed, true).ok());
  EXPECT_TRUE(parsed.batch.wire_hidden.empty());
  EXPECT_EQ(parsed.batch.hidden.size(), 2u * kHidden);
}

class RequestParserRegions : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SharedMemoryBuffer>> b = SharedMemoryBuffer::Create(
        absl::StrCat("/fs-parser-test-", getpid(), "-", ::testing::UnitTest::GetInstance()->current_test_info()->name()),
        1 << 20);
    ASSERT_TRUE(b.ok()) << b.status();
    buffer_ = *std::move(b);
    ASSERT_TRUE(regions_.RegisterSystemSharedMemory("mem", buffer_->key(), 0, buffer_->byte_size()).ok());
  }

  // `request` with its hidden bytes moved to the region at `offset`.
  v1::SampleRequest MoveToRegion(v1::SampleRequest request, uint64_t offset) {
    const std::string& data = request.hidden_states().data();
    std::memcpy(buffer_->data() + offset, data.data(), data.size());
    v1::RegionSlice* slice = request.mutable_hidden_states_region();
    slice->set_region("mem");
    slice->set_offset(offset);
    slice->set_byte_size(data.size());
    request.mutable_hidden_states()->clear_data();
    return request;
  }

  absl::StatusOr<ParsedSampleRequest> Parse(const v1::SampleRequest& r) {
    uint64_t next_seed = 1000;
    return ParseSampleRequest(r, Shape(), RequestLimits{1 << 16}, [&] { return next_seed++; }, &regions_);
  }

  std::unique_ptr<SharedMemoryBuffer> buffer_;
  MemoryRegions regions_{MemoryRegionsOptions{}};
};

TEST_F(RequestParserRegions, HiddenFromARegionDecodesExactlyAsFromBytes) {
  // 40000 rows of bf16 (320 KB): several of the parser's read chunks.
  const int64_t rows = 40000;
  std::vector<float> values(rows * kHidden);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.001f * static_cast<float>(i)) * 8.0f;
  v1::SampleRequest bytes_request;
  *bytes_request.mutable_hidden_states() = MakeBf16(values, rows);
  bytes_request.add_params()->set_seed(7);
  absl::StatusOr<ParsedSampleRequest> from_bytes = Parse(bytes_request);
  ASSERT_TRUE(from_bytes.ok()) << from_bytes.status();
  absl::StatusOr<ParsedSampleRequest> from_region = Parse(MoveToRegion(bytes_request, 4096 + 2));
  ASSERT_TRUE(from_region.ok()) << from_region.status();
  ASSERT_EQ(from_region->batch.rows, rows);
  ASSERT_EQ(from_region->batch.hidden.size(), from_bytes->batch.hidden.size());
  EXPECT_EQ(std::memcmp(from_region->batch.hidden.data(), from_bytes->batch.hidden.data(),
                        from_bytes->batch.hidden.size() * sizeof(float)), 0);
  EXPECT_EQ(from_region->seeds, from_bytes->seeds);
}

TEST_F(RequestParserRegions, RegionInputErrorsAreClear) {
  const v1::SampleRequest good = MoveToRegion(ValidRequest(3), 0);
  ASSERT_TRUE(Parse(good).ok());

  v1::SampleRequest with_data = good;
  with_data.mutable_hidden_states()->set_data(std::string(48, '\0'));
  EXPECT_THAT(std::string(Parse(with_data).status().message()), HasSubstr("data must be empty"));

  v1::SampleRequest wrong_size = good;
  wrong_size.mutable_hidden_states_region()->set_byte_size(47);
  EXPECT_EQ(Parse(wrong_size).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(Parse(wrong_size).status().message()), HasSubstr("needs 48"));

  v1::SampleRequest unknown = good;
  unknown.mutable_hidden_states_region()->set_region("other");
  EXPECT_EQ(Parse(unknown).status().code(), absl::StatusCode::kNotFound);
  unknown.mutable_hidden_states_region()->set_byte_size(47);  // and a wrong size: the name first
  EXPECT_EQ(Parse(unknown).status().code(), absl::StatusCode::kNotFound);

  v1::SampleRequest outside = good;
  outside.mutable_hidden_states_region()->set_offset(buffer_->byte_size() - 40);
  EXPECT_EQ(Parse(outside).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(Parse(outside).status().message()), HasSubstr("not inside"));

  // NaN in the region is found like NaN in the bytes, with its row and column.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(buffer_->data() + (2 * kHidden + 1) * sizeof(float), &nan, sizeof nan);
  EXPECT_THAT(std::string(Parse(good).status().message()), HasSubstr("hidden_states[2][1] is NaN"));

  // Without a registry, a request naming a region is refused.
  uint64_t seed = 1;
  EXPECT_EQ(ParseSampleRequest(good, Shape(), RequestLimits{8}, [&] { return seed++; }).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A valid fp32 request of `rows` rows whose hidden states are the slice of
// region `name` at `offset` (the region's contents are not written).
v1::SampleRequest RequestFromRegion(const std::string& name, uint64_t offset, int64_t rows) {
  v1::SampleRequest r = ValidRequest(rows);
  r.mutable_hidden_states()->clear_data();
  v1::RegionSlice* slice = r.mutable_hidden_states_region();
  slice->set_region(name);
  slice->set_offset(offset);
  slice->set_byte_size(rows * kHidden * sizeof(float));
  return r;
}

// A region that an engine on `device` may read in place: GPU memory (as a
// CUDA IPC region reports itself: the device may write it too), or,
// `host_mapped`, host memory mapped into the device's address space (a
// shared-memory region: read only). Reading it through the host fails, so a
// test sees which way the parser went.
class FakeInPlaceRegion final : public MemoryRegion {
 public:
  FakeInPlaceRegion(const char* base, int device, bool host_mapped = false)
      : base_(base), device_(device), host_mapped_(host_mapped) {}
  uint64_t byte_size() const override { return 1 << 20; }
  absl::Status ReadPieces(uint64_t, uint64_t, uint64_t, const PieceConsumer&) const override {
    return absl::DataLossError("read through the host");
  }
  absl::Status Write(uint64_t, const void*, uint64_t) const override { return absl::OkStatus(); }
  DeviceAddress DeviceAddressOf(uint64_t offset, uint64_t /*size*/) const override {
    return DeviceAddress{base_ + offset, device_};
  }
  DeviceAddress DeviceWritableAddressOf(uint64_t offset) const override {
    return host_mapped_ ? DeviceAddress{} : DeviceAddressOf(offset, 0);
  }

 private:
  const char* const base_;
  const int device_;
  const bool host_mapped_;
};

// On the device whose engine reads GPU memory in place, the hidden states
// stay where they are (the batch's wire_hidden, checked by the engine);
// on any other, or when the engine reads none in place, they are read
// through the host.
TEST(RequestParserGpuRegions, HiddenStatesOnTheEnginesGpuStayInPlace) {
  static const char kBase[1024] = {};  // stands for a device address: never read
  MemoryRegions regions{MemoryRegionsOptions{}};
  auto region = std::make_shared<FakeInPlaceRegion>(kBase, 3);
  RegionDescription description;
  description.name = "gpu";
  description.byte_size = region->byte_size();
  description.kind = RegionDescription::Kind::kCudaIpc;
  description.device_id = 3;
  ASSERT_TRUE(regions.Add(description, region).ok());
  const v1::SampleRequest r = RequestFromRegion("gpu", 256, 5);
  uint64_t seed = 1;
  const WireInput wire;  // an engine that widens, without host staging
  const auto parse = [&](bool engine_widens = true) {
    return ParseSampleRequest(r, Shape(), RequestLimits{8}, [&] { return seed++; }, &regions,
                              engine_widens ? &wire : nullptr);
  };

  regions.SetCudaDevices({2, 3}, 3);
  absl::StatusOr<ParsedSampleRequest> parsed = parse();
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->batch.rows, 5);
  EXPECT_EQ(parsed->batch.hidden.size(), 5u * kHidden);
  ASSERT_EQ(parsed->batch.wire_hidden.size(), 1u);
  const WireHiddenRows& d = parsed->batch.wire_hidden[0];
  EXPECT_EQ(d.first_row, 0);
  EXPECT_EQ(d.rows, 5);
  EXPECT_EQ(d.data, kBase + 256);
  EXPECT_EQ(d.dtype, WeightDType::kFloat32);
  EXPECT_EQ(d.device, 3);
  EXPECT_EQ(d.owner, region);  // holds the region open

  // An engine that widens nothing itself gets the values through the host.
  EXPECT_EQ(parse(false).status().code(), absl::StatusCode::kDataLoss);
  regions.SetCudaDevices({2, 3}, 2);
  EXPECT_EQ(parse().status().code(), absl::StatusCode::kDataLoss);
  regions.SetCudaDevices({2, 3});
  EXPECT_EQ(parse().status().code(), absl::StatusCode::kDataLoss);
}

// A shared-memory region mapped into the engine's device's address space:
// its hidden states are read there in place (no read through the host, no
// staging); its results still go through the host (the mapping is
// read-only), where a CUDA IPC buffer's are written by the device.
TEST(RequestParserHostMappedRegions, HiddenStatesAreReadInPlaceResultsGoThroughTheHost) {
  static const char kBase[1024] = {};  // stands for the mapping: never read here
  MemoryRegions regions{MemoryRegionsOptions{}};
  auto region = std::make_shared<FakeInPlaceRegion>(kBase, 0, /*host_mapped=*/true);
  RegionDescription description;
  description.name = "host";
  description.byte_size = region->byte_size();
  ASSERT_TRUE(regions.Add(description, region).ok());
  v1::SampleRequest r = RequestFromRegion("host", 64, 2);
  v1::RegionSlice* out = r.mutable_output_region();
  out->set_region("host");
  out->set_offset(512);
  out->set_byte_size(2 * sizeof(int32_t));
  uint64_t seed = 1;
  const WireInput wire;
  regions.SetCudaDevices({0}, 0);
  absl::StatusOr<ParsedSampleRequest> parsed =
      ParseSampleRequest(r, Shape(), RequestLimits{8}, [&] { return seed++; }, &regions, &wire);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->batch.wire_hidden.size(), 1u);
  const WireHiddenRows& run = parsed->batch.wire_hidden[0];
  EXPECT_EQ(run.data, kBase + 64);
  EXPECT_EQ(run.device, 0);
  EXPECT_FALSE(run.pinned);
  EXPECT_EQ(run.owner, region);
  EXPECT_TRUE(parsed->batch.device_outputs.empty());
  ASSERT_TRUE(parsed->output.has_value());
  // The same region as GPU memory: the device writes the results too.
  auto gpu = std::make_shared<FakeInPlaceRegion>(kBase, 0);
  description.name = "gpu";
  ASSERT_TRUE(regions.Add(description, gpu).ok());
  out->set_region("gpu");
  r.mutable_hidden_states_region()->set_region("gpu");
  parsed = ParseSampleRequest(r, Shape(), RequestLimits{8}, [&] { return seed++; }, &regions, &wire);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->batch.device_outputs.size(), 1u);
  EXPECT_EQ(parsed->batch.device_outputs[0].token_ids, reinterpret_cast<const int32_t*>(kBase + 512));
  // An engine that widens nothing itself reads through the host.
  EXPECT_EQ(ParseSampleRequest(r, Shape(), RequestLimits{8}, [&] { return seed++; }, &regions).status().code(),
            absl::StatusCode::kDataLoss);
  // A misaligned device address (fp32 rows 2 bytes off; results 2 bytes
  // off) would fault the device's loads and stores: through the host.
  auto odd = std::make_shared<FakeInPlaceRegion>(kBase + 2, 0);
  description.name = "odd";
  ASSERT_TRUE(regions.Add(description, odd).ok());
  r.mutable_hidden_states_region()->set_region("odd");
  EXPECT_EQ(ParseSampleRequest(r, Shape(), RequestLimits{8}, [&] { return seed++; }, &regions, &wire)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  r.mutable_hidden_states_region()->set_region("gpu");
  out->set_region("odd");
  parsed = ParseSampleRequest(r, Shape(), RequestLimits{8}, [&] { return seed++; }, &regions, &wire);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->batch.device_outputs.empty());
}

// Host staging that hands out ordinary memory and counts what it gave;
// `refuse` makes it give nothing (as a pinned pool that cannot allocate).
class CountingStaging final : public HostStaging {
 public:
  explicit CountingStaging(bool refuse = false) : refuse_(refuse) {}
  std::shared_ptr<void> Allocate(size_t bytes) override {
    if (refuse_) return nullptr;
    bytes_given += bytes;
    return std::shared_ptr<char>(new char[bytes], std::default_delete<char[]>());
  }
  size_t bytes_given = 0;

 private:
  const bool refuse_;
};

// For an engine that widens hidden states itself, the bytes stay as they
// arrived: copied into the engine's host staging when it has some, else
// where they lie in the message (no copy) or, from a shared-memory region,
// read once into a buffer the batch owns. The values are not checked here
// (the engine checks them on the device).
TEST_F(RequestParserRegions, AnEngineThatWidensGetsTheWireBytes) {
  std::vector<float> values(3 * kHidden);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * static_cast<float>(i) - 1.0f;
  values[5] = std::numeric_limits<float>::quiet_NaN();  // left to the engine
  v1::SampleRequest bytes_request;
  *bytes_request.mutable_hidden_states() = MakeBf16(values, 3);
  bytes_request.add_params()->set_seed(7);
  const v1::SampleRequest region_request = MoveToRegion(bytes_request, 1000);
  const std::string want = bytes_request.hidden_states().data();
  uint64_t seed = 1;
  const auto parse = [&](const v1::SampleRequest& r, const WireInput& wire) {
    return ParseSampleRequest(r, Shape(), RequestLimits{8}, [&] { return seed++; }, &regions_, &wire);
  };
  const auto expect_run = [&](const absl::StatusOr<ParsedSampleRequest>& parsed, bool staged) {
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->batch.hidden.size(), 3u * kHidden);
    ASSERT_EQ(parsed->batch.wire_hidden.size(), 1u);
    const WireHiddenRows& run = parsed->batch.wire_hidden[0];
    EXPECT_EQ(run.first_row, 0);
    EXPECT_EQ(run.rows, 3);
    EXPECT_EQ(run.dtype, WeightDType::kBFloat16);
    EXPECT_EQ(run.device, kHostMemory);
    EXPECT_EQ(run.pinned, staged);
    EXPECT_EQ(std::memcmp(run.data, want.data(), want.size()), 0);
  };

  const auto staging = std::make_shared<CountingStaging>();
  for (const WireInput& wire : {WireInput{}, WireInput{std::make_shared<CountingStaging>(true)}}) {
    // No staging to be had: the message's own bytes, no copy.
    absl::StatusOr<ParsedSampleRequest> in_message = parse(bytes_request, wire);
    expect_run(in_message, false);
    EXPECT_EQ(in_message->batch.wire_hidden[0].data, bytes_request.hidden_states().data().data());
    EXPECT_EQ(in_message->batch.wire_hidden[0].owner, nullptr);
    // A region's bytes read into memory the batch owns.
    absl::StatusOr<ParsedSampleRequest> read = parse(region_request, wire);
    expect_run(read, false);
    EXPECT_NE(read->batch.wire_hidden[0].owner, nullptr);
  }
  // With staging, both are copied into it, once.
  absl::StatusOr<ParsedSampleRequest> from_message = parse(bytes_request, WireInput{staging});
  expect_run(from_message, true);
  EXPECT_EQ(staging->bytes_given, want.size());
  absl::StatusOr<ParsedSampleRequest> from_region = parse(region_request, WireInput{staging});
  expect_run(from_region, true);
  EXPECT_EQ(staging->bytes_given, 2 * want.size());
  EXPECT_EQ(from_region->batch.wire_hidden[0].owner.get(), from_region->batch.wire_hidden[0].data);
  // Read once: later writes to the region do not reach the batch.
  std::memset(buffer_->data() + 1000, 0x7f, want.size());
  expect_run(from_region, true);
}

TEST_F(RequestParserRegions, ResultsAreWrittenPackedToTheOutputRegion) {
  v1::SampleRequest r = ValidRequest(3);
  r.set_return_logz(true);
  r.set_return_logprobs(true);
  r.mutable_output_region()->set_region("mem");
  r.mutable_output_region()->set_offset(1000);
  r.mutable_output_region()->set_byte_size(3 * 12 - 1);
  EXPECT_THAT(std::string(Parse(r).status().message()), HasSubstr("need 36"));
  r.mutable_output_region()->set_region("nope");  // unknown and too small: the name first
  EXPECT_EQ(Parse(r).status().code(), absl::StatusCode::kNotFound);
  r.mutable_output_region()->set_region("mem");
  r.mutable_output_region()->set_byte_size(3 * 12);
  absl::StatusOr<ParsedSampleRequest> p = Parse(r);
  ASSERT_TRUE(p.ok()) << p.status();
  SampleResult result;
  result.token_ids = {5, 6, 7};
  result.logz = {1.5f, 2.5f, 3.5f};
  result.logprobs = {-0.5f, -1.5f, -2.5f};
  v1::SampleResponse response;
  ASSERT_TRUE(FillSampleResponse(*p, result, &response).ok());
  EXPECT_EQ(response.token_ids_size(), 0);
  EXPECT_EQ(response.logz_size(), 0);
  EXPECT_EQ(response.logprobs_size(), 0);
  EXPECT_EQ(response.seeds_size(), 3);
  int32_t tokens[3];
  float logz[3], logprobs[3];
  std::memcpy(tokens, buffer_->data() + 1000, sizeof tokens);
  std::memcpy(logz, buffer_->data() + 1012, sizeof logz);
  std::memcpy(logprobs, buffer_->data() + 1024, sizeof logprobs);
  EXPECT_EQ(std::vector<int32_t>(tokens, tokens + 3), result.token_ids);
  EXPECT_EQ(std::vector<float>(logz, logz + 3), result.logz);
  EXPECT_EQ(std::vector<float>(logprobs, logprobs + 3), result.logprobs);
}

}  // namespace
}  // namespace flashsampler
