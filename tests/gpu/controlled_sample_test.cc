// Tests of kernels/cuda/controlled_sample.h (ctest label `gpu`): every
// sampling control against the float64 reference (tests/common/
// controls_reference.h) with the shared goodness-of-fit check; the GPU against
// the CPU backend (kernels/cpu/controlled_sampler.h) on random rows with random
// controls, including heavy ties; the edge cases of issue 3 (top_k = 1 is
// greedy, top_p = 1 and min_p = 0 change nothing, top-k boundary ties go to the
// lower id, a row with every token masked reports row_status 1 while the other
// rows are served).
//
// Every case uses hidden_dim = 1 and fp32 weights: the logits are single fp32
// products w_v * h_b, which cuBLAS (PEDANTIC fp32) and the CPU's sgemm round
// identically. So both backends see bit-identical raw logits, the transformed
// logits are bit-identical by construction (TouchedLogit, one fp32 multiply),
// and the only admissible differences are the documented ones: top_p cuts
// within ~1e-8 of the target (fixed-point vs float64 sums) and min_p
// thresholds within an ulp of exp's rounding. The comparison therefore
// demands identical tokens on >= 99.9% of rows (in practice all of them).
#include "kernels/cuda/controlled_sample.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/controlled_sampler.h"
#include "kernels/cuda/materialized_sample.h"
#include "tests/common/controls_fit_cases.h"
#include "tests/common/controls_reference.h"
#include "tests/common/goodness_of_fit.h"
#include "tests/gpu/controls_test_problems.h"
#include "tests/gpu/gpu_test_util.h"

