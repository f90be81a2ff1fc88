// Speculative-verification rows of the CUDA samplers (FusedSampleArgs::
// draft_tokens, ctest label `gpu`): a row with a greedy draft token x
//  - leaves every other row of the launch bit-identical,
//  - keeps log Z bit-identical (x still counts in it),
//  - reports draft_logprobs = l'_x - log Z (checked against float64),
//  - greedy rows: the same argmax as without the draft;
//  - sampled rows: never returns x, returns the plain token whenever that was
//    not x, and otherwise the best of the other tokens;
// and the sampled rows' tokens follow the residual distribution
// softmax(l') restricted to i != x (chi-square against float64, both stage-1
// paths), which is what makes verify-and-resample exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/fused_sample.h"
#include "tests/common/goodness_of_fit.h"
#include "tests/gpu/gpu_test_util.h"

namespace flashsampler::kernels {
namespace {

using gpu_test::DeviceWeights;
using gpu_test::HostWeights;
using gpu_test::SampleOutputs;

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// Which sampler a case runs: the fused kernel, or the materialized baseline.
struct DraftCase {
  CudaWeightDType dtype;
  int64_t batch;
  bool materialized;
};

class DraftRowsTest : public gpu_test::GpuTest, public ::testing::WithParamInterface<DraftCase> {
 protected:
  void SetUp() override {
    gpu_test::GpuTest::SetUp();
    ASSERT_EQ(cublasCreate(&cublas_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (cublas_ != nullptr) cublasDestroy(cublas_);
  }
  cublasHandle_t cublas_ = nullptr;
};

// V = 3000 (24 fused tiles, the last partial), D = 64 (tensor-core path for
// 16-bit weights at B >= 3). Rows cycle through: no draft, the row's own plain
// token as the draft (greedy: accepted; sampled: forces the runner-up), a
// random draft, and the last token of the vocabulary.
TEST_P(DraftRowsTest, DraftRowsAgreeWithThePlainLaunch) {
  const DraftCase c = GetParam();
  constexpr int64_t kVocab = 3000, kHidden = 64;
  const HostWeights w = gpu_test::RandomWeights(c.dtype, kVocab, kHidden, 0.3f, 11);
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  const gpu_test::Problem problem{dw.ptr, c.dtype, kVocab, kVocab, kHidden};
  const std::vector<float> hidden = gpu_test::RandomMatrix(c.batch, kHidden, 1.0f, 12, c.dtype);
  const std::vector<RowParams> params = gpu_test::RandomParams(c.batch, 0.25, 13);
  cublasHandle_t cublas = c.materialized ? cublas_ : nullptr;

  SampleOutputs plain;
  ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &plain, cublas), KernelStatus::kOk);

  std::mt19937 rng(14);
  std::uniform_int_distribution<int32_t> any_token(0, kVocab - 1);
  std::vector<int32_t> drafts(static_cast<size_t>(c.batch));
  for (int64_t b = 0; b < c.batch; ++b) {
    switch (b % 4) {
      case 0: drafts[b] = -1; break;
      case 1: drafts[b] = plain.tokens[b]; break;
      case 2: drafts[b] = any_token(rng); break;
      default: drafts[b] = kVocab - 1; break;
    }
  }
  SampleOutputs verified;
  ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &verified, cublas, &drafts),
            KernelStatus::kOk);
  ASSERT_EQ(verified.draft_logprobs.size(), static_cast<size_t>(c.batch));

