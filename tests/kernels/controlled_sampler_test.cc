// Tests of kernels/cpu/controlled_sampler.h: every sampling control against
// the float64 reference (tests/common/controls_reference.h) with the shared
// goodness-of-fit check, both paths; the fused and materialized paths give
// identical outputs; the edge cases of issue 3 (top_k = 1 is greedy, top_p = 1
// and min_p = 0 change nothing, top-k boundary ties go to the lower id, a row
// with every token masked fails with kFailedPrecondition); independent
// samples; top logprobs and ranks in both modes; argument checks.
//
// Statistical cases use D = 1 and H = 1, so the logits are the fp32 column W
// exactly, whatever BLAS does.
#include "kernels/cpu/controlled_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/tiled_sampler.h"
#include "tests/common/controls_fit_cases.h"
#include "tests/common/controls_reference.h"
#include "tests/common/goodness_of_fit.h"
#include "tests/common/token_panels.h"

namespace flashsampler::kernels {
namespace {

constexpr int kThreads = 2;
constexpr int64_t kRowsPerCall = 1 << 16;

struct Outputs {
  std::vector<int32_t> tokens;
  std::vector<float> logz;
  std::vector<float> logprobs;
  std::vector<RowSampleDetail> details;
};

Outputs RunSampler(CpuControlledSampler& sampler, const std::vector<float>& h, const std::vector<RowParams>& params,
            const std::vector<RowControls>& controls, CpuControlledPath path,
            KernelStatus want = KernelStatus::kOk) {
  const int64_t batch = static_cast<int64_t>(params.size());
  Outputs out{std::vector<int32_t>(batch, -7), std::vector<float>(batch, NAN),
              std::vector<float>(batch, NAN), std::vector<RowSampleDetail>(batch)};
  EXPECT_EQ(sampler.Sample(h.data(), batch, params.data(), controls.data(), path,
                           {out.tokens.data(), out.logz.data(), out.logprobs.data(), out.details.data()}),
            want);
  return out;
}

std::vector<float> TestLogits() { return testing::ControlsTestLogits(); }

// Samples per call: kRowsPerCall rows (stream = row, offset = call, one seed)
// of kSamplesPerRow samples each; the samples of a row are independent
// (checked on their own below), so all of them count.
constexpr int64_t kSamplesPerRow = 16;

std::vector<int64_t> Counts(const std::vector<float>& logits, float temperature, RowControls c,
                            CpuControlledPath path, int64_t samples, int64_t tile_rows = 8) {
  const int64_t v = static_cast<int64_t>(logits.size());
  const int64_t rows = kRowsPerCall / kSamplesPerRow;
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(logits, 1);
  CpuControlledSampler sampler(sampler_panels.data(), v, v, 1, {kThreads, tile_rows});
  const std::vector<float> h(rows, 1.0f);
  std::vector<RowParams> params(rows);
  c.num_samples = kSamplesPerRow;
  c.sample_stream_stride = static_cast<uint32_t>(rows);
  const std::vector<RowControls> controls(rows, c);
  std::vector<int64_t> counts(v, 0);
  for (int64_t call = 0; call < samples / kRowsPerCall; ++call) {
    for (int64_t r = 0; r < rows; ++r) {
      params[r] = RowParams{temperature, 4242, static_cast<uint64_t>(call), static_cast<uint32_t>(r)};
    }
    const Outputs out = RunSampler(sampler, h, params, controls, path);
    for (const RowSampleDetail& d : out.details) {
      for (int32_t t : d.token_ids) {
        EXPECT_TRUE(t >= 0 && t < v);
        if (t >= 0 && t < v) ++counts[t];
      }
    }
  }
  return counts;
}

using FitCase = testing::ControlsFitCase;

RowControls Controls(int32_t top_k, float top_p, float min_p) {
  return testing::FilterControls(top_k, top_p, min_p);
}

class ControlledSamplerFit : public ::testing::TestWithParam<FitCase> {};

// Power: a 1% relative error (detectable_error = 0.01) in any token with
// p >= 0.05 must shift its count by >= 6 standard deviations; the check
// asserts it at the 2^21 samples of each case.
TEST_P(ControlledSamplerFit, MatchesTheFloat64Reference) {
  const FitCase& fc = GetParam();
  const std::vector<float> logits = TestLogits();
  const testing::ReferenceResult ref =
      testing::ReferenceControlledDistribution(logits, 24, fc.temperature, fc.controls);
  ASSERT_GT(ref.margin, 1e-3) << "inputs too close to a filter boundary for an fp32 / float64 comparison";
  std::vector<CpuControlledPath> paths = {CpuControlledPath::kMaterialized};
  if (PlanCpuControlledPath(&fc.controls, 1) == CpuControlledPath::kFused) {
    paths.push_back(CpuControlledPath::kFused);
  }
  for (CpuControlledPath path : paths) {
    SCOPED_TRACE(path == CpuControlledPath::kFused ? "fused" : "materialized");
    testing::ExpectCountsMatch(Counts(logits, fc.temperature, fc.controls, path, int64_t{1} << 21), ref.probs,
                               /*required_shift=*/6.0, /*detectable_error=*/0.01);
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryControl, ControlledSamplerFit,
    ::testing::ValuesIn(testing::EveryControlFitCase()),
    [](const ::testing::TestParamInfo<FitCase>& info) { return info.param.name; });

// Random W [500, 16] and H; 48 rows, each with its own random controls that
// the fused path serves (1 <= top_k <= 64), greedy rows included.
struct RandomBatch {
  std::vector<float> w, h;
  std::vector<RowParams> params;
  std::vector<RowControls> controls;
};

RandomBatch MakeRandomBatch(int64_t vocab, int64_t hidden, int64_t rows, uint32_t seed) {
  RandomBatch b;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.6f);
  b.w.resize(vocab * hidden);
  b.h.resize(rows * hidden);
  for (float& x : b.w) x = normal(rng);
  for (float& x : b.h) x = normal(rng);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    b.params.push_back(RowParams{r % 7 == 0 ? 0.0f : 0.3f + 1.5f * unit(rng), static_cast<uint64_t>(1000 + r),
                                 static_cast<uint64_t>(r), static_cast<uint32_t>(r % 3)});
    RowControls c;
    c.top_k = 1 + static_cast<int32_t>(rng() % 64);
    if (r % 2 == 0) c.top_p = 0.3f + 0.7f * unit(rng);
    if (r % 3 == 0) c.min_p = 0.2f * unit(rng);
    if (r % 4 == 0) {
      c.repetition_penalty = 1.2f;
      c.frequency_penalty = 0.5f;
      c.presence_penalty = -0.3f;
      for (int i = 0; i < 20; ++i) c.output_token_ids.push_back(token(rng));
      for (int i = 0; i < 20; ++i) c.prompt_token_ids.push_back(token(rng));
    }
    if (r % 5 == 0) {
      c.logit_bias = {{token(rng), 3.0f}, {token(rng) / 2 * 2 + 1, -2.0f}};
      c.banned_token_ids = {token(rng), token(rng)};
      c.allowed_bitmask.assign((vocab + 31) / 32, 0xF0F0F0F7u);
    }
    c.top_logprobs = static_cast<int32_t>(r % 6);
    c.num_samples = 1 + static_cast<int32_t>(r % 3);
    c.sample_stream_stride = 3;
    b.controls.push_back(c);
  }
  return b;
}

void ExpectSameOutputs(const Outputs& a, const Outputs& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  for (size_t r = 0; r < a.tokens.size(); ++r) {
    SCOPED_TRACE(r);
    EXPECT_EQ(a.logz[r], b.logz[r]);
    EXPECT_EQ(a.logprobs[r], b.logprobs[r]);
    EXPECT_EQ(a.details[r].token_ids, b.details[r].token_ids);
    EXPECT_EQ(a.details[r].logprobs, b.details[r].logprobs);
    EXPECT_EQ(a.details[r].ranks, b.details[r].ranks);
    ASSERT_EQ(a.details[r].top.size(), b.details[r].top.size());
    for (size_t i = 0; i < a.details[r].top.size(); ++i) {
      EXPECT_EQ(a.details[r].top[i].token_id, b.details[r].top[i].token_id);
      EXPECT_EQ(a.details[r].top[i].logprob, b.details[r].top[i].logprob);
    }
  }
}

TEST(ControlledSampler, FusedAndMaterializedPathsAgreeBitForBit) {
  const int64_t vocab = 500, hidden = 16, rows = 48;
  const RandomBatch b = MakeRandomBatch(vocab, hidden, rows, 5);
  ASSERT_EQ(PlanCpuControlledPath(b.controls.data(), rows), CpuControlledPath::kFused);
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(b.w, hidden);
  CpuControlledSampler sampler(sampler_panels.data(), vocab, vocab, hidden, {kThreads, 64});
  const Outputs fused = RunSampler(sampler, b.h, b.params, b.controls, CpuControlledPath::kFused);
  const Outputs materialized = RunSampler(sampler, b.h, b.params, b.controls, CpuControlledPath::kMaterialized);
  ExpectSameOutputs(fused, materialized);
  // The thread count changes neither path: every sgemm keeps its shape, only
  // the worker making it changes. (The tile size is not part of this check:
  // it changes the sgemm shapes, and OpenBLAS 0.3.21's Haswell kernels round
  // some elements of [rows, 96] tiles differently from [rows, 64] ones.)
  const std::vector<float> one_thread_panels = testing::TokenPanelsOf(b.w, hidden);
  CpuControlledSampler one_thread(one_thread_panels.data(), vocab, vocab, hidden, {1, 64});
  ExpectSameOutputs(fused, RunSampler(one_thread, b.h, b.params, b.controls, CpuControlledPath::kFused));
}

// Exact integer-valued logits with ties, so greedy argmax is unambiguous up
// to the lower-id rule.
std::vector<float> TiedIntegerLogits(int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-4, 4);
  std::vector<float> l(vocab);
  for (float& x : l) x = static_cast<float>(d(rng));
  return l;
}