namespace flashsampler::kernels {
namespace {

using controls_test::ExpectAgrees;
using controls_test::MakeRandomProblem;
using controls_test::Outputs;
using controls_test::RandomProblem;
using controls_test::RunCpu;
using gpu_test::DeviceBuffer;
using gpu_test::GpuTest;

// The controlled sampler on a [vocab, 1] fp32 LM head `w` (valid_vocab =
// vocab) with hidden values h [rows]: flattens the controls, uploads
// everything, launches LaunchControlledSample, downloads and assembles the
// details as the engine does (server/engine/cuda_controlled_runner.cc).
class ControlledSampleTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_EQ(cublasCreate(&cublas_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (cublas_ != nullptr) cublasDestroy(cublas_);
  }

  // With draft tokens (one per row, -1: none) when `drafts` is given.
  Outputs Run(const std::vector<float>& w, const std::vector<float>& h,
              const std::vector<RowParams>& params, const std::vector<RowControls>& controls,
              const std::vector<int32_t>* drafts = nullptr) {
    Outputs out;
    const int64_t vocab = static_cast<int64_t>(w.size());
    const int64_t rows = static_cast<int64_t>(h.size());
    FlatControls flat;
    EXPECT_EQ(FlattenControls(controls.data(), rows, vocab, vocab, &flat), KernelStatus::kOk);
    std::vector<uint8_t> packed(flat.PackedBytes());
    flat.PackTo(packed.data());
    DeviceBuffer<float> dw(w.size()), dh(h.size());
    DeviceBuffer<RowParams> dp(params.size());
    DeviceBuffer<uint8_t> dc(packed.size());
    DeviceBuffer<int32_t> dd(static_cast<size_t>(rows));
    if (drafts != nullptr) dd.Upload(*drafts);
    dw.Upload(w);
    dh.Upload(h);
    dp.Upload(params);
    dc.Upload(packed);
    controls_test::DeviceOutputs outputs(rows, flat.total_samples);
    const size_t ws_bytes =
        ControlledSampleWorkspaceBytes(rows, vocab, 1, CudaWeightDType::kFloat32);
    EXPECT_GT(ws_bytes, 0u);
    DeviceBuffer<uint8_t> workspace(ws_bytes);

    ControlledSampleArgs args;
    args.weight = dw.data();
    args.weight_dtype = CudaWeightDType::kFloat32;
    args.hidden = dh.data();
    args.params = dp.data();
    args.batch = rows;
    args.vocab = vocab;
    args.valid_vocab = vocab;
    args.hidden_dim = 1;
    args.controls = flat.DeviceView(dc.data());
    if (drafts != nullptr) args.controls.draft_tokens = dd.data();
    args.outputs = outputs.View();
    args.workspace = workspace.data();
    args.workspace_bytes = ws_bytes;
    args.cluster_blocks = cluster_blocks_;
    out.launch = LaunchControlledSample(args, cublas_, nullptr);
    const cudaError_t sync = cudaDeviceSynchronize();
    EXPECT_EQ(sync, cudaSuccess) << cudaGetErrorString(sync);
    if (out.launch != KernelStatus::kOk || sync != cudaSuccess) return out;
    outputs.Download(flat, rows, &out, drafts != nullptr);
    return out;
  }

  // The GPU against the CPU backend on `p` (defined below the problem maker).
  void CompareWithCpu(const RandomProblem& p);

  cublasHandle_t cublas_ = nullptr;
  int cluster_blocks_ = kControlledClusterAuto;  // blocks per row
};

// ---- Goodness of fit against the float64 reference ---------------------------
// The CPU suite's cases (tests/common/controls_fit_cases.h).
using FitCase = testing::ControlsFitCase;
std::vector<float> TestLogits() { return testing::ControlsTestLogits(); }
RowControls Controls(int32_t top_k, float top_p, float min_p) {
  return testing::FilterControls(top_k, top_p, min_p);
}
class ControlledSampleFit : public ControlledSampleTest,
                            public ::testing::WithParamInterface<FitCase> {};

// 2^21 samples per case: 8 launches of 4096 rows x 64 samples (stream = row,
// stride = rows, offset = launch). Power: a 1% relative error in any token
// with p >= 0.05 shifts its count by >= 6 standard deviations (asserted).
TEST_P(ControlledSampleFit, MatchesTheFloat64Reference) {
  const FitCase& fc = GetParam();
  const std::vector<float> logits = TestLogits();
  const testing::ReferenceResult ref =
      testing::ReferenceControlledDistribution(logits, 24, fc.temperature, fc.controls);
  ASSERT_GT(ref.margin, 1e-3);
  constexpr int64_t kRows = 4096;
  constexpr int32_t kSamples = 64;
  RowControls c = fc.controls;
  c.num_samples = kSamples;
  c.sample_stream_stride = kRows;
  const std::vector<RowControls> controls(kRows, c);
  const std::vector<float> h(kRows, 1.0f);
  std::vector<int64_t> counts(24, 0);
  for (int64_t call = 0; call < 8; ++call) {
    std::vector<RowParams> params(kRows);
    for (int64_t r = 0; r < kRows; ++r) {
      params[r] = RowParams{fc.temperature, 4242, static_cast<uint64_t>(call), static_cast<uint32_t>(r)};
    }
    const Outputs out = Run(logits, h, params, controls);
    ASSERT_EQ(out.launch, KernelStatus::kOk);
    for (const RowSampleDetail& d : out.details) {
      ASSERT_EQ(d.token_ids.size(), static_cast<size_t>(kSamples));
      for (int32_t t : d.token_ids) {
        ASSERT_TRUE(t >= 0 && t < 24) << t;
        ++counts[t];
      }
    }
  }
  testing::ExpectCountsMatch(counts, ref.probs, /*required_shift=*/6.0, /*detectable_error=*/0.01);
}

// A draft row's samples follow the residual: the float64 reference
// distribution after the controls with the draft's mass removed and the rest
// renormalised; its log-probability is log p(x) of the reference. top_k 8 at
// T = 0.8 on the shared test logits (three tokens near 3, a tail below 0),
// the draft = the reference's most likely token (the residual that differs
// most from the plain one).
// 2^21 samples, the same power as the cases above.
TEST_F(ControlledSampleTest, DraftResidualMatchesTheFloat64Reference) {
  const std::vector<float> logits = TestLogits();
  constexpr float kTemperature = 0.8f;
  constexpr int64_t kRows = 4096;
  constexpr int32_t kSamples = 64;
  RowControls c = Controls(8, 1.0f, 0.0f);
  const testing::ReferenceResult ref =
      testing::ReferenceControlledDistribution(logits, 24, kTemperature, c);
  ASSERT_GT(ref.margin, 1e-3);
  const int32_t draft =
      static_cast<int32_t>(std::max_element(ref.probs.begin(), ref.probs.end()) - ref.probs.begin());
  ASSERT_LT(ref.probs[draft], 0.9);  // other tokens are kept: a residual exists
  std::vector<double> residual = ref.probs;
  residual[draft] = 0.0;
  for (double& q : residual) q /= 1.0 - ref.probs[draft];
  c.num_samples = kSamples;
  c.sample_stream_stride = kRows;
  const std::vector<RowControls> controls(kRows, c);
  const std::vector<float> h(kRows, 1.0f);
  const std::vector<int32_t> drafts(kRows, draft);
  std::vector<int64_t> counts(24, 0);
  for (int64_t call = 0; call < 8; ++call) {
    std::vector<RowParams> params(kRows);
    for (int64_t r = 0; r < kRows; ++r) {
      params[r] = RowParams{kTemperature, 5151, static_cast<uint64_t>(call), static_cast<uint32_t>(r)};
    }
    const Outputs out = Run(logits, h, params, controls, &drafts);
    ASSERT_EQ(out.launch, KernelStatus::kOk);
    ASSERT_EQ(out.draft_logprobs.size(), static_cast<size_t>(kRows));
    for (int64_t r = 0; r < kRows; ++r) {
      ASSERT_NEAR(out.draft_logprobs[r], std::log(ref.probs[draft]), 1e-5) << "row " << r;
    }
    for (const RowSampleDetail& d : out.details) {
      ASSERT_EQ(d.token_ids.size(), static_cast<size_t>(kSamples));
      for (int32_t t : d.token_ids) {
        ASSERT_TRUE(t >= 0 && t < 24) << t;
        ++counts[t];
      }
    }
  }
  EXPECT_EQ(counts[draft], 0);
  testing::ExpectCountsMatch(counts, residual, /*required_shift=*/6.0, /*detectable_error=*/0.01);
}

INSTANTIATE_TEST_SUITE_P(
    EveryControl, ControlledSampleFit,
    ::testing::ValuesIn(testing::EveryControlFitCase()),
    [](const ::testing::TestParamInfo<FitCase>& info) { return info.param.name; });

// ---- The GPU against the CPU backend ---------------------------------------------
void ControlledSampleTest::CompareWithCpu(const RandomProblem& p) {
  const Outputs cpu = RunCpu(p.w, p.h, p.params, p.controls);
  ASSERT_EQ(cpu.launch, KernelStatus::kOk);
  const Outputs gpu = Run(p.w, p.h, p.params, p.controls);
  ASSERT_EQ(gpu.launch, KernelStatus::kOk);
  ExpectAgrees(gpu, cpu, p);
}

TEST_F(ControlledSampleTest, MatchesTheCpuBackendOnRandomControls) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE(seed);
    CompareWithCpu(MakeRandomProblem(30000, 512, 0.0f, seed));
  }
}

