// Tests of kernels/cuda/logits_gemm.h (ctest label `gpu`), its batch-invariant
// GEMM above all (LogitsGemmPath::kBatchInvariant: the fused samplers' own
// main loop writing its dot products out; mma.sync below 16 rows, WGMMA from
// 16 on Hopper, so a row alone and the same row in a larger batch also
// compare the two kernels):
//  - a row's logits are bit-identical alone and inside batches of 2, 3, 17,
//    64, 128, 255, 256, 512 and 1024 rows with random companions at random
//    places, for bf16 and fp16 heads at the hidden sizes of the 151936- and
//    128256-token heads (D = 4096, 8192; a small vocabulary with a partial
//    last tile keeps the test fast: the order of a dot product depends on D,
//    never on V);
//  - they are the dot products the fused sampler folds: its per-row summary
//    (a launch's row_summaries, T = 1, so l' is the dot itself) has the
//    winner's logit and the row's max logit equal to ours, bit for bit, in
//    launches of 7 rows (mma.sync) and of 100 rows (WGMMA where available);
//  - each logit is within a float64 bound of the exact dot product;
//  - heads it does not serve are refused.
#include "kernels/cuda/logits_gemm.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/sample_summary.h"
#include "kernels/cuda/fused_sample.h"
#include "tests/gpu/gpu_test_util.h"

namespace flashsampler::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::DeviceWeights;
using gpu_test::GpuTest;
using gpu_test::HostWeights;

struct Head {
  int64_t hidden, vocab;
};
const Head kHeads[] = {{4096, 1100}, {8192, 1000}};  // 9 and 8 tiles, the last partial

class BatchInvariantGemmTest : public GpuTest,
                               public ::testing::WithParamInterface<std::tuple<CudaWeightDType, int>> {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (HasFatalFailure()) return;
    const auto [dtype, head] = GetParam();
    dtype_ = dtype;
    hidden_ = kHeads[head].hidden;
    vocab_ = kHeads[head].vocab;
    w_ = gpu_test::RandomWeights(dtype_, vocab_, hidden_, 2.0f / std::sqrt(static_cast<float>(hidden_)),
                                 static_cast<uint32_t>(31 + head));
    gpu_test::UploadWeights(w_, 0, &dw_);
    hidden_dev_.Allocate(static_cast<size_t>(kMaxRows * hidden_));
    cast_.Allocate(LogitsGemmCastBytes(kMaxRows, hidden_, dtype_));
    logits_.Allocate(static_cast<size_t>(kMaxRows * vocab_));
  }

  // Logits of `rows` (row-major [n, hidden_]) by the batch-invariant GEMM.
  std::vector<float> Logits(const std::vector<float>& rows) {
    const int64_t n = static_cast<int64_t>(rows.size()) / hidden_;
    hidden_dev_.Upload(rows);
    LogitsGemmArgs a;
    a.weight = dw_.ptr;
    a.weight_dtype = dtype_;
    a.hidden = hidden_dev_.data();
    a.batch = n;
    a.valid_vocab = vocab_;
    a.hidden_dim = hidden_;
    a.cast_hidden = cast_.data();
    a.logits = logits_.data();
    a.path = LogitsGemmPath::kBatchInvariant;
    EXPECT_EQ(LaunchLogitsGemm(a, nullptr, nullptr), KernelStatus::kOk);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return logits_.Download(static_cast<size_t>(n * vocab_));
  }

  static constexpr int64_t kMaxRows = 1024;
  CudaWeightDType dtype_ = CudaWeightDType::kBFloat16;
  int64_t hidden_ = 0, vocab_ = 0;
  HostWeights w_;
  DeviceWeights dw_;
  DeviceBuffer<float> hidden_dev_;
  DeviceBuffer<uint8_t> cast_;
  DeviceBuffer<float> logits_;
};

