// Tests of kernels/cuda/fused_controlled_sample.h (ctest label `gpu`): the
// fused controlled path against the float64 reference (every fit case it
// serves, plus a top-k above the per-tile candidate count spread over many
// tiles), against the CPU backend and against the materialized path on
// random rows it serves (ties included) and at every kind of top-k cut that
// stage 2's selections meet, and the edge cases: top_k = 1 is
// greedy, top-k boundary ties go to the lower id, a tile holding more of the
// top-k than it keeps reports row_status 2 (the caller's fallback), rows it
// does not serve report 2, a fully masked row reports 1, bad arguments; and
// stage 1's tile-head bound: tiles stop writing candidates only below the
// row's 64th best, and do stop.
//
// Heads are [vocab, 16] bf16 with the logit's factor in column 0 and zeros
// elsewhere, H [rows, 16] the same: every dot is one exact bf16 x bf16
// product, so the tensor cores, cuBLAS and the CPU see bit-identical logits.
#include "kernels/cuda/fused_controlled_sample.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/candidate_order_key.h"
#include "kernels/cuda/controlled_sample.h"
#include "tests/common/controls_fit_cases.h"
#include "tests/common/controls_reference.h"
#include "tests/common/goodness_of_fit.h"
#include "tests/gpu/controls_test_problems.h"
#include "tests/gpu/gpu_test_util.h"

