// Batch assembly: the launch plan takes queued rows in order, cuts a request
// that does not fit and never mixes controlled and plain requests; slices of
// several requests concatenate in order (hidden
// rows and params), flags are OR-ed, and scatter hands every request exactly
// its rows and only the outputs it asked for, also for a request split over
// two launches.
#include "server/batching/batch_assembly.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashsampler {
namespace {

using ::testing::ElementsAre;
constexpr int64_t kHidden = 2;

// Row r of request `tag` has hidden values {tag*100 + r, -(tag*100 + r)} and seed tag*100 + r.
SampleBatch Request(int tag, int64_t rows, bool logz, bool logprobs) {
  SampleBatch b;
  b.rows = rows;
  for (int64_t r = 0; r < rows; ++r) {
    const float v = static_cast<float>(tag * 100 + r);
    b.hidden.push_back(v);
    b.hidden.push_back(-v);
    RowParams p{};
    p.temperature = 0.5f;
    p.seed = static_cast<uint64_t>(tag * 100 + r);
    b.params.push_back(p);
  }
  b.want_logz = logz;
  b.want_logprobs = logprobs;
  return b;
}

// The launch result a fake engine would give: token = seed, logz = seed + 0.5,
// logprob = -seed.
SampleResult FakeLaunch(const SampleBatch& launch) {
  SampleResult r;
  for (const RowParams& p : launch.params) {
    r.token_ids.push_back(static_cast<int32_t>(p.seed));
    if (launch.want_logz) r.logz.push_back(static_cast<float>(p.seed) + 0.5f);
    if (launch.want_logprobs) r.logprobs.push_back(-static_cast<float>(p.seed));
  }
  return r;
}

TEST(BatchAssembly, ConcatenatesSlicesInOrderAndOrsTheFlags) {
  const SampleBatch a = Request(1, 3, false, false);
  const SampleBatch b = Request(2, 2, true, false);
  const SampleBatch launch = ConcatenateSlices({{&a, 1, 2}, {&b, 0, 2}}, kHidden);
  EXPECT_EQ(launch.rows, 4);
  EXPECT_THAT(launch.hidden, ElementsAre(101, -101, 102, -102, 200, -200, 201, -201));
  ASSERT_EQ(launch.params.size(), 4u);
  EXPECT_EQ(launch.params[0].seed, 101u);
  EXPECT_EQ(launch.params[3].seed, 201u);
  EXPECT_TRUE(launch.want_logz);
  EXPECT_FALSE(launch.want_logprobs);
}

// A request whose rows are in GPU memory joins a launch by reference: the
// launch's WireHiddenRows points at the slice's first row, at the slice's
// place in the launch, and the host rows around it are copied as usual.
TEST(BatchAssembly, RowsInGpuMemoryJoinTheLaunchByReference) {
  const SampleBatch a = Request(1, 1, false, false);
  SampleBatch b = Request(2, 4, false, false);
  static const uint16_t kDeviceRows[4 * kHidden] = {};  // stands for GPU memory: never read
  auto owner = std::make_shared<int>(7);
  b.wire_hidden.push_back(WireHiddenRows{0, 4, kDeviceRows, WeightDType::kBFloat16, 3, false, owner});
  const SampleBatch c = Request(3, 2, false, false);
  const SampleBatch launch = ConcatenateSlices({{&a, 0, 1}, {&b, 1, 3}, {&c, 0, 1}}, kHidden);
  EXPECT_EQ(launch.rows, 5);
  ASSERT_EQ(launch.hidden.size(), 5u * kHidden);
  EXPECT_THAT(std::vector<float>(launch.hidden.begin(), launch.hidden.begin() + 2), ElementsAre(100, -100));
  EXPECT_THAT(std::vector<float>(launch.hidden.begin() + 8, launch.hidden.end()), ElementsAre(300, -300));
  ASSERT_EQ(launch.wire_hidden.size(), 1u);
  const WireHiddenRows& d = launch.wire_hidden[0];
  EXPECT_EQ(d.first_row, 1);
  EXPECT_EQ(d.rows, 3);
  EXPECT_EQ(d.data, kDeviceRows + 1 * kHidden);  // the slice starts at the request's row 1
  EXPECT_EQ(d.dtype, WeightDType::kBFloat16);
  EXPECT_EQ(d.device, 3);
  EXPECT_EQ(d.owner, owner);
  ASSERT_EQ(launch.params.size(), 5u);
  EXPECT_EQ(launch.params[1].seed, 201u);
}

// Results written on the device follow their request's slice: the launch's
// run starts at the slice's place in the launch and points at the slice's
// first row of each output (token ids, and logz / logprobs where asked).
TEST(BatchAssembly, DeviceOutputsFollowTheirSlice) {
  const SampleBatch a = Request(1, 2, true, false);
  SampleBatch b = Request(2, 5, true, false);
  static int32_t tokens[5];  // stand for GPU memory: never touched
  static float logz[5];
  auto owner = std::make_shared<int>(9);
  b.device_outputs.push_back(DeviceOutputRows{0, 5, tokens, logz, nullptr, 3, owner});
  const SampleBatch launch = ConcatenateSlices({{&a, 0, 2}, {&b, 2, 3}}, kHidden);
  EXPECT_EQ(launch.rows, 5);
  ASSERT_EQ(launch.device_outputs.size(), 1u);
  const DeviceOutputRows& d = launch.device_outputs[0];
  EXPECT_EQ(d.first_row, 2);  // after a's two rows
  EXPECT_EQ(d.rows, 3);
  EXPECT_EQ(d.token_ids, tokens + 2);  // b's row 2 onwards
  EXPECT_EQ(d.logz, logz + 2);
  EXPECT_EQ(d.logprobs, nullptr);
  EXPECT_EQ(d.device, 3);
  EXPECT_EQ(d.owner, owner);
  // The first part of b in an earlier launch.
  const SampleBatch first = ConcatenateSlices({{&b, 0, 2}}, kHidden);
  EXPECT_EQ(launch.request_row_offset, 0);  // two requests: rows are named by the launch
  EXPECT_EQ(first.request_row_offset, 0);
  EXPECT_EQ(ConcatenateSlices({{&b, 2, 3}}, kHidden).request_row_offset, 2);  // b's rows 2-4 alone
  ASSERT_EQ(first.device_outputs.size(), 1u);
  EXPECT_EQ(first.device_outputs[0].first_row, 0);
  EXPECT_EQ(first.device_outputs[0].rows, 2);
  EXPECT_EQ(first.device_outputs[0].token_ids, tokens);
}

// A Verify request (draft rows) and a Sample request whose results go to GPU
// memory, planned into one launch by an engine that mixes draft rows with
// plain ones: the launch is one an engine on that GPU accepts (the Sample
// rows carry draft -1).
TEST(BatchAssembly, DraftRowsAndDeviceResultsFormALaunchTheEngineAccepts) {
  SampleBatch verify = Request(1, 3, false, false);
  verify.draft_tokens = {4, 5, -1};
  SampleBatch sample = Request(2, 2, false, false);
  static int32_t tokens[2];  // stands for GPU memory: never touched
  sample.device_outputs.push_back(DeviceOutputRows{0, 2, tokens, nullptr, nullptr, 0, nullptr});
  const std::vector<PendingRequest> queue = {{&verify, 0}, {&sample, 0}};
  const std::vector<RowSlice> plan = PlanLaunch(queue, 8, DraftMixing{true, true});
  ASSERT_EQ(plan.size(), 2u);
  const SampleBatch launch = ConcatenateSlices(plan, kHidden);
  EXPECT_EQ(launch.draft_tokens, (std::vector<int32_t>{4, 5, -1, -1, -1}));
  ASSERT_EQ(launch.device_outputs.size(), 1u);
  EXPECT_EQ(launch.device_outputs[0].first_row, 3);
  const absl::Status accepted = CheckBatchLayout(launch, kHidden, 8, "test engine", /*wire_hidden_device=*/0);
  EXPECT_TRUE(accepted.ok()) << accepted;
}

// For an engine that takes fp32, host wire rows (bf16 or fp16 in the
// message, as the parser leaves rows in the weights' own 16-bit dtype) are
// widened exactly into the launch's hidden states at their place, from the
// slice's first row; no wire run reaches the launch.
TEST(BatchAssembly, HostWireRowsAreWidenedIntoTheLaunchForAnFp32Engine) {
  const SampleBatch a = Request(1, 1, false, false);
  // bf16 1.0, -2.0, 0.5, 3.0, -0.25, 1024 (rows of kHidden = 2 values).
  static const uint16_t kBf16[6] = {0x3f80, 0xc000, 0x3f00, 0x4040, 0xbe80, 0x4480};
  SampleBatch b = Request(2, 3, false, false);
  b.hidden.clear();  // the parser leaves it empty for such rows
  b.wire_hidden.push_back(WireHiddenRows{0, 3, kBf16, WeightDType::kBFloat16, kHostMemory, false, nullptr});
  // fp16 -1.5, 65504 (the largest finite fp16).
  static const uint16_t kFp16[2] = {0xbe00, 0x7bff};
  SampleBatch c = Request(3, 1, false, false);
  c.hidden.clear();
  c.wire_hidden.push_back(WireHiddenRows{0, 1, kFp16, WeightDType::kFloat16, kHostMemory, false, nullptr});
  const SampleBatch launch =
      ConcatenateSlices({{&a, 0, 1}, {&b, 1, 2}, {&c, 0, 1}}, kHidden, /*widen_wire_rows=*/true);
  EXPECT_EQ(launch.rows, 4);
  EXPECT_TRUE(launch.wire_hidden.empty());
  EXPECT_THAT(launch.hidden, ElementsAre(100, -100, 0.5f, 3.0f, -0.25f, 1024.0f, -1.5f, 65504.0f));
  ASSERT_EQ(launch.params.size(), 4u);
  EXPECT_EQ(launch.params[1].seed, 201u);
  EXPECT_EQ(launch.params[3].seed, 300u);
}

TEST(BatchAssembly, ScatterGivesEachRequestItsRowsAndOnlyWhatItAskedFor) {
  const SampleBatch plain = Request(1, 2, false, false);
  const SampleBatch with_logz = Request(2, 1, true, false);
  const SampleBatch with_both = Request(3, 2, true, true);
  const std::vector<RowSlice> slices = {{&plain, 0, 2}, {&with_logz, 0, 1}, {&with_both, 0, 2}};
  const SampleBatch launch = ConcatenateSlices(slices, kHidden);
  ASSERT_TRUE(launch.want_logz && launch.want_logprobs);
  const SampleResult result = FakeLaunch(launch);

  SampleResult r1 = ResultFor(plain), r2 = ResultFor(with_logz), r3 = ResultFor(with_both);
  ScatterSlice(result, 0, slices[0], &r1);
  ScatterSlice(result, 2, slices[1], &r2);
  ScatterSlice(result, 3, slices[2], &r3);
  EXPECT_THAT(r1.token_ids, ElementsAre(100, 101));
  EXPECT_TRUE(r1.logz.empty());
  EXPECT_TRUE(r1.logprobs.empty());
  EXPECT_THAT(r2.token_ids, ElementsAre(200));
  EXPECT_THAT(r2.logz, ElementsAre(200.5f));
  EXPECT_TRUE(r2.logprobs.empty());
  EXPECT_THAT(r3.token_ids, ElementsAre(300, 301));
  EXPECT_THAT(r3.logz, ElementsAre(300.5f, 301.5f));
  EXPECT_THAT(r3.logprobs, ElementsAre(-300.0f, -301.0f));
}

TEST(BatchAssembly, ARequestSplitOverTwoLaunchesIsReassembled) {
  const SampleBatch big = Request(4, 5, false, true);
  const SampleBatch other = Request(5, 1, false, false);
  SampleResult out = ResultFor(big);
  // Launch 1: rows 0..2 of `big`. Launch 2: `other`, then rows 3..4 of `big`.
  const std::vector<RowSlice> first = {{&big, 0, 3}};
  const std::vector<RowSlice> second = {{&other, 0, 1}, {&big, 3, 2}};
  ScatterSlice(FakeLaunch(ConcatenateSlices(first, kHidden)), 0, first[0], &out);
  const SampleBatch launch2 = ConcatenateSlices(second, kHidden);
  EXPECT_FALSE(launch2.want_logz);
  EXPECT_TRUE(launch2.want_logprobs);
  ScatterSlice(FakeLaunch(launch2), 1, second[1], &out);
  EXPECT_THAT(out.token_ids, ElementsAre(400, 401, 402, 403, 404));
  EXPECT_THAT(out.logprobs, ElementsAre(-400.0f, -401.0f, -402.0f, -403.0f, -404.0f));
  EXPECT_TRUE(out.logz.empty());
}

TEST(BatchAssembly, ControlsArePaddedForPlainRowsAndDetailsGoBackOnlyWhereAsked) {
  SampleBatch controlled = Request(6, 2, false, false);
  controlled.controls.resize(2);
  controlled.controls[0].top_k = 5;
  controlled.controls[1].top_k = 7;
  const SampleBatch plain = Request(7, 1, false, false);
  const std::vector<RowSlice> slices = {{&plain, 0, 1}, {&controlled, 1, 1}};
  const SampleBatch launch = ConcatenateSlices(slices, kHidden);
  ASSERT_EQ(launch.controls.size(), 2u);
  EXPECT_EQ(launch.controls[0].top_k, 0);  // the plain row: default controls
  EXPECT_EQ(launch.controls[1].top_k, 7);  // row 1 of `controlled`

  SampleResult result = FakeLaunch(launch);
  result.details.resize(2);
  result.details[0].token_ids = {700};
  result.details[1].token_ids = {601, 602};
  SampleResult r_plain = ResultFor(plain), r_controlled = ResultFor(controlled);
  EXPECT_TRUE(r_plain.details.empty());
  ASSERT_EQ(r_controlled.details.size(), 2u);
  ScatterSlice(result, 0, slices[0], &r_plain);
  ScatterSlice(result, 1, slices[1], &r_controlled);
  EXPECT_TRUE(r_plain.details.empty());
  EXPECT_THAT(r_controlled.token_ids, ElementsAre(0, 601));
  EXPECT_THAT(r_controlled.details[1].token_ids, ElementsAre(601, 602));
  EXPECT_TRUE(r_controlled.details[0].token_ids.empty());  // filled by another launch

  // Launches of plain requests only carry no controls at all.
  EXPECT_TRUE(ConcatenateSlices({{&plain, 0, 1}}, kHidden).controls.empty());
}

SampleBatch Controlled(int tag, int64_t rows) {
  SampleBatch b = Request(tag, rows, false, false);
  b.controls.resize(static_cast<size_t>(rows));
  for (RowControls& c : b.controls) c.top_k = 3;
  return b;
}

TEST(BatchAssembly, PlanTakesQueuedRowsInOrderAndCutsTheRequestThatDoesNotFit) {
  const SampleBatch a = Request(1, 3, false, false);
  const SampleBatch b = Request(2, 4, false, false);
  const SampleBatch c = Request(3, 1, false, false);
  // a continues from row 1; 2 + 4 = 6 rows, so b is cut after 2 of its 4.
  const std::vector<RowSlice> plan = PlanLaunch({{&a, 1}, {&b, 0}, {&c, 0}}, 4);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].batch, &a);
  EXPECT_EQ(plan[0].first_row, 1);
  EXPECT_EQ(plan[0].rows, 2);
  EXPECT_EQ(plan[1].batch, &b);
  EXPECT_EQ(plan[1].first_row, 0);
  EXPECT_EQ(plan[1].rows, 2);
  // The next launch continues b, then takes c.
  const std::vector<RowSlice> next = PlanLaunch({{&b, 2}, {&c, 0}}, 4);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].first_row, 2);
  EXPECT_EQ(next[0].rows, 2);
  EXPECT_EQ(next[1].batch, &c);
  EXPECT_EQ(next[1].rows, 1);
}