// Weights on a grid of 1/4: thousands of tokens share each logit, so the
// top-k, top-p and top-list boundaries fall inside groups of ties, resolved
// by the lower id on both backends.
TEST_F(ControlledSampleTest, MatchesTheCpuBackendWithHeavyTies) {
  for (uint32_t seed : {11u, 12u}) {
    SCOPED_TRACE(seed);
    CompareWithCpu(MakeRandomProblem(30000, 512, 0.25f, seed));
  }
}

// A batch of a few rows runs the largest clusters (16 blocks per row on an
// H100): each block owns a sliver of the histogram digits and of the row.
TEST_F(ControlledSampleTest, MatchesTheCpuBackendWithAFewRows) {
  for (uint32_t seed : {51u, 52u}) {
    SCOPED_TRACE(seed);
    CompareWithCpu(MakeRandomProblem(20000, 3, 0.25f, seed));
  }
}

// Verify rows with controls (speculative verification): the draft's
// log-probability under what the controls leave (-inf when they removed it)
// and samples from the residual (the kept tokens other than the draft),
// exactly as the CPU backend. Drafts: none, the token the row samples without
// a draft (kept: its residual is exercised), a random token (usually cut),
// the row's best listed token. Every cluster shape: the draft's l' is read
// from whichever block's slice holds it.
TEST_F(ControlledSampleTest, DraftRowsMatchTheCpuBackend) {
  for (uint32_t seed : {61u, 62u, 63u, 64u}) {
    SCOPED_TRACE(seed);
    cluster_blocks_ = seed == 63u ? 1 : (seed == 64u ? 16 : kControlledClusterAuto);
    const RandomProblem p = MakeRandomProblem(20000, 256, seed % 2 == 0 ? 0.25f : 0.0f, seed);
    const Outputs plain = RunCpu(p.w, p.h, p.params, p.controls);
    ASSERT_EQ(plain.launch, KernelStatus::kOk);
    std::mt19937 gen(seed);
    std::vector<int32_t> drafts(p.h.size());
    for (size_t r = 0; r < drafts.size(); ++r) {
      switch (gen() % 4) {  // not r % 4: MakeRandomProblem's controls follow r
        case 0: drafts[r] = -1; break;
        case 1: drafts[r] = plain.tokens[r]; break;
        case 2: drafts[r] = static_cast<int32_t>(gen() % p.w.size()); break;
        default:
          drafts[r] = plain.details[r].top.empty() ? plain.tokens[r] : plain.details[r].top[0].token_id;
      }
    }
    const Outputs cpu = RunCpu(p.w, p.h, p.params, p.controls, &drafts);
    ASSERT_EQ(cpu.launch, KernelStatus::kOk);
    const Outputs gpu = Run(p.w, p.h, p.params, p.controls, &drafts);
    ASSERT_EQ(gpu.launch, KernelStatus::kOk);
    ExpectAgrees(gpu, cpu, p);
    // A sampled row whose draft was kept with p < 1 never samples it.
    int64_t residual_rows = 0;
    for (size_t r = 0; r < drafts.size(); ++r) {
      const float d = gpu.draft_logprobs[r];
      if (drafts[r] < 0) {
        EXPECT_TRUE(std::isnan(d)) << "row " << r << ": " << d;
        continue;
      }
      if (p.params[r].temperature > 0.0f && std::isfinite(d) && d < 0.0f) {
        ++residual_rows;
        for (int32_t t : gpu.details[r].token_ids) EXPECT_NE(t, drafts[r]) << "row " << r;
      }
    }
    EXPECT_GT(residual_rows, 20);
  }
}