TEST_P(BatchInvariantGemmTest, ARowsLogitsAreTheSameInEveryBatch) {
  constexpr int64_t kTestRows = 64;
  const std::vector<float> test =
      gpu_test::RandomMatrix(kTestRows, hidden_, 1.0f, 5, dtype_);  // exact in the weight type
  std::vector<std::vector<float>> alone(kTestRows);
  for (int64_t r = 0; r < kTestRows; ++r) {
    alone[r] = Logits(std::vector<float>(test.begin() + r * hidden_, test.begin() + (r + 1) * hidden_));
    // Each logit against the float64 dot product: the fp32 chain of D
    // products errs by at most D ulps of the running |sum| (a loose bound
    // that still catches a wrong token, row or K step).
    for (int64_t v = 0; v < vocab_; ++v) {
      double exact = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < hidden_; ++k) {
        const double p = static_cast<double>(test[r * hidden_ + k]) * w_.Row(v)[k];
        exact += p;
        magnitude += std::fabs(p);
      }
      const double bound = static_cast<double>(hidden_) * std::ldexp(magnitude, -24);
      ASSERT_LE(std::fabs(alone[r][v] - exact), bound) << "row " << r << " token " << v;
    }
  }
  std::mt19937 gen(77);
  int64_t compared = 0;
  for (int64_t batch : {2, 3, 17, 64, 128, 255, 256, 512, 1024}) {
    // Up to half of a batch's rows are test rows (all 64 from 128 rows on),
    // at random places; the rest are random companions.
    const int64_t per_batch = std::min(kTestRows, std::max<int64_t>(1, batch / 2));
    for (int64_t first = 0; first < kTestRows; first += per_batch) {
      const int64_t count = std::min(per_batch, kTestRows - first);
      std::vector<float> rows = gpu_test::RandomMatrix(batch, hidden_, 1.0f,
                                                       static_cast<uint32_t>(gen()), dtype_);
      std::vector<int64_t> slots(static_cast<size_t>(batch));
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), gen);
      for (int64_t i = 0; i < count; ++i) {
        std::copy(test.begin() + (first + i) * hidden_, test.begin() + (first + i + 1) * hidden_,
                  rows.begin() + slots[i] * hidden_);
      }
      const std::vector<float> got = Logits(rows);
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(0, std::memcmp(got.data() + slots[i] * vocab_, alone[first + i].data(),
                                 sizeof(float) * vocab_))
            << "test row " << first + i << " at slot " << slots[i] << " of a batch of " << batch;
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 9 * kTestRows);
}