  int64_t runner_up_rows = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    SCOPED_TRACE(::testing::Message() << "row " << b << " draft " << drafts[b] << " T "
                                      << params[b].temperature);
    const float* h = hidden.data() + b * kHidden;
    const int32_t x = drafts[b];
    EXPECT_TRUE(SameBits(verified.logz[b], plain.logz[b])) << verified.logz[b] << " vs " << plain.logz[b];
    if (x < 0) {
      EXPECT_EQ(verified.tokens[b], plain.tokens[b]);
      EXPECT_TRUE(SameBits(verified.logprobs[b], plain.logprobs[b]));
      EXPECT_TRUE(std::isnan(verified.draft_logprobs[b]));
      continue;
    }
    // log p(x) against float64 (the logits differ from float64 by fp32 rounding).
    const double ref = gpu_test::TransformedLogit(w, h, params[b], x) -
                       gpu_test::ReferenceLogZ(w, h, params[b], kVocab);
    EXPECT_NEAR(verified.draft_logprobs[b], ref, 1e-4 + 1e-5 * std::fabs(ref));
    if (params[b].temperature == 0.0f) {
      EXPECT_EQ(verified.tokens[b], plain.tokens[b]);
      EXPECT_TRUE(SameBits(verified.logprobs[b], plain.logprobs[b]));
      continue;
    }
    EXPECT_NE(verified.tokens[b], x);
    if (plain.tokens[b] != x) {
      EXPECT_EQ(verified.tokens[b], plain.tokens[b]);
      EXPECT_TRUE(SameBits(verified.logprobs[b], plain.logprobs[b]));
      continue;
    }
    // The plain winner was x: the token must be the best of the others (up to
    // a near-tie of fp32 rounding).
    ++runner_up_rows;
    double best_other = -INFINITY;
    for (int64_t v = 0; v < kVocab; ++v) {
      if (v != x) best_other = std::max(best_other, gpu_test::ReferenceScore(w, h, params[b], v));
    }
    EXPECT_GE(gpu_test::ReferenceScore(w, h, params[b], verified.tokens[b]), best_other - 1e-4);
  }
  if (c.batch >= 8) {
    EXPECT_GT(runner_up_rows, 0) << "no row exercised the runner-up";
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, DraftRowsTest,
    ::testing::Values(DraftCase{CudaWeightDType::kBFloat16, 1, false},   // CUDA cores, R = 1
                      DraftCase{CudaWeightDType::kBFloat16, 2, false},   // CUDA cores, R = 2
                      DraftCase{CudaWeightDType::kBFloat16, 24, false},  // tensor cores
                      DraftCase{CudaWeightDType::kFloat16, 40, false},   // tensor cores, fp16
                      DraftCase{CudaWeightDType::kFloat32, 24, false},   // CUDA cores, R = 8
                      DraftCase{CudaWeightDType::kBFloat16, 24, true},   // materialized
                      DraftCase{CudaWeightDType::kFloat32, 9, true}));

class DraftArgsTest : public gpu_test::GpuTest {};

// Without draft_logprobs the draft tokens are refused (and vice versa).
TEST_F(DraftArgsTest, DraftTokensNeedDraftLogprobs) {
  const HostWeights w = gpu_test::RandomWeights(CudaWeightDType::kBFloat16, 256, 16, 0.3f, 3);
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  gpu_test::DeviceBuffer<float> d_hidden(16);
  gpu_test::DeviceBuffer<RowParams> d_params(1);
  gpu_test::DeviceBuffer<int32_t> d_tokens(1), d_drafts(1);
  const size_t ws = FusedSampleWorkspaceBytes(1, 256, 16);
  gpu_test::DeviceBuffer<uint8_t> d_ws(ws);
  FusedSampleArgs args;
  args.weight = dw.ptr;
  args.hidden = d_hidden.data();
  args.params = d_params.data();
  args.batch = 1;
  args.vocab = args.valid_vocab = 256;
  args.hidden_dim = 16;
  args.token_ids = d_tokens.data();
  args.workspace = d_ws.data();
  args.workspace_bytes = ws;
  args.draft_tokens = d_drafts.data();
  EXPECT_EQ(LaunchFusedSample(args, nullptr), KernelStatus::kInvalidArgument);
  args.draft_tokens = nullptr;
  args.draft_logprobs = reinterpret_cast<float*>(d_tokens.data());
  EXPECT_EQ(LaunchFusedSample(args, nullptr), KernelStatus::kInvalidArgument);
}