namespace flashsampler::kernels {
namespace {

using controls_test::Bf16Bits;
using controls_test::ExpectAgrees;
using controls_test::MakeRandomProblem;
using controls_test::Outputs;
using controls_test::RandomProblem;
using controls_test::RoundToBf16;
using controls_test::RunCpu;
using gpu_test::DeviceBuffer;
using gpu_test::GpuTest;

constexpr int64_t kDim = 16;

enum class Path { kFused, kMaterialized };

// A problem on the device: the head and the rows as kDim-wide columns (w and
// h must be bf16 values, RoundToBf16), the flattened controls, the outputs
// and a workspace for `path`; args points at all of them.
struct DeviceProblem {
  DeviceProblem(const std::vector<float>& w, const std::vector<float>& h,
                const std::vector<RowParams>& params, const std::vector<RowControls>& controls, Path path) {
    const int64_t vocab = static_cast<int64_t>(w.size());
    const int64_t rows = static_cast<int64_t>(h.size());
    EXPECT_EQ(FlattenControls(controls.data(), rows, vocab, vocab, &flat), KernelStatus::kOk);
    std::vector<uint8_t> packed(flat.PackedBytes());
    flat.PackTo(packed.data());
    std::vector<uint16_t> w16(vocab * kDim, 0);
    for (int64_t v = 0; v < vocab; ++v) w16[v * kDim] = Bf16Bits(w[v]);
    std::vector<float> h16(rows * kDim, 0.0f);
    for (int64_t r = 0; r < rows; ++r) h16[r * kDim] = h[r];
    dw.Allocate(w16.size());
    dh.Allocate(h16.size());
    dp.Allocate(params.size());
    dc.Allocate(packed.size());
    dw.Upload(w16);
    dh.Upload(h16);
    dp.Upload(params);
    dc.Upload(packed);
    outputs = std::make_unique<controls_test::DeviceOutputs>(rows, flat.total_samples);
    const size_t ws = path == Path::kFused
                          ? FusedControlledWorkspaceBytes(rows, vocab, kDim)
                          : ControlledSampleWorkspaceBytes(rows, vocab, kDim, CudaWeightDType::kBFloat16);
    EXPECT_GT(ws, 0u);
    workspace.Allocate(ws);
    args.weight = dw.data();
    args.weight_dtype = CudaWeightDType::kBFloat16;
    args.hidden = dh.data();
    args.params = dp.data();
    args.batch = rows;
    args.vocab = args.valid_vocab = vocab;
    args.hidden_dim = kDim;
    args.controls = flat.DeviceView(dc.data());
    args.outputs = outputs->View();
    args.workspace = workspace.data();
    args.workspace_bytes = ws;
  }
  FlatControls flat;
  DeviceBuffer<uint16_t> dw;
  DeviceBuffer<float> dh;
  DeviceBuffer<RowParams> dp;
  DeviceBuffer<uint8_t> dc;
  std::unique_ptr<controls_test::DeviceOutputs> outputs;
  DeviceBuffer<uint8_t> workspace;
  ControlledSampleArgs args;
};

class FusedControlledSampleTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_EQ(cublasCreate(&cublas_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (cublas_ != nullptr) cublasDestroy(cublas_);
  }

  Outputs Run(const std::vector<float>& w, const std::vector<float>& h,
              const std::vector<RowParams>& params, const std::vector<RowControls>& controls,
              Path path = Path::kFused, Stage1Kernel stage1 = Stage1Kernel::kAuto) {
    Outputs out;
    DeviceProblem problem(w, h, params, controls, path);
    ControlledSampleArgs& a = problem.args;
    a.stage1 = stage1;
    out.launch = path == Path::kFused ? LaunchFusedControlledSample(a, nullptr)
                                      : LaunchControlledSample(a, cublas_, nullptr);
    const cudaError_t sync = cudaDeviceSynchronize();
    EXPECT_EQ(sync, cudaSuccess) << cudaGetErrorString(sync);
    if (out.launch != KernelStatus::kOk || sync != cudaSuccess) return out;
    problem.outputs->Download(problem.flat, a.batch, &out);
    return out;
  }

  cublasHandle_t cublas_ = nullptr;
};

std::vector<float> Bf16Logits() {
  std::vector<float> l = testing::ControlsTestLogits();
  for (float& x : l) x = RoundToBf16(x);
  return l;
}

// ---- Goodness of fit against the float64 reference ---------------------------
// The CPU suite's cases this path serves, plus "SpreadTopK20": the 24 test
// logits on tokens 128 i + 5 of a 3072-token head (one per tile, the rest
// outside the bitmask), top_k = 20 > kFusedTileCandidates, without and with
// top_p: the global top-k is merged from 20 tiles.
struct FusedFitCase {
  testing::ControlsFitCase base;
  bool spread = false;
  bool background = false;  // spread over finite background tokens, not a bitmask
};
void PrintTo(const FusedFitCase& c, std::ostream* os) { *os << c.base.name; }

std::vector<FusedFitCase> FusedFitCases() {
  std::vector<FusedFitCase> cases;
  for (const testing::ControlsFitCase& c : testing::EveryControlFitCase()) {
    const bool candidates = c.controls.top_k >= 1 && c.controls.top_k <= kFusedMaxTopK;
    if (candidates || !HasFilters(c.controls)) cases.push_back({c, false});
  }
  cases.push_back({{"SpreadTopK20", 1.0f, testing::FilterControls(20, 1.0f, 0.0f)}, true});
  // top_p = 0.93 keeps 8 of the 20; its cut is 0.3% of the mass away from the
  // nearest token boundary (the reference's margin), well clear of rounding.
  cases.push_back({{"SpreadTopK20TopP", 1.0f, testing::FilterControls(20, 0.93f, 0.0f)}, true});
  // The same 24 logits over a background of finite tokens in every one of
  // 200 tiles (-30 to -30.875): more tiles than kHeadSlots, so the tile-head
  // bound rises above most of the background and the tiles' rounds stop
  // early (fused_controls.cuh); the distribution must not move.
  cases.push_back({{"SpreadTopK20OverBackground", 1.0f, testing::FilterControls(20, 0.93f, 0.0f)}, true, true});
  return cases;
}

class FusedControlledSampleFit : public FusedControlledSampleTest,
                                 public ::testing::WithParamInterface<FusedFitCase> {};

// 2^21 samples per case. Candidate rows (top_k set): 8 launches of 4096 rows
// x 64 samples (stream = row, stride = rows, offset = launch). Summary rows
// take one sample per row: 32 launches of 65536 rows. Power as in the
// materialized suite (asserted by ExpectCountsMatch).
TEST_P(FusedControlledSampleFit, MatchesTheFloat64Reference) {
  const FusedFitCase& fc = GetParam();
  const std::vector<float> base = Bf16Logits();
  std::vector<float> logits = base;
  RowControls c = fc.base.controls;
  if (fc.spread && fc.background) {
    logits.assign(200 * 128, 0.0f);
    for (size_t v = 0; v < logits.size(); ++v) logits[v] = -30.0f - 0.125f * static_cast<float>(v % 8);
    for (int i = 0; i < 24; ++i) logits[128 * i + 5] = base[i];
  } else if (fc.spread) {
    logits.assign(24 * 128, 0.0f);
    c.allowed_bitmask.assign(24 * 128 / 32, 0u);
    for (int i = 0; i < 24; ++i) {
      logits[128 * i + 5] = base[i];
      c.allowed_bitmask[(128 * i + 5) / 32] |= 1u << ((128 * i + 5) % 32);
    }
  }
  const int64_t vocab = static_cast<int64_t>(logits.size());
  const testing::ReferenceResult ref =
      testing::ReferenceControlledDistribution(logits, vocab, fc.base.temperature, c);
  ASSERT_GT(ref.margin, 1e-3);
  const bool candidates = c.top_k >= 1;
  const int64_t rows = candidates ? 4096 : 65536;
  const int32_t samples = candidates ? 64 : 1;
  const int64_t launches = candidates ? 8 : 32;
  c.num_samples = samples;
  c.sample_stream_stride = static_cast<uint32_t>(rows);
  if (!candidates) c.top_logprobs = 0;  // a summary row (the fit is about the tokens)
  const std::vector<RowControls> controls(rows, c);
  const std::vector<float> h(rows, 1.0f);
  std::vector<int64_t> counts(vocab, 0);
  for (int64_t call = 0; call < launches; ++call) {
    std::vector<RowParams> params(rows);
    for (int64_t r = 0; r < rows; ++r) {
      params[r] = RowParams{fc.base.temperature, 4242, static_cast<uint64_t>(call), static_cast<uint32_t>(r)};
    }
    const Outputs out = Run(logits, h, params, controls);
    ASSERT_EQ(out.launch, KernelStatus::kOk);
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_EQ(out.row_status[r], 0) << "row " << r;
      ASSERT_EQ(out.details[r].token_ids.size(), static_cast<size_t>(samples));
      for (int32_t t : out.details[r].token_ids) {
        ASSERT_TRUE(t >= 0 && t < vocab) << t;
        ASSERT_GT(ref.probs[t], 0.0) << "token " << t << " was filtered out";
        ++counts[t];
      }
    }
  }
  testing::ExpectCountsMatch(counts, ref.probs, /*required_shift=*/6.0, /*detectable_error=*/0.01);
}

INSTANTIATE_TEST_SUITE_P(
    ServedControls, FusedControlledSampleFit, ::testing::ValuesIn(FusedFitCases()),
    [](const ::testing::TestParamInfo<FusedFitCase>& info) { return info.param.base.name; });

// ---- Against the CPU backend and the materialized path --------------------------
TEST_F(FusedControlledSampleTest, MatchesTheCpuBackendOnRandomControls) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE(seed);
    const RandomProblem p = MakeRandomProblem(30000, 512, 0.0f, seed, /*fused_only=*/true);
    const Outputs cpu = RunCpu(p.w, p.h, p.params, p.controls);
    ASSERT_EQ(cpu.launch, KernelStatus::kOk);
    const Outputs gpu = Run(p.w, p.h, p.params, p.controls);
    ASSERT_EQ(gpu.launch, KernelStatus::kOk);
    ExpectAgrees(gpu, cpu, p);
  }
}

