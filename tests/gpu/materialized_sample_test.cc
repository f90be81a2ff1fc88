// Tests of kernels/cuda/materialized_sample.h (ctest label `gpu`): the cuBLAS
// + Gumbel-max baseline gives the same tokens as the fused kernel, for all
// three weight types, on well-separated random inputs.
//
// "Well separated": the hidden states are rounded to the weight type first, so
// the baseline's cast of H is exact and both samplers form the same exact
// products with fp32 accumulation; they differ only by summation order (~1e-6),
// far below the typical gap between a row's two best scores. Any differing
// token would also have to be a near-tie in float64 (checked), and none is
// expected.
#include "kernels/cuda/materialized_sample.h"

#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/fused_sample.h"
#include "tests/gpu/gpu_test_util.h"

namespace flashsampler::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::DeviceWeights;
using gpu_test::GpuTest;
using gpu_test::HostWeights;
using gpu_test::Problem;
using gpu_test::SampleOutputs;

class MaterializedSampleTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_EQ(cublasCreate(&cublas_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (cublas_ != nullptr) cublasDestroy(cublas_);
  }
  cublasHandle_t cublas_ = nullptr;
};

struct BaselineCase {
  const char* name;
  CudaWeightDType dtype;
  int64_t vocab, valid_vocab, hidden, batch;
};

class MaterializedVsFusedTest : public MaterializedSampleTest,
                                public ::testing::WithParamInterface<BaselineCase> {};

TEST_P(MaterializedVsFusedTest, SameTokensAsFused) {
  const BaselineCase& c = GetParam();
  const HostWeights w = gpu_test::RandomWeights(c.dtype, c.vocab, c.hidden,
                                                3.0f / std::sqrt(static_cast<float>(c.hidden)), 21);
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  const Problem problem{dw.ptr, w.dtype, c.vocab, c.valid_vocab, c.hidden};
  const auto hidden = gpu_test::RandomMatrix(c.batch, c.hidden, 1.0f, 22, c.dtype);
  const auto params = gpu_test::RandomParams(c.batch, 0.2, 23);

  SampleOutputs fused, materialized;
  ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &fused), KernelStatus::kOk);
  ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &materialized, cublas_),
            KernelStatus::kOk);
  EXPECT_EQ(gpu_test::CountTokenMismatches(materialized.tokens, fused.tokens, w, hidden, params,
                                           1e-3),
            0);
  for (int64_t b = 0; b < c.batch; ++b) {
    const double tol = 1e-4 * std::max(1.0f, std::fabs(fused.logz[b]));
    EXPECT_NEAR(materialized.logz[b], fused.logz[b], tol) << "row " << b;
    if (materialized.tokens[b] == fused.tokens[b]) {
      EXPECT_NEAR(materialized.logprobs[b], fused.logprobs[b], tol) << "row " << b;
    }
  }
  // Without logz / logprobs the tokens stay the same.
  SampleOutputs tokens_only;
  ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, false, &tokens_only, cublas_),
            KernelStatus::kOk);
  EXPECT_EQ(tokens_only.tokens, materialized.tokens);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MaterializedVsFusedTest,
    ::testing::Values(BaselineCase{"bf16", CudaWeightDType::kBFloat16, 5000, 5000, 512, 64},
                      BaselineCase{"fp16", CudaWeightDType::kFloat16, 5000, 5000, 512, 64},
                      BaselineCase{"fp32", CudaWeightDType::kFloat32, 5000, 5000, 512, 64},
                      BaselineCase{"bf16_odd_masked", CudaWeightDType::kBFloat16, 3001, 2999,
                                   1023, 33},
                      BaselineCase{"bf16_B1", CudaWeightDType::kBFloat16, 1000, 1000, 256, 1}),
    [](const ::testing::TestParamInfo<BaselineCase>& info) {
      return std::string(info.param.name);
    });

TEST_F(MaterializedSampleTest, RejectsInvalidArguments) {
  constexpr int64_t kVocab = 100, kHidden = 16, kBatch = 4;
  DeviceBuffer<uint16_t> weight(kVocab * kHidden);
  DeviceBuffer<float> hidden(kBatch * kHidden);
  DeviceBuffer<RowParams> params(kBatch);
  DeviceBuffer<int32_t> tokens(kBatch);
  const size_t ws_bytes =
      MaterializedSampleWorkspaceBytes(kBatch, kVocab, kHidden, CudaWeightDType::kBFloat16);
  ASSERT_GT(ws_bytes, 0u);
  DeviceBuffer<uint8_t> workspace(ws_bytes);
  FS_ASSERT_CUDA(cudaMemset(tokens.data(), 0xff, tokens.bytes()));

  FusedSampleArgs args;
  args.weight = weight.data();
  args.weight_dtype = CudaWeightDType::kBFloat16;
  args.hidden = hidden.data();
  args.params = params.data();
  args.batch = kBatch;
  args.vocab = kVocab;
  args.valid_vocab = kVocab;
  args.hidden_dim = kHidden;
  args.token_ids = tokens.data();
  args.workspace = workspace.data();
  args.workspace_bytes = ws_bytes;

  EXPECT_EQ(LaunchMaterializedSample(args, nullptr, nullptr), KernelStatus::kInvalidArgument);
  FusedSampleArgs small = args;
  small.workspace_bytes = ws_bytes - 1;
  EXPECT_EQ(LaunchMaterializedSample(small, cublas_, nullptr), KernelStatus::kInvalidArgument);
  FusedSampleArgs masked = args;
  masked.valid_vocab = kVocab + 1;
  EXPECT_EQ(LaunchMaterializedSample(masked, cublas_, nullptr), KernelStatus::kInvalidArgument);
  FusedSampleArgs no_tokens = args;
  no_tokens.token_ids = nullptr;
  EXPECT_EQ(LaunchMaterializedSample(no_tokens, cublas_, nullptr), KernelStatus::kInvalidArgument);
  FS_ASSERT_CUDA(cudaDeviceSynchronize());
  for (int32_t t : tokens.Download(kBatch)) EXPECT_EQ(t, -1) << "a rejected launch wrote";
  EXPECT_EQ(MaterializedSampleWorkspaceBytes(0, kVocab, kHidden, CudaWeightDType::kFloat32), 0u);
}

}  // namespace
}  // namespace flashsampler::kernels