TEST(ControlledSampler, TopKOneIsGreedy) {
  const int64_t vocab = 300, rows = 256;
  const std::vector<float> logits = TiedIntegerLogits(vocab, 3);
  const std::vector<float> h(rows, 1.0f);
  std::vector<RowParams> sampled(rows), greedy(rows);
  for (int64_t r = 0; r < rows; ++r) {
    sampled[r] = RowParams{0.5f + 0.01f * r, 9u, static_cast<uint64_t>(r), static_cast<uint32_t>(r)};
    greedy[r] = RowParams{0.0f, 9u, 0, 0};
  }
  const std::vector<float> plain_panels = testing::TokenPanelsOf(logits, 1);
  CpuTiledSampler plain(plain_panels.data(), vocab, vocab, 1, {kThreads, 64});
  std::vector<int32_t> want(rows);
  ASSERT_EQ(plain.Sample(h.data(), rows, greedy.data(), {want.data()}), KernelStatus::kOk);
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(logits, 1);
  CpuControlledSampler sampler(sampler_panels.data(), vocab, vocab, 1, {kThreads, 64});
  const std::vector<RowControls> top1(rows, Controls(1, 1.0f, 0.0f));
  for (CpuControlledPath path : {CpuControlledPath::kFused, CpuControlledPath::kMaterialized}) {
    EXPECT_EQ(RunSampler(sampler, h, sampled, top1, path).tokens, want);
  }
}