// Weights on a grid of 1/4: top-k, top-p and top-list boundaries inside
// groups of ties, resolved by the lower id on both backends.
TEST_F(FusedControlledSampleTest, MatchesTheCpuBackendWithHeavyTies) {
  for (uint32_t seed : {11u, 12u}) {
    SCOPED_TRACE(seed);
    const RandomProblem p = MakeRandomProblem(30000, 512, 0.25f, seed, /*fused_only=*/true);
    const Outputs cpu = RunCpu(p.w, p.h, p.params, p.controls);
    const Outputs gpu = Run(p.w, p.h, p.params, p.controls);
    ASSERT_EQ(gpu.launch, KernelStatus::kOk);
    ExpectAgrees(gpu, cpu, p);
  }
}

// Where both paths apply they sample the same tokens with the same details.
TEST_F(FusedControlledSampleTest, MatchesTheMaterializedPath) {
  for (uint32_t seed : {21u, 22u}) {
    SCOPED_TRACE(seed);
    const RandomProblem p = MakeRandomProblem(20000, 300, seed == 22u ? 0.25f : 0.0f, seed, true);
    const Outputs fused = Run(p.w, p.h, p.params, p.controls);
    const Outputs materialized = Run(p.w, p.h, p.params, p.controls, Path::kMaterialized);
    ASSERT_EQ(fused.launch, KernelStatus::kOk);
    ASSERT_EQ(materialized.launch, KernelStatus::kOk);
    ExpectAgrees(fused, materialized, p);
  }
}

// The stage-1 kernels run one epilogue on the same dots (fused_sample_sm90.cu
// gives mma.sync's bits), so every output is the same bit for bit, whichever
// kernel kAuto picks for the batch: 5 rows (mma.sync) and 300 (from 16 rows
// WGMMA on Hopper; above 128 rows at two blocks per SM: three 128-row chunks). Elsewhere than
// on Hopper the WGMMA kernels are refused and only mma.sync and kAuto run.
void ExpectSameBits(const Outputs& a, const Outputs& b) {
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.row_status, b.row_status);
  EXPECT_EQ(0, std::memcmp(a.logz.data(), b.logz.data(), a.logz.size() * sizeof(float)));
  ASSERT_EQ(a.details.size(), b.details.size());
  for (size_t r = 0; r < a.details.size(); ++r) {
    const RowSampleDetail& x = a.details[r];
    const RowSampleDetail& y = b.details[r];
    EXPECT_EQ(x.token_ids, y.token_ids) << "row " << r;
    EXPECT_EQ(x.ranks, y.ranks) << "row " << r;
    ASSERT_EQ(x.logprobs.size(), y.logprobs.size()) << "row " << r;
    EXPECT_EQ(0, std::memcmp(x.logprobs.data(), y.logprobs.data(), x.logprobs.size() * sizeof(float)))
        << "row " << r;
    ASSERT_EQ(x.top.size(), y.top.size()) << "row " << r;
    for (size_t i = 0; i < x.top.size(); ++i) {
      EXPECT_EQ(x.top[i].token_id, y.top[i].token_id) << "row " << r << " top " << i;
      EXPECT_EQ(0, std::memcmp(&x.top[i].logprob, &y.top[i].logprob, sizeof(float)))
          << "row " << r << " top " << i;
    }
  }
}