TEST(BatchAssembly, PlanNeverMixesControlledAndPlainRequests) {
  const SampleBatch plain1 = Request(1, 1, false, false);
  const SampleBatch controlled1 = Controlled(2, 2);
  const SampleBatch controlled2 = Controlled(3, 1);
  const SampleBatch plain2 = Request(4, 1, false, false);
  const std::vector<PendingRequest> queue = {{&plain1, 0}, {&controlled1, 0}, {&controlled2, 0}, {&plain2, 0}};
  const std::vector<RowSlice> first = PlanLaunch(queue, 100);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].batch, &plain1);
  const std::vector<RowSlice> second = PlanLaunch({queue.begin() + 1, queue.end()}, 100);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].batch, &controlled1);
  EXPECT_EQ(second[1].batch, &controlled2);
  EXPECT_EQ(PlanLaunch({queue.begin() + 3, queue.end()}, 100).size(), 1u);
}

TEST(BatchAssembly, PlanKeepsDraftedRequestsApartOnlyWhereTheMixingForbidsIt) {
  const SampleBatch plain = Request(1, 1, false, false);
  SampleBatch drafted = Request(2, 2, false, false);
  drafted.draft_tokens = {5, -1};
  SampleBatch controlled_drafted = Controlled(3, 2);
  controlled_drafted.draft_tokens = {7, -1};
  const SampleBatch controlled = Controlled(4, 1);
  const std::vector<PendingRequest> plain_queue = {{&plain, 0}, {&drafted, 0}};
  const std::vector<PendingRequest> controlled_queue = {{&controlled_drafted, 0}, {&controlled, 0}};
  // Mixing allowed (the default): one launch per control kind.
  EXPECT_EQ(PlanLaunch(plain_queue, 100).size(), 2u);
  EXPECT_EQ(PlanLaunch(controlled_queue, 100).size(), 2u);
  // Drafts served without controls only (the CUDA engine): plain launches mix,
  // controlled launches split.
  DraftMixing cuda;
  cuda.controlled = false;
  EXPECT_EQ(PlanLaunch(plain_queue, 100, cuda).size(), 2u);
  const std::vector<RowSlice> first = PlanLaunch(controlled_queue, 100, cuda);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].batch, &controlled_drafted);
  // No drafts served at all: a plain launch also ends at the drafted request.
  DraftMixing none;
  none.plain = false;
  none.controlled = false;
  const std::vector<RowSlice> plain_first = PlanLaunch(plain_queue, 100, none);
  ASSERT_EQ(plain_first.size(), 1u);
  EXPECT_EQ(plain_first[0].batch, &plain);
}

TEST(BatchAssembly, PlanIsEmptyOnlyForAnEmptyQueueOrNoCapacity) {
  const SampleBatch a = Request(1, 2, false, false);
  EXPECT_TRUE(PlanLaunch({}, 8).empty());
  EXPECT_TRUE(PlanLaunch({{&a, 0}}, 0).empty());
  EXPECT_EQ(PlanLaunch({{&a, 0}}, 1).size(), 1u);
}

}  // namespace
}  // namespace flashsampler