TEST(ControlledSampler, NeutralTopPAndMinPChangeNothing) {
  const int64_t vocab = 300, rows = 512;
  const std::vector<float> logits = TiedIntegerLogits(vocab, 4);
  const std::vector<float> h(rows, 1.0f);
  std::vector<RowParams> params(rows);
  for (int64_t r = 0; r < rows; ++r) {
    params[r] = RowParams{r % 5 == 0 ? 0.0f : 0.9f, 31u, 2u, static_cast<uint32_t>(r)};
  }
  const std::vector<float> plain_panels = testing::TokenPanelsOf(logits, 1);
  CpuTiledSampler plain(plain_panels.data(), vocab, vocab, 1, {kThreads, 64});
  std::vector<int32_t> want(rows);
  std::vector<float> want_logz(rows);
  ASSERT_EQ(plain.Sample(h.data(), rows, params.data(), {want.data(), want_logz.data()}), KernelStatus::kOk);
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(logits, 1);
  CpuControlledSampler sampler(sampler_panels.data(), vocab, vocab, 1, {kThreads, 64});
  RowControls neutral = Controls(0, 1.0f, 0.0f);
  neutral.top_logprobs = 1;  // a control, so the row takes the controlled path
  const Outputs out = RunSampler(sampler, h, params, std::vector<RowControls>(rows, neutral),
                          CpuControlledPath::kMaterialized);
  EXPECT_EQ(out.tokens, want);
  for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(out.logz[r], want_logz[r], 1e-5f);
  // top_k >= V keeps everything too.
  const Outputs all_k = RunSampler(sampler, h, params, std::vector<RowControls>(rows, Controls(vocab, 1.0f, 0.0f)),
                            CpuControlledPath::kMaterialized);
  EXPECT_EQ(all_k.tokens, want);
}