TEST_F(FusedControlledSampleTest, EveryStage1GivesTheSameBits) {
  const bool hopper = WgmmaStage1Available();
  // 160 rows: two balanced chunks of 80 (HiddenChunks); 300: three of 100.
  for (int64_t rows : {int64_t{5}, int64_t{160}, int64_t{300}}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    const RandomProblem p = MakeRandomProblem(20000, rows, 0.0f, 41 + static_cast<uint32_t>(rows), true);
    const Outputs mma = Run(p.w, p.h, p.params, p.controls, Path::kFused, Stage1Kernel::kMmaSync);
    ASSERT_EQ(mma.launch, KernelStatus::kOk);
    for (const Stage1Kernel k :
         {Stage1Kernel::kAuto, Stage1Kernel::kWgmma, Stage1Kernel::kWgmmaOverlap,
          Stage1Kernel::kWgmmaSeparateEpilogue}) {
      SCOPED_TRACE(::testing::Message() << "stage1 " << static_cast<int>(k));
      const Outputs other = Run(p.w, p.h, p.params, p.controls, Path::kFused, k);
      if (k != Stage1Kernel::kAuto && !hopper) {
        EXPECT_EQ(other.launch, KernelStatus::kInvalidArgument);
        continue;
      }
      ASSERT_EQ(other.launch, KernelStatus::kOk);
      ExpectSameBits(other, mma);
    }
    // Kernels without the controlled epilogue are refused, never substituted.
    for (const Stage1Kernel k : {Stage1Kernel::kCudaCore, Stage1Kernel::kWgmmaPingpong}) {
      EXPECT_EQ(Run(p.w, p.h, p.params, p.controls, Path::kFused, k).launch,
                KernelStatus::kInvalidArgument);
    }
  }
}

// ---- Edge cases ----------------------------------------------------------------------
TEST_F(FusedControlledSampleTest, TopKOneIsGreedy) {
  const RandomProblem p = MakeRandomProblem(20000, 256, 0.0f, 31, true);
  std::vector<RowParams> greedy = p.params;
  for (RowParams& q : greedy) q.temperature = 0.0f;
  const size_t rows = p.h.size();
  const Outputs a = Run(p.w, p.h, p.params, std::vector<RowControls>(rows, testing::FilterControls(1, 1.0f, 0.0f)));
  const Outputs b = Run(p.w, p.h, greedy, std::vector<RowControls>(rows, RowControls{}));  // summary rows
  ASSERT_EQ(a.launch, KernelStatus::kOk);
  ASSERT_EQ(b.launch, KernelStatus::kOk);
  EXPECT_EQ(a.row_status, std::vector<int32_t>(rows, 0));
  EXPECT_EQ(b.row_status, std::vector<int32_t>(rows, 0));
  EXPECT_EQ(a.tokens, b.tokens);
}

// 100 tokens with the same logit in one tile: top_k = 10 keeps ids 0..9
// (every sample lands there, the top list is 0..9 with log(1/10), ranks 10).
TEST_F(FusedControlledSampleTest, TopKBoundaryTiesGoToTheLowerId) {
  std::vector<float> w(100, 0.5f);
  constexpr int64_t kRows = 512;
  RowControls c = testing::FilterControls(10, 1.0f, 0.0f);
  c.top_logprobs = 20;
  c.num_samples = 8;
  c.sample_stream_stride = kRows;
  std::vector<RowParams> params(kRows);
  for (int64_t r = 0; r < kRows; ++r) params[r] = RowParams{1.0f, 99, 0, static_cast<uint32_t>(r)};
  const Outputs out = Run(w, std::vector<float>(kRows, 1.0f), params, std::vector<RowControls>(kRows, c));
  ASSERT_EQ(out.launch, KernelStatus::kOk);
  std::vector<int64_t> counts(100, 0);
  for (int64_t r = 0; r < kRows; ++r) {
    ASSERT_EQ(out.row_status[r], 0);
    for (int32_t t : out.details[r].token_ids) {
      ASSERT_TRUE(t >= 0 && t < 10) << t;
      ++counts[t];
    }
    ASSERT_EQ(out.details[r].top.size(), 10u);
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(out.details[r].top[i].token_id, i);
      EXPECT_NEAR(out.details[r].top[i].logprob, std::log(0.1f), 1e-6f);
    }
    for (int32_t rank : out.details[r].ranks) EXPECT_EQ(rank, 10);
  }
  for (int i = 0; i < 10; ++i) EXPECT_GT(counts[i], 0) << i;  // 4096 draws over 10 tokens
  for (RowParams& q : params) q.temperature = 0.0f;
  const Outputs greedy = Run(w, std::vector<float>(kRows, 1.0f), params, std::vector<RowControls>(kRows, c));
  ASSERT_EQ(greedy.launch, KernelStatus::kOk);
  EXPECT_EQ(greedy.row_status, std::vector<int32_t>(kRows, 0));
  ASSERT_EQ(greedy.tokens.size(), static_cast<size_t>(kRows));
  for (int32_t t : greedy.tokens) EXPECT_EQ(t, 0);
}