// ---- The residual distribution --------------------------------------------------
// H = e_0, so every logit is W's column 0 exactly (see
// fused_sample_exactness_test.cc); all rows share the logits, draft and seed,
// with stream = row index; `calls` launches of `rows` rows use offsets 0, 1, ...
// Expected: softmax(l') with x removed and renormalized. 2^24 samples catch a
// 1% error in any token with p >= 0.05 at z >= 7.
void ExpectResidualMatches(int64_t hidden_dim, const std::vector<float>& column0, int32_t draft,
                           float temperature, uint64_t seed) {
  const int64_t vocab = static_cast<int64_t>(column0.size());
  const HostWeights w = gpu_test::MakeWeights(
      CudaWeightDType::kBFloat16, vocab, hidden_dim,
      [&](int64_t v, int64_t d) { return d == 0 ? column0[v] : 0.375f; });
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  const gpu_test::Problem problem{dw.ptr, CudaWeightDType::kBFloat16, vocab, vocab, hidden_dim};
  constexpr int64_t kRows = int64_t{1} << 22, kCalls = 4;
  std::vector<float> hidden(static_cast<size_t>(kRows * hidden_dim), 0.0f);
  for (int64_t r = 0; r < kRows; ++r) hidden[r * hidden_dim] = 1.0f;
  const std::vector<int32_t> drafts(static_cast<size_t>(kRows), draft);
  std::vector<RowParams> params(static_cast<size_t>(kRows));

  std::vector<double> probs = flashsampler::testing::SoftmaxOfScaled(
      column0, vocab, LogitScale(RowParams{temperature, 0, 0, 0}));
  const double log_px = std::log(probs[draft]);
  const double rest = 1.0 - probs[draft];
  for (double& p : probs) p /= rest;
  probs[draft] = 0.0;

  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  for (int64_t call = 0; call < kCalls; ++call) {
    for (int64_t r = 0; r < kRows; ++r) {
      params[r] = RowParams{temperature, seed, static_cast<uint64_t>(call), static_cast<uint32_t>(r)};
    }
    SampleOutputs out;
    ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, false, &out, nullptr, &drafts),
              KernelStatus::kOk);
    for (int32_t t : out.tokens) ++counts[t];  // RunSampler checked the range
    EXPECT_NEAR(out.draft_logprobs[0], log_px, 1e-5 + 1e-6 * std::fabs(log_px));
    EXPECT_TRUE(SameBits(out.draft_logprobs[0], out.draft_logprobs[kRows - 1]));
  }
  EXPECT_EQ(counts[draft], 0) << "the draft token was sampled from its own residual";
  flashsampler::testing::ExpectCountsMatch(counts, probs, /*required_shift=*/7.0,
                                           /*detectable_error=*/0.01);
}

class DraftResidualTest : public gpu_test::GpuTest {};

// Logits -v/8 over V = 64 plus two tokens at -20, all exact in bf16.
std::vector<float> SlopeLogits() {
  std::vector<float> l(64);
  for (int v = 0; v < 64; ++v) l[v] = (v == 13 || v == 40) ? -20.0f : -0.125f * static_cast<float>(v);
  return l;
}

// CUDA-core stage 1 (hidden_dim 1); the draft is the most likely token.
TEST_F(DraftResidualTest, CudaCorePathDraftIsTheArgmax) {
  ExpectResidualMatches(1, SlopeLogits(), 0, 0.8f, 101);
}

// Tensor-core stage 1 (hidden_dim 16); a likely draft, then an unlikely one
// (whose residual is nearly the full distribution).
TEST_F(DraftResidualTest, TensorCorePathLikelyDraft) {
  ExpectResidualMatches(16, SlopeLogits(), 3, 1.0f, 102);
}
TEST_F(DraftResidualTest, TensorCorePathUnlikelyDraft) {
  ExpectResidualMatches(16, SlopeLogits(), 40, 1.3f, 103);
}

}  // namespace
}  // namespace flashsampler::kernels