// Six tokens tie at the top-k boundary, spread over tiles of 4 tokens and
// both workers; top_k = 4 keeps the best token and the three lowest-id tied ones.
TEST(ControlledSampler, TopKBoundaryTiesGoToTheLowerId) {
  std::vector<float> logits(40, -3.0f);
  logits[17] = 2.0f;
  for (int t : {3, 9, 21, 26, 30, 38}) logits[t] = 1.0f;
  const std::set<int32_t> kept = {17, 3, 9, 21};
  const int64_t rows = 4096;
  const std::vector<float> h(rows, 1.0f);
  std::vector<RowParams> params(rows);
  for (int64_t r = 0; r < rows; ++r) params[r] = RowParams{3.0f, 5u, 0, static_cast<uint32_t>(r)};
  RowControls c = Controls(4, 1.0f, 0.0f);
  c.top_logprobs = 6;
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(logits, 1);
  CpuControlledSampler sampler(sampler_panels.data(), 40, 40, 1, {kThreads, 4});
  for (CpuControlledPath path : {CpuControlledPath::kFused, CpuControlledPath::kMaterialized}) {
    const Outputs out = RunSampler(sampler, h, params, std::vector<RowControls>(rows, c), path);
    std::set<int32_t> seen(out.tokens.begin(), out.tokens.end());
    EXPECT_EQ(seen, kept);
    // The top list has only the 4 kept tokens, tied ones by id.
    ASSERT_EQ(out.details[0].top.size(), 4u);
    EXPECT_EQ(out.details[0].top[0].token_id, 17);
    EXPECT_EQ(out.details[0].top[1].token_id, 3);
    EXPECT_EQ(out.details[0].top[2].token_id, 9);
    EXPECT_EQ(out.details[0].top[3].token_id, 21);
  }
}