// A draft that is all the controls keep (top_k = 1 on the row's argmax) is
// the sample, with log-probability 0, on sampled rows too.
TEST_F(ControlledSampleTest, ADraftThatIsAllThatIsKeptIsTheSample) {
  const RandomProblem p = MakeRandomProblem(20000, 64, 0.0f, 63);
  const std::vector<RowControls> top1(p.h.size(), Controls(1, 1.0f, 0.0f));
  std::vector<RowParams> params = p.params;
  for (RowParams& q : params) q.temperature = 1.0f;
  const Outputs argmax = Run(p.w, p.h, params, top1);
  ASSERT_EQ(argmax.launch, KernelStatus::kOk);
  const Outputs verified = Run(p.w, p.h, params, top1, &argmax.tokens);
  ASSERT_EQ(verified.launch, KernelStatus::kOk);
  EXPECT_EQ(verified.tokens, argmax.tokens);
  ASSERT_EQ(verified.draft_logprobs.size(), p.h.size());
  for (size_t r = 0; r < p.h.size(); ++r) EXPECT_EQ(verified.draft_logprobs[r], 0.0f) << "row " << r;
}

// One block per row (no cluster) against the CPU as well: both launch shapes
// of the row kernel are checked.
TEST_F(ControlledSampleTest, MatchesTheCpuBackendWithOneBlockPerRow) {
  cluster_blocks_ = 1;
  CompareWithCpu(MakeRandomProblem(30000, 512, 0.25f, 13));
}