// Every token of 40 tiles ties: the top-k tiles and candidates are the lowest
// ids (the stage-2 selections compare l' and give ties to the lower id), for a top_k
// that each tile covers (no saturation), greedy and sampled alike.
TEST_F(FusedControlledSampleTest, TiesAcrossTilesGoToTheLowestIds) {
  constexpr int64_t kVocab = 40 * 128;
  std::vector<float> w(kVocab, 0.5f);
  constexpr int64_t kRows = 64;
  RowControls c = testing::FilterControls(12, 1.0f, 0.0f);
  c.top_logprobs = 12;
  std::vector<RowParams> params(kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    params[r] = RowParams{r % 2 == 0 ? 1.0f : 0.0f, 7, 0, static_cast<uint32_t>(r)};
  }
  const Outputs out = Run(w, std::vector<float>(kRows, 1.0f), params, std::vector<RowControls>(kRows, c));
  ASSERT_EQ(out.launch, KernelStatus::kOk);
  for (int64_t r = 0; r < kRows; ++r) {
    ASSERT_EQ(out.row_status[r], 0) << r;
    ASSERT_EQ(out.details[r].top.size(), 12u) << r;
    for (int i = 0; i < 12; ++i) EXPECT_EQ(out.details[r].top[i].token_id, i) << "row " << r;
    EXPECT_TRUE(out.tokens[r] >= 0 && out.tokens[r] < 12) << "row " << r << ": " << out.tokens[r];
    if (params[r].temperature == 0.0f) {
      EXPECT_EQ(out.tokens[r], 0) << r;
    }
  }
}

// The selected tiles enter the candidate selection in tile order, not in the
// order of their heads: tile 1's head (2.0, id 128) beats tile 0's (1.0),
// and the ties at 1.0 then go to tile 0's lower ids. top_k 4 keeps
// 128, 0, 1, 2 (taking tile 1's 129-131 would be the head order's mistake).
TEST_F(FusedControlledSampleTest, TiedCandidatesOfLaterHeadsGoToLowerTiles) {
  std::vector<float> w(256, 1.0f);
  w[128] = 2.0f;
  constexpr int64_t kRows = 2;
  RowControls c = testing::FilterControls(4, 1.0f, 0.0f);
  c.top_logprobs = 4;
  const std::vector<RowParams> params = {RowParams{1.0f, 3, 0, 0}, RowParams{0.0f, 3, 0, 1}};
  const Outputs out = Run(w, std::vector<float>(kRows, 1.0f), params, std::vector<RowControls>(kRows, c));
  ASSERT_EQ(out.launch, KernelStatus::kOk);
  for (int64_t r = 0; r < kRows; ++r) {
    ASSERT_EQ(out.row_status[r], 0) << r;
    ASSERT_EQ(out.details[r].top.size(), 4u) << r;
    const int32_t want[4] = {128, 0, 1, 2};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.details[r].top[i].token_id, want[i]) << "row " << r << " top " << i;
  }
  EXPECT_EQ(out.tokens[1], 128);  // greedy
  EXPECT_TRUE(out.tokens[0] == 128 || (out.tokens[0] >= 0 && out.tokens[0] <= 2)) << out.tokens[0];
}

// top_k = 40 over 100 tied tokens of one tile: the tile keeps 16 candidates,
// all inside the top 40, so it may hold more: row_status 2 (run the row on
// the materialized path). The same row with top_k = 16 is served.
TEST_F(FusedControlledSampleTest, ATileHoldingMoreOfTheTopKThanItKeepsIsNotServed) {
  std::vector<float> w(1000, -1.0f);
  for (int i = 0; i < 100; ++i) w[i] = 0.5f;
  const std::vector<RowParams> params(2, RowParams{1.0f, 5, 0, 0});
  const Outputs out = Run(w, std::vector<float>(2, 1.0f), params,
                          {testing::FilterControls(40, 1.0f, 0.0f), testing::FilterControls(16, 1.0f, 0.0f)});
  ASSERT_EQ(out.launch, KernelStatus::kOk);
  EXPECT_EQ(out.row_status, (std::vector<int32_t>{kFusedRowNotServed, 0}));
  EXPECT_TRUE(out.tokens[1] >= 0 && out.tokens[1] < 16) << out.tokens[1];
}

