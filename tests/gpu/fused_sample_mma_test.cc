// The tensor-core stage 1 of the fused sampler (kernels/cuda/fused_sample_mma.cu,
// taken for fp16 / bf16 weights and hidden_dim % 16 == 0 at every batch; from
// 16 rows on Hopper the WGMMA kernel, the same bits) against the CPU backend
// and against the CUDA-core stage 1 (forced, Stage1Kernel::kCudaCore; ctest
// label `gpu`).
//
// Hidden states are rounded to the weight dtype (the path's precondition,
// fused_sample.h). valid_vocab < vocab with masked W rows of all 4s and
// positive hidden states, so a leaked masked token would win every row.
// Tokens may differ from the references only at near-ties (fp32 summation
// order); logz within 1e-4 relative of the CPU backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/tiled_sampler.h"
#include "kernels/cuda/fused_sample.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/common/token_panels.h"

namespace flashsampler::kernels {
namespace {

using gpu_test::DeviceWeights;
using gpu_test::GpuTest;
using gpu_test::HostWeights;
using gpu_test::Problem;
using gpu_test::SampleOutputs;

constexpr double kTieTolerance = 1e-3;
constexpr int64_t kVocab = 2100, kValidVocab = 2050;  // 17 tiles, the last partial

SampleOutputs RunCpu(const HostWeights& w, int64_t valid_vocab, const std::vector<float>& hidden,
                     const std::vector<RowParams>& params) {
  const std::vector<float> cpu_panels = testing::TokenPanelsOf(w.values, w.hidden);
  CpuTiledSampler cpu(cpu_panels.data(), w.vocab, valid_vocab, w.hidden, {4, 1024});
  SampleOutputs out;
  out.tokens.assign(params.size(), -7);
  out.logz.assign(params.size(), NAN);
  out.logprobs.assign(params.size(), NAN);
  EXPECT_EQ(cpu.Sample(hidden.data(), static_cast<int64_t>(params.size()), params.data(),
                       {out.tokens.data(), out.logz.data(), out.logprobs.data()}),
            KernelStatus::kOk);
  return out;
}

using MmaCase = std::tuple<CudaWeightDType, int64_t /*batch*/, int64_t /*hidden*/>;

class FusedSampleMmaTest : public GpuTest, public ::testing::WithParamInterface<MmaCase> {};

TEST_P(FusedSampleMmaTest, MatchesCpuAndCudaCorePath) {
  const auto [dtype, batch, hidden_dim] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(31 + batch + hidden_dim));
  std::normal_distribution<float> normal(0.0f, 3.0f / std::sqrt(static_cast<float>(hidden_dim)));
  const HostWeights w = gpu_test::MakeWeights(
      dtype, kVocab, hidden_dim,
      [&](int64_t v, int64_t) { return v >= kValidVocab ? 4.0f : normal(rng); });
  std::vector<float> hidden =
      gpu_test::RandomMatrix(batch, hidden_dim, 1.0f, static_cast<uint32_t>(batch));
  for (float& x : hidden) x = 0.1f + std::fabs(x);
  gpu_test::RoundInPlace(dtype, &hidden);
  const auto params = gpu_test::RandomParams(batch, 0.2, static_cast<uint32_t>(hidden_dim));
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  const Problem problem{dw.ptr, dtype, kVocab, kValidVocab, hidden_dim};

  SampleOutputs gpu, again;
  ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &gpu), KernelStatus::kOk);
  ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &again), KernelStatus::kOk);
  EXPECT_EQ(gpu.tokens, again.tokens);  // deterministic, bit for bit
  EXPECT_EQ(gpu.logz, again.logz);
  for (int32_t t : gpu.tokens) EXPECT_LT(t, kValidVocab);

  // Against the CPU backend (differences only at near-ties, at most one row).
  const SampleOutputs cpu = RunCpu(w, kValidVocab, hidden, params);
  const int64_t mismatches =
      gpu_test::CountTokenMismatches(gpu.tokens, cpu.tokens, w, hidden, params, kTieTolerance);
  EXPECT_LE(mismatches, 1) << "rows differing from the CPU backend";
  int reported = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const double tol = 1e-4 * std::max(1.0f, std::fabs(cpu.logz[b]));
    if (!(std::fabs(gpu.logz[b] - cpu.logz[b]) <= tol) && ++reported <= 5) {
      ADD_FAILURE() << "row " << b << " logz GPU " << gpu.logz[b] << " CPU " << cpu.logz[b];
    }
    if (gpu.tokens[b] == cpu.tokens[b] && !(std::fabs(gpu.logprobs[b] - cpu.logprobs[b]) <= tol) &&
        ++reported <= 5) {
      ADD_FAILURE() << "row " << b << " logprob GPU " << gpu.logprobs[b] << " CPU "
                    << cpu.logprobs[b];
    }
  }

  // Against the CUDA-core stage 1 (forced): rows launched alone.
  Problem cuda_core = problem;
  cuda_core.stage1 = Stage1Kernel::kCudaCore;
  for (int64_t r : {int64_t{0}, batch / 2, batch - 1}) {
    const std::vector<float> h(hidden.begin() + r * hidden_dim,
                               hidden.begin() + (r + 1) * hidden_dim);
    SampleOutputs alone;
    ASSERT_EQ(gpu_test::RunSampler(cuda_core, h, {params[r]}, true, &alone), KernelStatus::kOk);
    if (alone.tokens[0] != gpu.tokens[r]) {
      const float* hr = hidden.data() + r * hidden_dim;
      EXPECT_LE(std::fabs(gpu_test::ReferenceScore(w, hr, params[r], alone.tokens[0]) -
                          gpu_test::ReferenceScore(w, hr, params[r], gpu.tokens[r])),
                kTieTolerance)
          << "row " << r << ": CUDA-core token " << alone.tokens[0] << " vs tensor-core "
          << gpu.tokens[r];
    }
    EXPECT_NEAR(alone.logz[0], gpu.logz[r], 1e-5 * std::max(1.0f, std::fabs(gpu.logz[r])))
        << "row " << r;
  }
}

