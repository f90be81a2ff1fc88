// The helpers every engine shares (server/engine/engine.cc): the batch layout
// check, rounding hidden states to W's dtype, results from host outputs, the
// mapping of kernel outcomes to statuses, the model shape. The CPU engine that
// uses them is cpu_engine_test.cc; the CUDA engines, tests/gpu/.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/engine/engine.h"

namespace flashsampler {
namespace {

constexpr int64_t kHidden = 16;

// A plain batch of `rows` rows (every value 0.25) with the layout
// CheckBatchLayout wants.
SampleBatch PlainBatch(int64_t rows, float temperature, uint64_t seed) {
  SampleBatch b;
  b.rows = rows;
  b.hidden.assign(static_cast<size_t>(rows * kHidden), 0.25f);
  b.params.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    b.params[r].temperature = temperature;
    b.params[r].seed = seed;
    b.params[r].stream = static_cast<uint32_t>(r);
  }
  return b;
}

TEST(CheckBatchLayout, RowsParamsHiddenControlsAndDraftsMustAgree) {
  const auto check = [](const SampleBatch& b) {
    return CheckBatchLayout(b, kHidden, 8, "test engine").code();
  };
  EXPECT_EQ(check(PlainBatch(8, 1.0f, 1)), absl::StatusCode::kOk);
  SampleBatch b = PlainBatch(3, 1.0f, 1);
  EXPECT_EQ(check(b), absl::StatusCode::kOk);
  b.rows = 0;
  EXPECT_EQ(check(b), absl::StatusCode::kInvalidArgument);  // no rows
  EXPECT_EQ(check(PlainBatch(9, 1.0f, 1)), absl::StatusCode::kInvalidArgument);  // over max_rows
  b = PlainBatch(3, 1.0f, 1);
  b.params.pop_back();
  EXPECT_EQ(check(b), absl::StatusCode::kInvalidArgument);  // params not one per row
  b = PlainBatch(3, 1.0f, 1);
  b.hidden.resize(b.hidden.size() - 1);
  EXPECT_EQ(check(b), absl::StatusCode::kInvalidArgument);  // hidden not rows x hidden_size
  b = PlainBatch(3, 1.0f, 1);
  b.controls.resize(3);
  EXPECT_EQ(check(b), absl::StatusCode::kOk);
  b.controls.resize(2);
  EXPECT_EQ(check(b), absl::StatusCode::kInvalidArgument);  // controls neither empty nor per row
  b = PlainBatch(3, 1.0f, 1);
  b.draft_tokens = {1, -1, 2};
  EXPECT_EQ(check(b), absl::StatusCode::kOk);
  b.draft_tokens.push_back(3);
  const absl::Status s = CheckBatchLayout(b, kHidden, 8, "test engine");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);  // drafts neither empty nor per row
  EXPECT_NE(s.message().find("test engine"), std::string::npos) << s;  // names the engine
}