// Rows this path does not serve report row_status 2; the others in the same
// batch are served.
TEST_F(FusedControlledSampleTest, RowsItDoesNotServeReportStatusTwo) {
  const std::vector<float> w = Bf16Logits();
  RowControls raw_mode = testing::FilterControls(5, 1.0f, 0.0f);
  raw_mode.top_logprobs = 3;
  raw_mode.logprobs_mode = LogprobsMode::kRaw;
  RowControls two_samples;
  two_samples.num_samples = 2;
  RowControls top_list;
  top_list.top_logprobs = 1;
  const std::vector<RowControls> controls = {
      testing::FilterControls(0, 0.9f, 0.0f), testing::FilterControls(0, 1.0f, 0.1f),
      testing::FilterControls(65, 1.0f, 0.0f), raw_mode, two_samples, top_list,
      testing::FilterControls(3, 0.9f, 0.05f), RowControls{}};
  const std::vector<RowParams> params(controls.size(), RowParams{1.0f, 1, 0, 0});
  const Outputs out = Run(w, std::vector<float>(controls.size(), 1.0f), params, controls);
  ASSERT_EQ(out.launch, KernelStatus::kOk);
  EXPECT_EQ(out.row_status, (std::vector<int32_t>{2, 2, 2, 2, 2, 2, 0, 0}));
  for (size_t r = 0; r < controls.size(); ++r) {
    ControlledRowDesc d;
    d.top_k = controls[r].top_k;
    d.top_p = controls[r].top_p;
    d.min_p = controls[r].min_p;
    d.top_logprobs = controls[r].top_logprobs;
    d.logprobs_mode = static_cast<int32_t>(controls[r].logprobs_mode);
    d.num_samples = controls[r].num_samples;
    EXPECT_EQ(FusedRowKindOf(d) == kFusedUnservedRow, out.row_status[r] == 2) << r;
  }
  EXPECT_TRUE(out.tokens[6] == 0 || out.tokens[6] == 13 || out.tokens[6] == 23);
}

// Row 1 has every token masked (candidate row), row 2 too (summary row):
// row_status 1 there, rows 0 and 3 are served.
TEST_F(FusedControlledSampleTest, RowWithEveryTokenMaskedReportsItsStatus) {
  const std::vector<float> w = Bf16Logits();
  RowControls masked = testing::FilterControls(3, 1.0f, 0.0f);
  masked.allowed_bitmask = {1u << 3};
  masked.banned_token_ids = {3};
  RowControls masked_plain;
  masked_plain.allowed_bitmask = {0u};
  const std::vector<RowParams> params(4, RowParams{1.0f, 1, 0, 0});
  const Outputs out = Run(w, std::vector<float>(4, 1.0f), params,
                          {testing::FilterControls(3, 1.0f, 0.0f), masked, masked_plain, RowControls{}});
  ASSERT_EQ(out.launch, KernelStatus::kOk);
  EXPECT_EQ(out.row_status, (std::vector<int32_t>{0, 1, 1, 0}));
  EXPECT_TRUE(out.tokens[0] == 0 || out.tokens[0] == 13 || out.tokens[0] == 23);
  EXPECT_TRUE(out.tokens[3] >= 0 && out.tokens[3] < 24);
}