TEST(ControlledSampler, RowWithEveryTokenMaskedFailsPrecondition) {
  const std::vector<float> logits = TestLogits();
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(logits, 1);
  CpuControlledSampler sampler(sampler_panels.data(), 24, 24, 1, {kThreads, 8});
  RowControls masked;
  masked.allowed_bitmask = {1u << 3};
  masked.banned_token_ids = {3};
  const std::vector<float> h(2, 1.0f);
  const std::vector<RowParams> params(2, RowParams{1.0f, 1, 0, 0});
  for (CpuControlledPath path : {CpuControlledPath::kMaterialized}) {
    RunSampler(sampler, h, params, {RowControls{}, masked}, path, KernelStatus::kFailedPrecondition);
  }
  masked.top_k = 2;
  RunSampler(sampler, h, params, {Controls(3, 1.0f, 0.0f), masked}, CpuControlledPath::kFused,
      KernelStatus::kFailedPrecondition);
}

// The joint distribution of samples 0 and 1 of each row is p_i * p_j, and
// sample 0 is the token the row gets with num_samples = 1.
TEST(ControlledSampler, SamplesOfARowAreIndependentAndSampleZeroIsTheSingleSample) {
  const std::vector<float> logits = TestLogits();
  const RowControls single = Controls(4, 1.0f, 0.0f);
  RowControls pair = single;
  pair.num_samples = 2;
  const testing::ReferenceResult ref = testing::ReferenceControlledDistribution(logits, 24, 1.0f, single);
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(logits, 1);
  CpuControlledSampler sampler(sampler_panels.data(), 24, 24, 1, {kThreads, 8});
  const std::vector<float> h(kRowsPerCall, 1.0f);
  std::vector<RowParams> params(kRowsPerCall);
  std::vector<int64_t> joint(24 * 24, 0);
  std::vector<double> joint_probs(24 * 24);
  for (int i = 0; i < 24; ++i) {
    for (int j = 0; j < 24; ++j) joint_probs[i * 24 + j] = ref.probs[i] * ref.probs[j];
  }
  for (int64_t call = 0; call < 16; ++call) {
    for (int64_t r = 0; r < kRowsPerCall; ++r) {
      params[r] = RowParams{1.0f, 99u, static_cast<uint64_t>(call), static_cast<uint32_t>(r)};
    }
    std::vector<RowControls> controls(kRowsPerCall, pair);
    for (RowControls& c : controls) c.sample_stream_stride = kRowsPerCall;
    const Outputs two = RunSampler(sampler, h, params, controls, CpuControlledPath::kFused);
    if (call == 0) {
      const Outputs one = RunSampler(sampler, h, params, std::vector<RowControls>(kRowsPerCall, single),
                              CpuControlledPath::kFused);
      EXPECT_EQ(two.tokens, one.tokens);
    }
    for (const RowSampleDetail& d : two.details) ++joint[d.token_ids[0] * 24 + d.token_ids[1]];
  }
  // 2^20 pairs; the heads' cells (p ~ 0.1) carry the 2% power check (the 1%
  // standard applies to the per-control cases, which count every sample).
  testing::ExpectCountsMatch(joint, joint_probs);
}