// Every cluster size gives the same outputs bit for bit: tokens, log Z,
// logprobs, samples with their logprobs and ranks, top lists. The sums over a
// row are exact (integer histograms, fixed-point masses), so how the row is
// split over blocks changes nothing; the server's auto size depends on the
// batch, so this is part of batch invariance.
TEST_F(ControlledSampleTest, ClusterSizesGiveTheSameResults) {
  const RandomProblem p = MakeRandomProblem(20000, 256, 0.25f, 14);
  cluster_blocks_ = 8;
  const Outputs ref = Run(p.w, p.h, p.params, p.controls);
  ASSERT_EQ(ref.launch, KernelStatus::kOk);
  for (int g : {1, 2, 4, 16, kControlledClusterAuto}) {
    SCOPED_TRACE(g);
    cluster_blocks_ = g;
    const Outputs o = Run(p.w, p.h, p.params, p.controls);
    ASSERT_EQ(o.launch, KernelStatus::kOk);
    EXPECT_EQ(o.tokens, ref.tokens);
    for (size_t r = 0; r < ref.tokens.size(); ++r) {
      EXPECT_EQ(o.details[r].token_ids, ref.details[r].token_ids) << r;
      EXPECT_EQ(o.details[r].ranks, ref.details[r].ranks) << r;
      ASSERT_EQ(o.details[r].top.size(), ref.details[r].top.size()) << r;
      for (size_t i = 0; i < ref.details[r].top.size(); ++i) {
        EXPECT_EQ(o.details[r].top[i].token_id, ref.details[r].top[i].token_id) << r;
        EXPECT_EQ(0, std::memcmp(&o.details[r].top[i].logprob, &ref.details[r].top[i].logprob,
                                 sizeof(float)))
            << r;
      }
      ASSERT_EQ(o.details[r].logprobs.size(), ref.details[r].logprobs.size()) << r;
      EXPECT_EQ(0, std::memcmp(o.details[r].logprobs.data(), ref.details[r].logprobs.data(),
                               sizeof(float) * ref.details[r].logprobs.size()))
          << r;
      EXPECT_EQ(0, std::memcmp(&o.logz[r], &ref.logz[r], sizeof(float)))
          << r << ": " << o.logz[r] << " vs " << ref.logz[r];
      EXPECT_EQ(0, std::memcmp(&o.logprobs[r], &ref.logprobs[r], sizeof(float))) << r;
    }
  }
  cluster_blocks_ = 3;
  EXPECT_EQ(Run(p.w, p.h, p.params, p.controls).launch, KernelStatus::kInvalidArgument);
}

// A batch of more than kControlledChunkRows rows (two GEMM + row-kernel chunks).
TEST_F(ControlledSampleTest, MatchesTheCpuBackendAcrossChunks) {
  CompareWithCpu(MakeRandomProblem(4000, kControlledChunkRows + 77, 0.0f, 21));
}

// ---- Edge cases of issue 3 ---------------------------------------------------------
TEST_F(ControlledSampleTest, TopKOneIsGreedy) {
  const RandomProblem p = MakeRandomProblem(20000, 256, 0.0f, 31);
  std::vector<RowControls> top1(p.h.size(), Controls(1, 1.0f, 0.0f));
  std::vector<RowParams> greedy = p.params;
  for (RowParams& q : greedy) q.temperature = 0.0f;
  const Outputs a = Run(p.w, p.h, p.params, top1);
  const Outputs b = Run(p.w, p.h, greedy, std::vector<RowControls>(p.h.size(), Controls(0, 1.0f, 0.0f)));
  ASSERT_EQ(a.launch, KernelStatus::kOk);
  ASSERT_EQ(b.launch, KernelStatus::kOk);
  EXPECT_EQ(a.tokens, b.tokens);
}

// top_p = 1 and min_p = 0 (with top_logprobs = 1 so the row is controlled)
// sample exactly what the plain materialized sampler samples.
TEST_F(ControlledSampleTest, NeutralTopPAndMinPChangeNothing) {
  const RandomProblem p = MakeRandomProblem(20000, 256, 0.0f, 41);
  RowControls neutral = Controls(0, 1.0f, 0.0f);
  neutral.top_logprobs = 1;
  const Outputs controlled = Run(p.w, p.h, p.params, std::vector<RowControls>(p.h.size(), neutral));
  ASSERT_EQ(controlled.launch, KernelStatus::kOk);

  const int64_t vocab = static_cast<int64_t>(p.w.size()), rows = static_cast<int64_t>(p.h.size());
  DeviceBuffer<float> dw(p.w.size()), dh(p.h.size());
  DeviceBuffer<RowParams> dp(rows);
  DeviceBuffer<int32_t> tokens(rows);
  DeviceBuffer<float> logz(rows), logprobs(rows);
  dw.Upload(p.w);
  dh.Upload(p.h);
  dp.Upload(p.params);
  const size_t ws = MaterializedSampleWorkspaceBytes(rows, vocab, 1, CudaWeightDType::kFloat32);
  DeviceBuffer<uint8_t> workspace(ws);
  FusedSampleArgs args;
  args.weight = dw.data();
  args.weight_dtype = CudaWeightDType::kFloat32;
  args.hidden = dh.data();
  args.params = dp.data();
  args.batch = rows;
  args.vocab = vocab;
  args.valid_vocab = vocab;
  args.hidden_dim = 1;
  args.token_ids = tokens.data();
  args.logz = logz.data();
  args.logprobs = logprobs.data();
  args.workspace = workspace.data();
  args.workspace_bytes = ws;
  ASSERT_EQ(LaunchMaterializedSample(args, cublas_, nullptr), KernelStatus::kOk);
  FS_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(controlled.tokens, tokens.Download(rows));
  const std::vector<float> plain_logz = logz.Download(rows);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_NEAR(controlled.logz[r], plain_logz[r], 1e-4f * std::max(1.0f, std::fabs(plain_logz[r])));
  }
}