// Stage 2's two selections (the top_k tiles by head, then the best top_k of
// their candidates: radix selects, fused_controlled_sample.cu) at every kind
// of cut, against the CPU backend, whole top lists compared: rows whose
// bitmask allows top_k - 1, top_k, top_k + 1 or 3 top_k tokens (fewer
// non-empty keys than k, exactly k, one more, many) in one tile, one a tile
// or four a tile over 160 tiles (so the second selection too has more than
// k keys), for top_k 1, 5, 12, 16 and 64 (64 spread only, and 3 x 64 four a
// tile: a tile then holds fewer tokens than it may write, so none is full
// and every row is served), greedy and sampled. Three heads: weights on a
// grid of 1/4 (ties across the cut, resolved by the lower id; asserted to
// occur), continuous weights, and the grid with a per-token bias of
// j 2^-23 (keys that tie in their high bytes and differ in the lowest one,
// so the select runs all four rounds).
TEST_F(FusedControlledSampleTest, TopKCutsMatchTheCpuBackend) {
  constexpr int64_t kTiles = 160;
  constexpr int64_t kVocab = kTiles * 128;
  enum class Head { kGrid, kContinuous, kGridWithLowBits };
  for (const Head head : {Head::kGrid, Head::kContinuous, Head::kGridWithLowBits}) {
    SCOPED_TRACE(::testing::Message() << "head " << static_cast<int>(head));
    RandomProblem p;
    std::mt19937 rng(501u + static_cast<uint32_t>(head));
    std::normal_distribution<float> normal(0.0f, 2.0f);
    p.w.resize(kVocab);
    for (float& x : p.w) {
      x = RoundToBf16(head == Head::kContinuous ? normal(rng) : 0.25f * std::floor(4.0f * normal(rng)));
    }
    int64_t rows_tied_at_the_cut = 0;
    for (const int32_t k : {1, 5, 12, 16, 64}) {
      for (const int32_t n : {k - 1, k, k + 1, 3 * k}) {
        for (const int per_tile : {128, 1, 4}) {  // 128: all in one tile
          if (n < 1 || (per_tile == 128 && (k > kFusedTileCandidates || n > 128)) ||
              (per_tile != 128 && (n + per_tile - 1) / per_tile > kTiles)) {
            continue;
          }
          for (const float temperature : {0.0f, 0.7f, 1.3f}) {
            RowControls c = testing::FilterControls(k, 1.0f, 0.0f);
            c.top_logprobs = std::min<int32_t>(k, kMaxTopLogprobs);
            c.allowed_bitmask.assign(kVocab / 32, 0u);
            const int64_t t0 = static_cast<int64_t>(p.h.size()) % kTiles;
            std::vector<float> allowed;
            for (int32_t j = 0; j < n; ++j) {
              const int64_t token = per_tile == 128 ? 128 * t0 + (5 * j) % 128
                                    : per_tile == 1 ? 128 * j + (37 * j) % 128
                                                    : 128 * (j / 4) + 32 * (j % 4) + (j / 4) % 32;
              c.allowed_bitmask[token >> 5] |= 1u << (token & 31);
              float bias = 0.0f;
              if (head == Head::kGridWithLowBits) {
                bias = std::ldexp(static_cast<float>(j), -23);
                c.logit_bias.emplace_back(static_cast<int32_t>(token), bias);
              }
              allowed.push_back(p.w[token] + bias);
            }
            std::sort(allowed.begin(), allowed.end(), std::greater<float>());
            if (n > k && allowed[k - 1] == allowed[k]) ++rows_tied_at_the_cut;
            const uint32_t row = static_cast<uint32_t>(p.h.size());
            p.params.push_back(RowParams{temperature, 77, 0, row});
            p.controls.push_back(c);
            p.h.push_back(1.0f);
          }
        }
      }
    }
    if (head == Head::kGrid) {
      EXPECT_GT(rows_tied_at_the_cut, 0) << "no row ties at its k-th token";
    }
    const Outputs cpu = RunCpu(p.w, p.h, p.params, p.controls);
    ASSERT_EQ(cpu.launch, KernelStatus::kOk);
    const Outputs gpu = Run(p.w, p.h, p.params, p.controls);
    ASSERT_EQ(gpu.launch, KernelStatus::kOk);
    ExpectAgrees(gpu, cpu, p);
  }
}

// ---- The tile-head bound (fused_controls.cuh, kHeadSlots) ---------------------------
// Stage 1 alone over 2048 tiles (the largest head the path takes) of
// N(0, 2^2) logits, 24 rows with top_k 50,
// 64, 16 and 1, on every stage 1: each tile writes a prefix of its tokens in
// canonical order (bit for bit against the host), and where it stops short
// of m = min(top_k, 16) its next token ranks after the row's 64th best (so
// the top-k is whole). And the bound does stop rounds: the tiles write fewer
// candidates than their unpruned m best (every tile has 128 finite tokens,
// so without the bound each writes m; tiles that run after 64 slots hold
// heads stop early, and 2048 tiles are several waves of blocks on any GPU).
struct HostCandidate {
  float logit;
  int32_t id;
};
static_assert(sizeof(HostCandidate) == 8, "FusedCandidate's layout");