TEST(CheckBatchLayout, WireRowsMustBeSortedDisjointInsideAndInHostMemoryOrOnTheEnginesGpu) {
  SampleBatch batch = PlainBatch(5, 1.0f, 1);
  static const float kNeverRead = 0.0f;
  const auto rows = [](int64_t first, int64_t n, int device) {
    return WireHiddenRows{first, n, &kNeverRead, WeightDType::kBFloat16, device, false, nullptr};
  };
  const auto check = [&batch](std::vector<WireHiddenRows> runs) {
    batch.wire_hidden = std::move(runs);
    return CheckBatchLayout(batch, kHidden, 8, "test engine", 2).code();
  };
  EXPECT_EQ(check({rows(0, 2, 2), rows(3, 2, 2)}), absl::StatusCode::kOk);
  EXPECT_EQ(check({rows(0, 5, 2)}), absl::StatusCode::kOk);
  EXPECT_EQ(check({rows(0, 2, kHostMemory), rows(2, 1, 2)}), absl::StatusCode::kOk);
  EXPECT_EQ(check({rows(0, 2, 1)}), absl::StatusCode::kInvalidArgument);                // another GPU
  EXPECT_EQ(check({rows(3, 2, 2), rows(0, 2, 2)}), absl::StatusCode::kInvalidArgument);  // unsorted
  EXPECT_EQ(check({rows(0, 3, 2), rows(2, 2, 2)}), absl::StatusCode::kInvalidArgument);  // overlapping
  EXPECT_EQ(check({rows(4, 2, 2)}), absl::StatusCode::kInvalidArgument);                 // past the end
  EXPECT_EQ(check({rows(1, 0, 2)}), absl::StatusCode::kInvalidArgument);                 // empty
  batch.wire_hidden = {WireHiddenRows{0, 1, nullptr, WeightDType::kBFloat16, 2, false, nullptr}};
  EXPECT_EQ(CheckBatchLayout(batch, kHidden, 8, "test engine", 2).code(), absl::StatusCode::kInvalidArgument);
  batch.wire_hidden = {rows(0, 1, kHostMemory)};
  EXPECT_EQ(CheckBatchLayout(batch, kHidden, 8, "test engine").code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckBatchLayout, DeviceOutputsOnlyOnTheEnginesGpuForPlainBatchesSortedAndInside) {
  SampleBatch batch = PlainBatch(5, 1.0f, 2);
  static int32_t never_written[5];
  const auto rows = [](int64_t first, int64_t n, int device) {
    return DeviceOutputRows{first, n, never_written, nullptr, nullptr, device, nullptr};
  };
  const auto check = [&batch](std::vector<DeviceOutputRows> runs, int engine_device = 2) {
    batch.device_outputs = std::move(runs);
    return CheckBatchLayout(batch, kHidden, 8, "test engine", engine_device).code();
  };
  EXPECT_EQ(check({rows(0, 2, 2), rows(2, 3, 2)}), absl::StatusCode::kOk);
  EXPECT_EQ(check({rows(0, 2, 1)}), absl::StatusCode::kInvalidArgument);                // another GPU
  EXPECT_EQ(check({rows(0, 2, kHostMemory)}), absl::StatusCode::kInvalidArgument);      // host memory
  EXPECT_EQ(check({rows(0, 2, 2)}, kNoWireHidden), absl::StatusCode::kInvalidArgument);  // a CPU engine
  EXPECT_EQ(check({rows(2, 2, 2), rows(0, 2, 2)}), absl::StatusCode::kInvalidArgument);  // unsorted
  EXPECT_EQ(check({rows(4, 2, 2)}), absl::StatusCode::kInvalidArgument);                 // past the end
  EXPECT_EQ(check({rows(1, 0, 2)}), absl::StatusCode::kInvalidArgument);                 // empty
  // Draft rows (a Verify request in the same launch) beside device results
  // for rows without a draft; not for a row with one.
  batch.draft_tokens = {3, 1, -1, -1, -1};
  EXPECT_EQ(check({rows(2, 3, 2)}), absl::StatusCode::kOk);
  EXPECT_EQ(check({rows(1, 3, 2)}), absl::StatusCode::kInvalidArgument);
  batch.draft_tokens.clear();
  batch.controls.resize(5);  // a batch with controls assembles its results on the host
  EXPECT_EQ(check({rows(0, 5, 2)}), absl::StatusCode::kInvalidArgument);
}

TEST(RoundHiddenToWeightDType, Fp16OverflowIsInvalidAndFp32IsUntouched) {
  std::vector<float> v = {1.0f + 0x1p-20f, 70000.0f};
  std::vector<float> copy = v;
  EXPECT_TRUE(RoundHiddenToWeightDType(WeightDType::kFloat32, copy.data(), 2).ok());
  EXPECT_EQ(copy, v);
  absl::Status s = RoundHiddenToWeightDType(WeightDType::kFloat16, v.data(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("fp16 range"), std::string::npos) << s;
  std::vector<float> ok = {1.0f + 0x1p-20f, -3.0f};
  ASSERT_TRUE(RoundHiddenToWeightDType(WeightDType::kBFloat16, ok.data(), 2).ok());
  EXPECT_EQ(ok, (std::vector<float>{1.0f, -3.0f}));
}

// bf16 keeps fp32's exponent, so only values within half a bf16 ulp of
// FLT_MAX round to infinity: from 0x1.ffp127 (the tie rounds to even, which is
// the infinity), not just below it.
TEST(RoundHiddenToWeightDType, Bf16OverflowNearFltMaxIsInvalidAndNamesBf16) {
  std::vector<float> below = {0x1.fefffep127f, -0x1.fefffep127f};
  ASSERT_TRUE(RoundHiddenToWeightDType(WeightDType::kBFloat16, below.data(), 2).ok());
  EXPECT_EQ(below, (std::vector<float>{0x1.fep127f, -0x1.fep127f}));  // the largest finite bf16
  for (float v : {0x1.ffp127f, FLT_MAX, -FLT_MAX}) {
    std::vector<float> over = {1.0f, v};
    const absl::Status s = RoundHiddenToWeightDType(WeightDType::kBFloat16, over.data(), 2);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << v;
    EXPECT_NE(std::string(s.message()).find("bf16 range"), std::string::npos) << s;
    EXPECT_NE(std::string(s.message()).find("element 1"), std::string::npos) << s;
  }
  // Rows of `cols` values: the value is placed as field[row][col].
  std::vector<float> rows = {1.0f, 2.0f, 3.0f, 4.0f, FLT_MAX, 6.0f};
  const absl::Status s = RoundHiddenToWeightDType(WeightDType::kBFloat16, rows.data(), 6, 3, "h");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("(h[1][1]) is outside the bf16 range"), std::string::npos) << s;
  // Rows numbered from first_row (a part of a split request).
  rows[4] = FLT_MAX;
  const absl::Status later = RoundHiddenToWeightDType(WeightDType::kBFloat16, rows.data(), 6, 3, "h", 40);
  EXPECT_NE(std::string(later.message()).find("(h[41][1]) is outside the bf16 range"), std::string::npos) << later;
}

TEST(SampleResultFromHostOutputs, FillsWhatTheBatchAskedFor) {
  SampleBatch batch;
  batch.rows = 2;
  const int32_t tokens[2] = {7, 3};
  const float logz[2] = {1.5f, 2.5f};
  const float logprobs[2] = {-0.5f, -1.5f};
  const float draft_logprobs[2] = {-0.25f, NAN};
  SampleResult plain = SampleResultFromHostOutputs(batch, tokens, nullptr, nullptr, nullptr);
  EXPECT_EQ(plain.token_ids, (std::vector<int32_t>{7, 3}));
  EXPECT_TRUE(plain.logz.empty());
  EXPECT_TRUE(plain.logprobs.empty());
  EXPECT_TRUE(plain.draft_logprobs.empty());
  EXPECT_TRUE(plain.details.empty());

  batch.want_logz = batch.want_logprobs = true;
  batch.draft_tokens = {4, -1};
  batch.controls.resize(2);
  SampleResult full = SampleResultFromHostOutputs(batch, tokens, logz, logprobs, draft_logprobs);
  EXPECT_EQ(full.logz, (std::vector<float>{1.5f, 2.5f}));
  EXPECT_EQ(full.logprobs, (std::vector<float>{-0.5f, -1.5f}));
  ASSERT_EQ(full.draft_logprobs.size(), 2u);
  EXPECT_EQ(full.draft_logprobs[0], -0.25f);
  EXPECT_TRUE(std::isnan(full.draft_logprobs[1]));
  ASSERT_EQ(full.details.size(), 2u);
  EXPECT_EQ(full.details[0].token_ids, (std::vector<int32_t>{7}));
  EXPECT_EQ(full.details[1].token_ids, (std::vector<int32_t>{3}));
}

TEST(KernelStatusToStatus, EachOutcomeHasItsCode) {
  EXPECT_TRUE(KernelStatusToStatus(kernels::KernelStatus::kOk, "launch").ok());
  EXPECT_EQ(KernelStatusToStatus(kernels::KernelStatus::kInvalidArgument, "launch").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KernelStatusToStatus(kernels::KernelStatus::kOutOfMemory, "launch").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(KernelStatusToStatus(kernels::KernelStatus::kFailedPrecondition, "launch").code(),
            absl::StatusCode::kFailedPrecondition);
  // Device and internal errors are Internal: what marks a device engine unhealthy.
  EXPECT_EQ(KernelStatusToStatus(kernels::KernelStatus::kDeviceError, "launch").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(KernelStatusToStatus(kernels::KernelStatus::kInternal, "launch").code(),
            absl::StatusCode::kInternal);
  const absl::Status s = KernelStatusToStatus(kernels::KernelStatus::kOutOfMemory, "LaunchFoo");
  EXPECT_NE(s.message().find("LaunchFoo"), std::string::npos) << s;
}

TEST(ResolveModelShape, ValidVocabZeroIsTheWholeVocabularyAndMustFit) {
  const LmHead head = LmHead::Demo(300, kHidden, 3);
  absl::StatusOr<ModelShape> whole = ResolveModelShape(head, 0);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->vocab_size, 300);
  EXPECT_EQ(whole->valid_vocab, 300);
  EXPECT_EQ(whole->hidden_size, kHidden);
  EXPECT_EQ(whole->weight_dtype, WeightDType::kBFloat16);
  absl::StatusOr<ModelShape> part = ResolveModelShape(head, 10);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->valid_vocab, 10);
  EXPECT_EQ(ResolveModelShape(head, 301).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveModelShape(head, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

// The metrics label each launch with its path's name: every path has its own.
TEST(LaunchPathName, EveryPathHasADistinctName) {
  std::set<std::string> names;
  for (int p = static_cast<int>(LaunchPath::kUnspecified);
       p <= static_cast<int>(LaunchPath::kShardedFusedControlled); ++p) {
    names.insert(LaunchPathName(static_cast<LaunchPath>(p)));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(LaunchPath::kShardedFusedControlled) + 1);
  EXPECT_STREQ(LaunchPathName(LaunchPath::kCpu), "cpu");
  EXPECT_STREQ(LaunchPathName(LaunchPath::kUnspecified), "unspecified");
}

}  // namespace
}  // namespace flashsampler