// The deep pipeline at B <= 16 (stage1_shape.h) changes when W arrives, not
// the arithmetic: shallow, deep and the launcher's own choice give the same
// bits. D = 7168 with 10 tiles is a head the launcher runs deep on any GPU
// with 10 or more SMs; D = 256 one it runs shallow.
class FusedSampleMmaPipelineTest : public GpuTest {};

TEST_F(FusedSampleMmaPipelineTest, DeepAndShallowGiveTheSameBits) {
  for (const auto& [dtype, vocab, hidden_dim] :
       {std::tuple<CudaWeightDType, int64_t, int64_t>{CudaWeightDType::kBFloat16, 1280, 7168},
        std::tuple<CudaWeightDType, int64_t, int64_t>{CudaWeightDType::kFloat16, 1250, 7168},
        std::tuple<CudaWeightDType, int64_t, int64_t>{CudaWeightDType::kBFloat16, kVocab, 256}}) {
    const HostWeights w = gpu_test::RandomWeights(dtype, vocab, hidden_dim,
                                                  3.0f / std::sqrt(static_cast<float>(hidden_dim)), 5);
    DeviceWeights dw;
    gpu_test::UploadWeights(w, 0, &dw);
    for (int64_t batch : {int64_t{3}, int64_t{8}, int64_t{16}}) {
      SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dtype) << " V " << vocab
                                        << " D " << hidden_dim << " B " << batch);
      const auto hidden = gpu_test::RandomMatrix(batch, hidden_dim, 1.0f, 6 + batch, dtype);
      const auto params = gpu_test::RandomParams(batch, 0.2, 7 + batch);
      Problem problem{dw.ptr, dtype, vocab, vocab, hidden_dim};
      SampleOutputs out[3];
      const MmaPipeline pipelines[3] = {MmaPipeline::kShallow, MmaPipeline::kDeep, MmaPipeline::kAuto};
      for (int i = 0; i < 3; ++i) {
        problem.mma_pipeline = pipelines[i];
        ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &out[i]), KernelStatus::kOk);
      }
      for (int i = 1; i < 3; ++i) {
        EXPECT_EQ(out[i].tokens, out[0].tokens) << "pipeline " << i;
        EXPECT_EQ(out[i].logz, out[0].logz) << "pipeline " << i;
        EXPECT_EQ(out[i].logprobs, out[0].logprobs) << "pipeline " << i;
      }
    }
  }
}

std::string CaseName(const ::testing::TestParamInfo<MmaCase>& info) {
  const auto [dtype, batch, hidden_dim] = info.param;
  return std::string(dtype == CudaWeightDType::kFloat16 ? "fp16" : "bf16") + "_B" +
         std::to_string(batch) + "_D" + std::to_string(hidden_dim);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FusedSampleMmaTest,
    ::testing::Combine(::testing::Values(CudaWeightDType::kBFloat16, CudaWeightDType::kFloat16),
                       // One batch per block shape (8, 16, 32, 64, 128 rows; 1
                       // and 2 rows in an 8-row block), a partial 128-row
                       // block and three 128-row chunks.
                       ::testing::Values(int64_t{1}, int64_t{2}, int64_t{3}, int64_t{8}, int64_t{16}, int64_t{32},
                                         int64_t{64}, int64_t{100}, int64_t{128},
                                         int64_t{257}),
                       ::testing::Values(int64_t{16}, int64_t{1024}, int64_t{4096})),
    CaseName);

}  // namespace
}  // namespace flashsampler::kernels