// 100 tokens with the same logit: top_k = 10 keeps ids 0..9 exactly (every
// sample lands there, the top list is 0..9 in id order with log(1/10)).
TEST_F(ControlledSampleTest, TopKBoundaryTiesGoToTheLowerId) {
  std::vector<float> w(100, 0.5f);
  constexpr int64_t kRows = 512;
  RowControls c = Controls(10, 1.0f, 0.0f);
  c.top_logprobs = 20;
  c.num_samples = 8;
  c.sample_stream_stride = kRows;
  std::vector<RowParams> params(kRows);
  for (int64_t r = 0; r < kRows; ++r) params[r] = RowParams{1.0f, 99, 0, static_cast<uint32_t>(r)};
  const Outputs out = Run(w, std::vector<float>(kRows, 1.0f), params, std::vector<RowControls>(kRows, c));
  ASSERT_EQ(out.launch, KernelStatus::kOk);
  std::vector<int64_t> counts(100, 0);
  for (int64_t r = 0; r < kRows; ++r) {
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
  // Greedy: the lowest id of the tied maximum.
  for (RowParams& p : params) p.temperature = 0.0f;
  const Outputs greedy = Run(w, std::vector<float>(kRows, 1.0f), params, std::vector<RowControls>(kRows, c));
  for (int32_t t : greedy.tokens) EXPECT_EQ(t, 0);
}

// Row 1 has every token masked: row_status 1 there, rows 0 and 2 are served
// as usual (the engine turns the status into FailedPrecondition).
TEST_F(ControlledSampleTest, RowWithEveryTokenMaskedReportsItsStatus) {
  const std::vector<float> w = TestLogits();
  RowControls masked;
  masked.allowed_bitmask = {1u << 3};
  masked.banned_token_ids = {3};
  const std::vector<RowParams> params(3, RowParams{1.0f, 1, 0, 0});
  const Outputs out = Run(w, std::vector<float>(3, 1.0f), params, {Controls(3, 1.0f, 0.0f), masked, Controls(0, 0.5f, 0.0f)});
  ASSERT_EQ(out.launch, KernelStatus::kOk);
  EXPECT_EQ(out.row_status, (std::vector<int32_t>{0, 1, 0}));
  EXPECT_TRUE(out.tokens[0] == 0 || out.tokens[0] == 13 || out.tokens[0] == 23);
  EXPECT_TRUE(out.tokens[2] >= 0 && out.tokens[2] < 24);
}

TEST_F(ControlledSampleTest, RejectsBadArguments) {
  const std::vector<float> w = TestLogits();
  RowControls bad;
  bad.top_p = 0.0f;
  FlatControls flat;
  EXPECT_EQ(FlattenControls(&bad, 1, 24, 24, &flat), KernelStatus::kInvalidArgument);
  RowControls bad_id;
  bad_id.banned_token_ids = {24};
  EXPECT_EQ(FlattenControls(&bad_id, 1, 24, 24, &flat), KernelStatus::kInvalidArgument);
  ControlledSampleArgs args;  // every pointer null
  args.batch = 1;
  args.vocab = args.valid_vocab = 24;
  args.hidden_dim = 1;
  EXPECT_EQ(LaunchControlledSample(args, cublas_, nullptr), KernelStatus::kInvalidArgument);
  EXPECT_EQ(ControlledSampleWorkspaceBytes(0, 24, 1, CudaWeightDType::kFloat32), 0u);
}

}  // namespace
}  // namespace flashsampler::kernels