TEST(ControlledSampler, TopLogprobsAndRanksInBothModes) {
  const std::vector<float> logits = TestLogits();
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(logits, 1);
  CpuControlledSampler sampler(sampler_panels.data(), 24, 24, 1, {kThreads, 8});
  RowControls c = Controls(0, 0.9f, 0.0f);
  c.logit_bias = {{20, 1.0f}};
  c.top_logprobs = 5;
  c.num_samples = 8;
  const std::vector<float> h(1, 1.0f);
  const std::vector<RowParams> params = {RowParams{1.2f, 3u, 0, 0}};
  const testing::ReferenceResult ref = testing::ReferenceControlledDistribution(logits, 24, 1.2f, c);
  {
    const Outputs out = RunSampler(sampler, h, params, {c}, CpuControlledPath::kMaterialized);
    const RowSampleDetail& d = out.details[0];
    EXPECT_NEAR(out.logz[0], ref.logz, 1e-5);
    std::vector<int> order;
    for (int i = 0; i < 24; ++i) {
      if (ref.probs[i] > 0) order.push_back(i);
    }
    std::sort(order.begin(), order.end(), [&](int a, int b) { return ref.probs[a] > ref.probs[b]; });
    ASSERT_EQ(d.top.size(), std::min<size_t>(5, order.size()));
    for (size_t i = 0; i < d.top.size(); ++i) {
      EXPECT_EQ(d.top[i].token_id, order[i]);
      EXPECT_NEAR(d.top[i].logprob, std::log(ref.probs[order[i]]), 1e-5);
    }
    ASSERT_EQ(d.token_ids.size(), 8u);
    for (size_t j = 0; j < 8; ++j) {
      const int32_t t = d.token_ids[j];
      EXPECT_GT(ref.probs[t], 0.0);
      EXPECT_NEAR(d.logprobs[j], std::log(ref.probs[t]), 1e-5);
      int rank = 0;
      for (int i = 0; i < 24; ++i) rank += ref.probs[i] > 0 && ref.probs[i] >= ref.probs[t] ? 1 : 0;
      EXPECT_EQ(d.ranks[j], rank);
    }
    EXPECT_EQ(out.logprobs[0], d.logprobs[0]);
  }
  {
    c.logprobs_mode = LogprobsMode::kRaw;
    const Outputs out = RunSampler(sampler, h, params, {c}, CpuControlledPath::kMaterialized);
    const RowSampleDetail& d = out.details[0];
    const testing::ReferenceResult raw = testing::ReferenceControlledDistribution(logits, 24, 1.0f, RowControls{});
    std::vector<int> order(24);
    for (int i = 0; i < 24; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return raw.probs[a] > raw.probs[b]; });
    ASSERT_EQ(d.top.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(d.top[i].token_id, order[i]);
      EXPECT_NEAR(d.top[i].logprob, std::log(raw.probs[order[i]]), 1e-5);
    }
    for (size_t j = 0; j < 8; ++j) {
      const int32_t t = d.token_ids[j];
      EXPECT_NEAR(d.logprobs[j], std::log(raw.probs[t]), 1e-5);
      int rank = 0;
      for (int i = 0; i < 24; ++i) rank += raw.probs[i] >= raw.probs[t] ? 1 : 0;
      EXPECT_EQ(d.ranks[j], rank);
    }
    // Raw mode needs the whole row: the planner never sends it to kFused.
    c.top_k = 5;
    EXPECT_EQ(PlanCpuControlledPath(&c, 1), CpuControlledPath::kMaterialized);
  }
}

TEST(ControlledSampler, RejectsBadArguments) {
  const std::vector<float> logits = TestLogits();
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(logits, 1);
  CpuControlledSampler sampler(sampler_panels.data(), 24, 24, 1, {kThreads, 8});
  const std::vector<float> h(1, 1.0f);
  const std::vector<RowParams> params = {RowParams{1.0f, 1, 0, 0}};
  // kFused for a row it cannot serve.
  RunSampler(sampler, h, params, {Controls(0, 0.5f, 0.0f)}, CpuControlledPath::kFused, KernelStatus::kInvalidArgument);
  RunSampler(sampler, h, params, {Controls(65, 1.0f, 0.0f)}, CpuControlledPath::kFused, KernelStatus::kInvalidArgument);
  // Controls outside their contract.
  RowControls bad = Controls(0, 1.5f, 0.0f);
  RunSampler(sampler, h, params, {bad}, CpuControlledPath::kMaterialized, KernelStatus::kInvalidArgument);
  bad = RowControls{};
  bad.banned_token_ids = {24};
  RunSampler(sampler, h, params, {bad}, CpuControlledPath::kMaterialized, KernelStatus::kInvalidArgument);
  bad = RowControls{};
  bad.allowed_bitmask = {};
  bad.num_samples = 0;
  RunSampler(sampler, h, params, {bad}, CpuControlledPath::kMaterialized, KernelStatus::kInvalidArgument);
}

}  // namespace
}  // namespace flashsampler::kernels
