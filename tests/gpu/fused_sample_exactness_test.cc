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
#include "tests/common/goodness_of_fit.h"
#include "tests/gpu/gpu_test_util.h"

namespace flashsampler::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::DeviceWeights;
using gpu_test::GpuTest;
using gpu_test::HostWeights;

class FusedSampleExactnessTest : public GpuTest {};

constexpr double kRequiredShift = 7.0;  // z of a 2% error for p >= 0.05

// Counts of `rows * calls` samples: call c launches `rows` rows with
// RowParams{temperature, seed, offset = c, stream = row}.
std::vector<int64_t> SampleCounts(const DeviceWeights& dw, const HostWeights& w, int64_t rows,
                                  int64_t calls, float temperature, uint64_t seed) {
  std::vector<int64_t> counts(static_cast<size_t>(w.vocab), 0);
  DeviceBuffer<float> d_hidden(rows * w.hidden);
  DeviceBuffer<RowParams> d_params(rows);
  DeviceBuffer<int32_t> d_tokens(rows);
  const size_t ws_bytes = FusedSampleWorkspaceBytes(rows, w.vocab, w.hidden);
  DeviceBuffer<uint8_t> d_workspace(ws_bytes);
  if (d_hidden.data() == nullptr || d_params.data() == nullptr || d_tokens.data() == nullptr ||
      d_workspace.data() == nullptr) {
    return counts;  // reported by DeviceBuffer
  }
  // H = e_0: every logit is W's column 0 exactly, in either stage-1 path.
  std::vector<float> hidden(static_cast<size_t>(rows * w.hidden), 0.0f);
  for (int64_t r = 0; r < rows; ++r) hidden[r * w.hidden] = 1.0f;
  d_hidden.Upload(hidden);
  std::vector<RowParams> params(static_cast<size_t>(rows));

  FusedSampleArgs args;
  args.weight = dw.ptr;
  args.weight_dtype = w.dtype;
  args.hidden = d_hidden.data();
  args.params = d_params.data();
  args.batch = rows;
  args.vocab = w.vocab;
  args.valid_vocab = w.vocab;
  args.hidden_dim = w.hidden;
  args.token_ids = d_tokens.data();
  args.workspace = d_workspace.data();
  args.workspace_bytes = ws_bytes;
  int64_t out_of_range = 0;
  for (int64_t call = 0; call < calls; ++call) {
    for (int64_t r = 0; r < rows; ++r) {
      params[r] = RowParams{temperature, seed, static_cast<uint64_t>(call),
                            static_cast<uint32_t>(r)};
    }
    d_params.Upload(params);
    EXPECT_EQ(cudaMemset(d_tokens.data(), 0xff, d_tokens.bytes()), cudaSuccess);
    const KernelStatus status = LaunchFusedSample(args, nullptr);
    EXPECT_EQ(status, KernelStatus::kOk);
    if (status != KernelStatus::kOk) break;
    const std::vector<int32_t> tokens = d_tokens.Download(rows);  // synchronizes
    for (int32_t t : tokens) {
      if (t >= 0 && t < w.vocab) {
        ++counts[t];
      } else {
        ++out_of_range;
      }
    }
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(out_of_range, 0) << "tokens outside [0, vocab) (or unwritten)";
  return counts;
}

// float64 softmax of the fp32 transformed logits w[v] * LogitScale(T), checked
// with the shared goodness-of-fit test (tests/common/goodness_of_fit.h).
void ExpectMatchesSoftmax(const std::vector<int64_t>& counts, const HostWeights& w,
                          float temperature) {
  const float scale = LogitScale(RowParams{temperature, 0, 0, 0});
  flashsampler::testing::ExpectCountsMatch(
      counts, flashsampler::testing::SoftmaxOfScaled(w.values, w.vocab, scale), kRequiredShift);
}

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
  constexpr int64_t kVocab = 200, kHidden = 16;
  const HostWeights w = gpu_test::MakeWeights(
      CudaWeightDType::kBFloat16, kVocab, kHidden, [](int64_t v, int64_t d) {
        if (d != 0) return 0.25f;  // multiplied by H's zeros
        if (v == 127 || v == 128 || v == 199) return 0.5f;
        return -0.125f * static_cast<float>(v % 50);
      });
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  constexpr float kTemperature = 0.8f;
  const std::vector<int64_t> counts = SampleCounts(dw, w, int64_t{1} << 22, 1, kTemperature, 43);
  std::vector<float> column0(static_cast<size_t>(kVocab));
  for (int64_t v = 0; v < kVocab; ++v) column0[v] = w.values[v * kHidden];
  HostWeights logits = w;
  logits.hidden = 1;
  logits.values = column0;
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