TEST_P(BatchInvariantGemmTest, LogitsAreTheDotsTheFusedSamplerFolds) {
  for (int64_t batch : {int64_t{7}, int64_t{100}}) {
    SCOPED_TRACE(::testing::Message() << batch << " rows");
    const std::vector<float> hidden = gpu_test::RandomMatrix(batch, hidden_, 1.0f,
                                                             static_cast<uint32_t>(batch), dtype_);
    const std::vector<float> logits = Logits(hidden);
    // T = 1 (scale 1: l' is the dot product) for sampled rows, greedy every
    // third row.
    std::vector<RowParams> params(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      params[b] = RowParams{b % 3 == 0 ? 0.0f : 1.0f, 1000 + static_cast<uint64_t>(b), 0,
                            static_cast<uint32_t>(b)};
    }
    DeviceBuffer<RowParams> params_dev(params.size());
    params_dev.Upload(params);
    DeviceBuffer<SampleSummary> summaries(static_cast<size_t>(batch));
    DeviceBuffer<float> logz(static_cast<size_t>(batch));
    DeviceBuffer<uint8_t> ws(FusedSampleWorkspaceBytes(batch, vocab_, hidden_));
    hidden_dev_.Upload(hidden);
    FusedSampleArgs a;
    a.weight = dw_.ptr;
    a.weight_dtype = dtype_;
    a.hidden = hidden_dev_.data();
    a.params = params_dev.data();
    a.batch = batch;
    a.vocab = a.valid_vocab = vocab_;
    a.hidden_dim = hidden_;
    a.logz = logz.data();  // so that the summaries carry max_logit
    a.row_summaries = summaries.data();
    a.workspace = ws.data();
    a.workspace_bytes = ws.bytes();
    ASSERT_EQ(LaunchFusedSample(a, nullptr), KernelStatus::kOk);
    FS_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<SampleSummary> s = summaries.Download(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      const float* row = logits.data() + b * vocab_;
      const int64_t argmax = std::max_element(row, row + vocab_) - row;  // first of equals
      ASSERT_GE(s[b].best_index, 0) << "row " << b;
      ASSERT_LT(s[b].best_index, vocab_) << "row " << b;
      EXPECT_EQ(0, std::memcmp(&s[b].best_logit, &row[s[b].best_index], sizeof(float)))
          << "row " << b << " token " << s[b].best_index << ": " << s[b].best_logit << " vs "
          << row[s[b].best_index];
      EXPECT_EQ(0, std::memcmp(&s[b].max_logit, &row[argmax], sizeof(float)))
          << "row " << b << ": " << s[b].max_logit << " vs " << row[argmax];
      if (params[b].temperature == 0.0f) {
        EXPECT_EQ(s[b].best_index, argmax) << "greedy row " << b;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, BatchInvariantGemmTest,
                         ::testing::Combine(::testing::Values(CudaWeightDType::kBFloat16,
                                                              CudaWeightDType::kFloat16),
                                            ::testing::Values(0, 1)));

class LogitsGemmArgsTest : public GpuTest {};

TEST_F(LogitsGemmArgsTest, BatchInvariantRefusesHeadsItDoesNotServe) {
  DeviceBuffer<float> w(64 * 32), h(2 * 32 + 1), logits(2 * 64);
  DeviceBuffer<uint8_t> cast(4096);
  LogitsGemmArgs a;
  a.weight = w.data();
  a.weight_dtype = CudaWeightDType::kFloat32;  // fp32 heads: cuBLAS only
  a.hidden = h.data();
  a.batch = 2;
  a.valid_vocab = 64;
  a.hidden_dim = 32;
  a.cast_hidden = cast.data();
  a.logits = logits.data();
  a.path = LogitsGemmPath::kBatchInvariant;
  EXPECT_FALSE(LogitsGemmBatchInvariantServes(a.weight, a.weight_dtype, a.hidden, a.hidden_dim));
  EXPECT_EQ(LaunchLogitsGemm(a, nullptr, nullptr), KernelStatus::kInvalidArgument);
  a.path = LogitsGemmPath::kAuto;  // an fp32 head: cuBLAS, which needs its handle
  EXPECT_EQ(LaunchLogitsGemm(a, nullptr, nullptr), KernelStatus::kInvalidArgument);
  a.path = static_cast<LogitsGemmPath>(7);
  EXPECT_EQ(LaunchLogitsGemm(a, nullptr, nullptr), KernelStatus::kInvalidArgument);
  a.path = LogitsGemmPath::kBatchInvariant;
  a.weight_dtype = CudaWeightDType::kBFloat16;
  EXPECT_TRUE(LogitsGemmBatchInvariantServes(a.weight, a.weight_dtype, a.hidden, a.hidden_dim));
  a.hidden_dim = 24;  // not a multiple of 16
  EXPECT_EQ(LaunchLogitsGemm(a, nullptr, nullptr), KernelStatus::kInvalidArgument);
  a.hidden_dim = 32;
  a.hidden = h.data() + 1;  // 4-byte aligned only
  EXPECT_EQ(LaunchLogitsGemm(a, nullptr, nullptr), KernelStatus::kInvalidArgument);
  a.hidden = h.data();
  a.path = LogitsGemmPath::kCublas;  // cuBLAS needs its handle
  EXPECT_EQ(LaunchLogitsGemm(a, nullptr, nullptr), KernelStatus::kInvalidArgument);
  FS_ASSERT_CUDA(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace flashsampler::kernels
