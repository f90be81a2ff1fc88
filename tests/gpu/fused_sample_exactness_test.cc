// Statistical exactness of the fused GPU sampler (kernels/cuda/fused_sample.h):
// the token frequencies match the float64 softmax of the fp32 transformed
// logits (ctest label `gpu`).
//
// Setup: H = e_0 (1 in column 0, zeros elsewhere), so the logits are exactly
// the (bf16) values of W's column 0, whatever the summation order (hidden_dim
// = 1 takes the CUDA-core stage 1, hidden_dim = 16 the tensor-core one); the transformed logit
// l' = logit * LogitScale(T) is formed here with the same single fp32 multiply
// as the kernel. The reference is then the exact softmax of the fp32 values the
// kernel sees. Each launch has many rows that share one seed and offset, with
// stream = row index (independent samples by the RNG contract); more samples
// come from more offsets (one per launch).
//
// Tests per case: chi-square over bins of expected count >= 50 (smaller tokens
// pooled in index order until a pool reaches 50), failing above the
// chi-square quantile at p ~ 1e-6 (Wilson-Hilferty, z = 4.75); and a z-test per
// token with p >= 0.05, failing at |z| > 5. A 2% relative error in such a
// token's probability shifts its count by z = 0.02 sqrt(N p / (1 - p)); the
// test asserts that this is >= 7 for every such token (so the error would be
// caught with probability ~0.98), which is what fixes the sample counts.
// Seeds are fixed, so outcomes are deterministic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "kernels/cuda/fused_sample.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/sample_counts.h"

namespace flashsampler::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::DeviceWeights;
using gpu_test::GpuTest;
using gpu_test::ExpectMatchesSoftmax;
using gpu_test::HostWeights;
using gpu_test::SampleCounts;

class FusedSampleExactnessTest : public GpuTest {};

// V = 64, 2^22 samples in one launch (2^22 rows). Logits -v/8 (7 tokens with
// p >= 0.05 at T = 0.8), two tokens at -20 (pooled), all exact in bf16.
TEST_F(FusedSampleExactnessTest, SmallVocabularyChiSquare) {
  constexpr int64_t kVocab = 64;
  const HostWeights w = gpu_test::MakeWeights(
      CudaWeightDType::kBFloat16, kVocab, 1, [](int64_t v, int64_t) {
        return (v == 13 || v == 40) ? -20.0f : -0.125f * static_cast<float>(v);
      });
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  constexpr float kTemperature = 0.8f;
  const std::vector<int64_t> counts = SampleCounts(dw, w, int64_t{1} << 22, 1, kTemperature, 42);
  ExpectMatchesSoftmax(counts, w, kTemperature);
}

// The tensor-core stage 1 (hidden_dim 16, 2^22 rows in one launch: 128-row
// blocks) with its own epilogue: V = 200, two tiles, the second partial.
// Logits -(v % 50) / 8 plus three heavy tokens on the tile edges (127, 128)
// and at the end (199), all exact in bf16; T = 0.8.
TEST_F(FusedSampleExactnessTest, TensorCorePathChiSquare) {
  HostWeights logits;
  const HostWeights w = gpu_test::TensorCoreChiSquareWeights(CudaWeightDType::kBFloat16, &logits);
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  constexpr float kTemperature = 0.8f;
  const std::vector<int64_t> counts = SampleCounts(dw, w, int64_t{1} << 22, 1, kTemperature, 43);
  ExpectMatchesSoftmax(counts, logits, kTemperature);
}

// V = 151936 (1187 tiles, the last one partial), 2^20 samples (256 launches of
// 4096 rows). Five tokens carry ~97% of the mass (p in 0.13 .. 0.27), placed on
// tile edges and at both ends of the vocabulary; 22 tokens have p ~ 7e-5
// (about 73 samples each, their own bins); the other 151909 tokens share the
// remaining ~2.6% and are pooled.
TEST_F(FusedSampleExactnessTest, LargeVocabularyChiSquare) {
  constexpr int64_t kVocab = 151936;
  const std::vector<std::pair<int64_t, float>> heavy = {
      {0, 10.0f}, {128, 9.75f}, {75000, 10.25f}, {151807, 9.5f}, {151935, 10.0f}};
  const HostWeights w = gpu_test::MakeWeights(
      CudaWeightDType::kBFloat16, kVocab, 1, [&](int64_t v, int64_t) {
        for (const auto& [token, logit] : heavy) {
          if (v == token) return logit;
        }
        if (v % 7000 == 1000) return 2.0f;  // 22 medium tokens: 1000, 8000, ...
        return -4.0f;
      });
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  const std::vector<int64_t> counts = SampleCounts(dw, w, 4096, 256, 1.0f, 7);
  ExpectMatchesSoftmax(counts, w, 1.0f);
}

}  // namespace
}  // namespace flashsampler::kernels