TEST_F(FusedControlledSampleTest, TilesStopAtTheTileHeadBound) {
  ASSERT_EQ(FusedControlledTileCandidateBytes(), kFusedTileCandidates * sizeof(HostCandidate));
  constexpr int64_t kVocab = kFusedMaxVocab;
  constexpr int64_t kRows = 24;
  std::mt19937 rng(77);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> w(kVocab);
  for (float& x : w) x = RoundToBf16(normal(rng));
  std::vector<float> h(kRows);
  std::vector<RowControls> controls(kRows);
  const int32_t top_ks[4] = {50, 64, 16, 1};
  for (int64_t r = 0; r < kRows; ++r) {
    h[r] = RoundToBf16(0.5f + 0.0625f * static_cast<float>(r));  // exact products in fp32
    controls[r] = testing::FilterControls(top_ks[r % 4], 1.0f, 0.0f);
  }
  const std::vector<RowParams> params(kRows, RowParams{1.0f, 9, 0, 0});
  DeviceProblem problem(w, h, params, controls, Path::kFused);
  ControlledSampleArgs& a = problem.args;
  const FusedControlledTiles t = FusedControlledTilesIn(a.workspace, kRows, kVocab);
  ASSERT_EQ(t.tiles, 2048);

  // The host's canonical order: key (ordered bits of l') desc, then id asc.
  auto key_of = [&](int64_t r, int64_t v) { return OrderedFloatBits(w[v] * h[r]); };
  auto before = [&](int64_t r, int64_t x, int64_t y) {
    const uint32_t kx = key_of(r, x), ky = key_of(r, y);
    return kx != ky ? kx > ky : x < y;
  };
  const bool hopper = WgmmaStage1Available();
  for (const Stage1Kernel k : {Stage1Kernel::kAuto, Stage1Kernel::kMmaSync, Stage1Kernel::kWgmmaSeparateEpilogue}) {
    if (k == Stage1Kernel::kWgmmaSeparateEpilogue && !hopper) continue;
    SCOPED_TRACE(::testing::Message() << "stage1 " << static_cast<int>(k));
    a.stage1 = k;
    ASSERT_EQ(LaunchFusedControlledStage1(a, 0, nullptr), KernelStatus::kOk);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<HostCandidate> cands(static_cast<size_t>(kRows * t.tiles * kFusedTileCandidates));
    ASSERT_EQ(cudaMemcpy(cands.data(), t.candidates, cands.size() * sizeof(HostCandidate), cudaMemcpyDeviceToHost),
              cudaSuccess);
    int64_t written = 0, unpruned = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      const int m = std::min<int>(controls[r].top_k, kFusedTileCandidates);
      std::vector<int64_t> order(kVocab);
      for (int64_t v = 0; v < kVocab; ++v) order[v] = v;
      std::nth_element(order.begin(), order.begin() + 63, order.end(),
                       [&](int64_t x, int64_t y) { return before(r, x, y); });
      const uint32_t key64 = key_of(r, order[63]);  // the row's 64th best
      for (int64_t tile = 0; tile < t.tiles; ++tile) {
        std::vector<int64_t> tokens(128);
        for (int i = 0; i < 128; ++i) tokens[i] = tile * 128 + i;
        std::sort(tokens.begin(), tokens.end(), [&](int64_t x, int64_t y) { return before(r, x, y); });
        const HostCandidate* got = cands.data() + (r * t.tiles + tile) * kFusedTileCandidates;
        int n = 0;
        while (n < m && got[n].id >= 0) ++n;
        for (int i = 0; i < n; ++i) {
          ASSERT_EQ(got[i].id, tokens[i]) << "row " << r << " tile " << tile << " slot " << i;
          ASSERT_EQ(OrderedFloatBits(got[i].logit), key_of(r, tokens[i])) << "row " << r << " tile " << tile;
        }
        for (int i = n; i < m; ++i) ASSERT_EQ(got[i].id, -1) << "row " << r << " tile " << tile << " slot " << i;
        if (n < m) {
          EXPECT_LT(key_of(r, tokens[n]), key64) << "row " << r << " tile " << tile << " stopped at " << n;
        }
        written += n;
        unpruned += m;
      }
    }
    EXPECT_LT(written, unpruned) << "no tile stopped at the bound";
    std::printf("stage1 %d: %lld of %lld candidates written\n", static_cast<int>(k),
                static_cast<long long>(written), static_cast<long long>(unpruned));
  }
}

TEST_F(FusedControlledSampleTest, RejectsBadArguments) {
  EXPECT_FALSE(FusedControlledShapeSupported(CudaWeightDType::kFloat32, 1000, 64));
  EXPECT_FALSE(FusedControlledShapeSupported(CudaWeightDType::kBFloat16, 1000, 24));
  EXPECT_FALSE(FusedControlledShapeSupported(CudaWeightDType::kBFloat16, kFusedMaxVocab + 1, 64));
  EXPECT_TRUE(FusedControlledShapeSupported(CudaWeightDType::kFloat16, kFusedMaxVocab, 64));
  EXPECT_EQ(FusedControlledWorkspaceBytes(0, 1000, 64), 0u);
  ControlledSampleArgs a;  // every pointer null
  a.batch = 1;
  a.vocab = a.valid_vocab = 24;
  a.hidden_dim = 16;
  EXPECT_EQ(LaunchFusedControlledSample(a, nullptr), KernelStatus::kInvalidArgument);
}

}  // namespace
}  // namespace flashsampler::kernels
