// Tests of kernels/cuda/fused_sample.h on a GPU (ctest label `gpu`):
//   - same tokens as the CPU backend (kernels/cpu/tiled_sampler.h) for the same
//     seeds on >= 99.9% of random rows, logz within 1e-4 relative;
//   - greedy rows are the argmax (ties to the lowest id), mixed with sampled rows;
//   - logz / logprobs against float64;
//   - batch invariance and run-to-run determinism;
//   - awkward sizes: vocab not a multiple of the tile, batch 1 and 257, odd and
//     tiny hidden sizes, misaligned W (scalar path), large hidden sizes (shared
//     memory opt-in), all three weight types, valid_vocab < vocab;
//   - argument validation.
// The statistical exactness tests are in fused_sample_exactness_test.cc.
//
// Where two backends' tokens differ, the difference must be a near-tie of the
// two tokens' float64 scores (fp32 rounding of the dot products can flip
// those); any other difference fails.
#include "kernels/cuda/fused_sample.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/tiled_sampler.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/common/token_panels.h"

namespace flashsampler::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::DeviceWeights;
using gpu_test::GpuTest;
using gpu_test::HostWeights;
using gpu_test::Problem;
using gpu_test::SampleOutputs;

class FusedSampleTest : public GpuTest {};

// Near-tie tolerance for differing tokens (scores are O(10); fp32 dot products
// differ between backends by ~1e-5 at most for these sizes).
constexpr double kTieTolerance = 1e-3;

// Weights with logits of standard deviation ~3 for N(0, 1) hidden states.
float WeightStddev(int64_t hidden) { return 3.0f / std::sqrt(static_cast<float>(hidden)); }

// The CPU backend on the same problem (fp32 weights = the exact widened values).
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

// |a - b| <= rel * max(1, |b|).
void ExpectClose(const std::vector<float>& a, const std::vector<float>& b, double rel,
                 const char* what) {
  ASSERT_EQ(a.size(), b.size());
  int reported = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double tol = rel * std::max(1.0, std::fabs(static_cast<double>(b[i])));
    if (!(std::fabs(static_cast<double>(a[i]) - b[i]) <= tol) && ++reported <= 5) {
      ADD_FAILURE() << what << " row " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  EXPECT_EQ(reported, 0) << what << ": rows out of tolerance";
}

// ---------------------------------------------------------------------------
// (1) Same tokens as the CPU backend on random inputs.
TEST_F(FusedSampleTest, MatchesCpuBackend) {
  constexpr int64_t kVocab = 5000, kHidden = 256, kBatch = 64, kTrials = 32;
  const HostWeights w =
      gpu_test::RandomWeights(CudaWeightDType::kBFloat16, kVocab, kHidden, WeightStddev(kHidden), 1);
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  const Problem problem{dw.ptr, w.dtype, kVocab, kVocab, kHidden};

  int64_t rows = 0, mismatches = 0;
  for (int64_t trial = 0; trial < kTrials; ++trial) {
    const auto hidden = gpu_test::RandomMatrix(kBatch, kHidden, 1.0f, 100 + trial, w.dtype);
    const auto params = gpu_test::RandomParams(kBatch, 0.1, 200 + trial);
    SampleOutputs gpu;
    ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &gpu), KernelStatus::kOk);
    const SampleOutputs cpu = RunCpu(w, kVocab, hidden, params);
    mismatches += gpu_test::CountTokenMismatches(gpu.tokens, cpu.tokens, w, hidden, params,
                                                 kTieTolerance);
    rows += kBatch;
    for (int64_t b = 0; b < kBatch; ++b) {
      const double tol = 1e-4 * std::max(1.0f, std::fabs(cpu.logz[b]));
      const bool logz_ok = std::fabs(gpu.logz[b] - cpu.logz[b]) <= tol;
      const bool logprob_ok = gpu.tokens[b] != cpu.tokens[b] ||
                              std::fabs(gpu.logprobs[b] - cpu.logprobs[b]) <= tol;
      if (logz_ok && logprob_ok) continue;
      // Say which backend is off: the float64 values of this row.
      const float* h = hidden.data() + b * kHidden;
      const double ref_logz = gpu_test::ReferenceLogZ(w, h, params[b], kVocab);
      const double ref_logprob =
          gpu_test::TransformedLogit(w, h, params[b], gpu.tokens[b]) - ref_logz;
      ADD_FAILURE() << "trial " << trial << " row " << b << " token " << gpu.tokens[b]
                    << ": logz GPU " << gpu.logz[b] << " CPU " << cpu.logz[b] << " float64 "
                    << ref_logz << "; logprob GPU " << gpu.logprobs[b] << " CPU "
                    << cpu.logprobs[b] << " float64 " << ref_logprob;
    }
  }
  EXPECT_LE(mismatches * 1000, rows) << mismatches << " of " << rows
                                     << " rows differ from the CPU backend (> 0.1%)";
}

// ---------------------------------------------------------------------------
// (2) Greedy rows (T = 0) in one batch with sampled rows: the argmax of the
// logits, ties to the lowest id; their logz is that of softmax(logits).
TEST_F(FusedSampleTest, GreedyIsArgmax) {
  constexpr int64_t kVocab = 5000, kHidden = 256, kBatch = 64;
  constexpr int64_t kTieA = 10, kTieB = 4000;  // W row kTieB is a copy of row kTieA
  HostWeights w =
      gpu_test::RandomWeights(CudaWeightDType::kBFloat16, kVocab, kHidden, WeightStddev(kHidden), 2);
  std::copy(w.bytes.begin() + kTieA * kHidden * 2, w.bytes.begin() + (kTieA + 1) * kHidden * 2,
            w.bytes.begin() + kTieB * kHidden * 2);
  std::copy(w.values.begin() + kTieA * kHidden, w.values.begin() + (kTieA + 1) * kHidden,
            w.values.begin() + kTieB * kHidden);
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  const Problem problem{dw.ptr, w.dtype, kVocab, kVocab, kHidden};

  auto hidden = gpu_test::RandomMatrix(kBatch, kHidden, 1.0f, 3, w.dtype);
  auto params = gpu_test::RandomParams(kBatch, 0.0, 4);
  for (int64_t b = 0; b < kBatch; b += 2) params[b].temperature = 0.0f;  // even rows greedy
  // Rows 0 and 2 (greedy) point along W row kTieA: rows kTieA and kTieB tie for
  // the maximum with bit-identical dot products, and the lower id must win.
  for (int64_t b : {0, 2}) {
    for (int64_t d = 0; d < kHidden; ++d) hidden[b * kHidden + d] = 8.0f * w.Row(kTieA)[d];
  }

  SampleOutputs gpu;
  ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &gpu), KernelStatus::kOk);
  EXPECT_EQ(gpu.tokens[0], kTieA);
  EXPECT_EQ(gpu.tokens[2], kTieA);
  for (int64_t b = 0; b < kBatch; b += 2) {
    const float* h = hidden.data() + b * kHidden;
    double best = -INFINITY;
    for (int64_t v = 0; v < kVocab; ++v) best = std::max(best, gpu_test::DotDouble(w, h, v));
    const double chosen = gpu_test::DotDouble(w, h, gpu.tokens[b]);
    EXPECT_GE(chosen, best - 1e-4) << "greedy row " << b << " token " << gpu.tokens[b];
    const double logz = gpu_test::ReferenceLogZ(w, h, params[b], kVocab);  // T = 1
    EXPECT_NEAR(gpu.logz[b], logz, 1e-4 * std::max(1.0, std::fabs(logz))) << "row " << b;
  }
  // The other rows of the same batch agree with the CPU backend. (Rows 0 and 2
  // are checked above: the CPU's BLAS may round the two tied dot products
  // differently, so there the CPU need not pick the lower id.)
  SampleOutputs cpu = RunCpu(w, kVocab, hidden, params);
  cpu.tokens[0] = gpu.tokens[0];
  cpu.tokens[2] = gpu.tokens[2];
  EXPECT_EQ(gpu_test::CountTokenMismatches(gpu.tokens, cpu.tokens, w, hidden, params,
                                           kTieTolerance),
            0);
}

// ---------------------------------------------------------------------------
// (4) logz and logprobs against float64 (greedy rows: T = 1); requesting them
// does not change the tokens.
TEST_F(FusedSampleTest, LogZMatchesFloat64) {
  constexpr int64_t kVocab = 5000, kHidden = 256, kBatch = 32;
  const HostWeights w =
      gpu_test::RandomWeights(CudaWeightDType::kBFloat16, kVocab, kHidden, WeightStddev(kHidden), 5);
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  const Problem problem{dw.ptr, w.dtype, kVocab, kVocab, kHidden};
  const auto hidden = gpu_test::RandomMatrix(kBatch, kHidden, 1.0f, 6, w.dtype);
  const auto params = gpu_test::RandomParams(kBatch, 0.25, 7);

  SampleOutputs with_lse, without_lse;
  ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &with_lse), KernelStatus::kOk);
  ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, false, &without_lse), KernelStatus::kOk);
  EXPECT_EQ(with_lse.tokens, without_lse.tokens);
  for (int64_t b = 0; b < kBatch; ++b) {
    const float* h = hidden.data() + b * kHidden;
    const double logz = gpu_test::ReferenceLogZ(w, h, params[b], kVocab);
    const double tol = 1e-4 + 1e-5 * std::fabs(logz);
    EXPECT_NEAR(with_lse.logz[b], logz, tol) << "row " << b << " T=" << params[b].temperature;
    const double logprob =
        gpu_test::TransformedLogit(w, h, params[b], with_lse.tokens[b]) - logz;
    EXPECT_NEAR(with_lse.logprobs[b], logprob, tol) << "row " << b;
    EXPECT_LE(with_lse.logprobs[b], 1e-6f);
  }
}

// ---------------------------------------------------------------------------
// (5) Batch invariance: a row's token, logz and logprob are the same bit for
// bit alone, in a batch of 2, of 3, of 37 (a partial last chunk) and in the
// reversed batch; two identical launches agree bit for bit. Checked on the
// 16-byte path (hidden 256: the tensor cores under kAuto at every batch, and
// the CUDA-core kernel forced) and the scalar path (hidden 1023: CUDA cores).
TEST_F(FusedSampleTest, BatchInvariance) {
  constexpr int64_t kVocab = 3000, kBatch = 37;
  for (const auto& [hidden_dim, stage1] :
       {std::pair<int64_t, Stage1Kernel>{256, Stage1Kernel::kAuto},
        std::pair<int64_t, Stage1Kernel>{256, Stage1Kernel::kCudaCore},
        std::pair<int64_t, Stage1Kernel>{1023, Stage1Kernel::kAuto}}) {
    SCOPED_TRACE("hidden_dim " + std::to_string(hidden_dim) + " stage1 " +
                 std::to_string(static_cast<int>(stage1)));
    const HostWeights w = gpu_test::RandomWeights(CudaWeightDType::kBFloat16, kVocab, hidden_dim,
                                                  WeightStddev(hidden_dim), 8);
    DeviceWeights dw;
    gpu_test::UploadWeights(w, 0, &dw);
    Problem problem{dw.ptr, w.dtype, kVocab, kVocab, hidden_dim};
    problem.stage1 = stage1;
    const auto hidden = gpu_test::RandomMatrix(kBatch, hidden_dim, 1.0f, 9, w.dtype);
    const auto params = gpu_test::RandomParams(kBatch, 0.2, 10);

    SampleOutputs full, again;
    ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &full), KernelStatus::kOk);
    ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &again), KernelStatus::kOk);
    EXPECT_EQ(full.tokens, again.tokens);
    EXPECT_EQ(full.logz, again.logz);  // bit-identical: fixed reduction order
    EXPECT_EQ(full.logprobs, again.logprobs);

    // Sub-batch [first, first + count) in the given order.
    auto run_rows = [&](const std::vector<int64_t>& rows, SampleOutputs* out) {
      std::vector<float> h;
      std::vector<RowParams> p;
      for (int64_t r : rows) {
        h.insert(h.end(), hidden.begin() + r * hidden_dim, hidden.begin() + (r + 1) * hidden_dim);
        p.push_back(params[r]);  // stream stays the row's own: part of its params
      }
      return gpu_test::RunSampler(problem, h, p, true, out);
    };
    // One kernel family for every batch, so every bit agrees (a float
    // compares equal to itself unless NaN; the outputs are finite).
    auto expect_same = [&](const std::vector<int64_t>& rows, const SampleOutputs& out) {
      for (size_t i = 0; i < rows.size(); ++i) {
        const int64_t r = rows[i];
        EXPECT_EQ(out.tokens[i], full.tokens[r]) << "row " << r;
        EXPECT_EQ(out.logz[i], full.logz[r]) << "row " << r;
        EXPECT_EQ(out.logprobs[i], full.logprobs[r]) << "row " << r;
      }
    };
    for (int64_t r = 0; r < kBatch; ++r) {
      SampleOutputs alone;
      ASSERT_EQ(run_rows({r}, &alone), KernelStatus::kOk);
      expect_same({r}, alone);
    }
    SampleOutputs two, three;
    ASSERT_EQ(run_rows({30, 4}, &two), KernelStatus::kOk);
    expect_same({30, 4}, two);
    ASSERT_EQ(run_rows({5, 17, 36}, &three), KernelStatus::kOk);
    expect_same({5, 17, 36}, three);
    std::vector<int64_t> reversed(kBatch);
    for (int64_t i = 0; i < kBatch; ++i) reversed[i] = kBatch - 1 - i;
    SampleOutputs rev;
    ASSERT_EQ(run_rows(reversed, &rev), KernelStatus::kOk);
    expect_same(reversed, rev);
  }
}

// ---------------------------------------------------------------------------
// (5b) Tiles of 64 and 128 tokens on the CUDA-core path (stage1_shape.h):
// the same tokens, log Z and log-probs within fp32 rounding (only the merge
// tree of the log-sum-exp changes); each tile batch-invariant bit for bit; the
// launcher's own choice is one of the two, bit for bit. Heads: D = 4096 bf16
// with 67 tiles on the CUDA-core kernel forced (the rule picks 64 on any GPU
// with 67 or more SMs), fp32 on the scalar path (D = 1023), and bf16 D = 256
// under kAuto, which takes the tensor cores at every batch (the tile does
// not apply: identical bits).
TEST_F(FusedSampleTest, SmallAndLargeTilesGiveTheSameTokens) {
  struct Case {
    CudaWeightDType dtype;
    int64_t vocab, hidden;
    Stage1Kernel stage1;
  };
  for (const Case& c : {Case{CudaWeightDType::kBFloat16, 8453, 4096, Stage1Kernel::kCudaCore},
                        Case{CudaWeightDType::kFloat32, 3001, 1023, Stage1Kernel::kAuto},
                        Case{CudaWeightDType::kBFloat16, 20000, 256, Stage1Kernel::kAuto}}) {
    const HostWeights w =
        gpu_test::RandomWeights(c.dtype, c.vocab, c.hidden, WeightStddev(c.hidden), 41);
    DeviceWeights dw;
    gpu_test::UploadWeights(w, 0, &dw);
    for (int64_t batch : {1, 2, 7}) {
      SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(c.dtype) << " V "
                                        << c.vocab << " D " << c.hidden << " B " << batch);
      const auto hidden = gpu_test::RandomMatrix(batch, c.hidden, 1.0f, 42 + batch, c.dtype);
      const auto params = gpu_test::RandomParams(batch, 0.2, 43 + batch);
      SampleOutputs small, large, chosen;
      Problem problem{dw.ptr, w.dtype, c.vocab, c.vocab, c.hidden};
      problem.stage1 = c.stage1;
      problem.cuda_core_tile = 64;
      ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &small), KernelStatus::kOk);
      problem.cuda_core_tile = 128;
      ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &large), KernelStatus::kOk);
      problem.cuda_core_tile = 0;
      ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &chosen), KernelStatus::kOk);
      EXPECT_EQ(small.tokens, large.tokens);
      ExpectClose(small.logz, large.logz, 2e-5, "logz");
      ExpectClose(small.logprobs, large.logprobs, 2e-5, "logprobs");
      EXPECT_EQ(chosen.tokens, large.tokens);
      EXPECT_TRUE(chosen.logz == small.logz || chosen.logz == large.logz);
      const bool tensor_cores = c.stage1 == Stage1Kernel::kAuto &&
                                c.dtype != CudaWeightDType::kFloat32 && c.hidden % 16 == 0;
      if (tensor_cores) {
        EXPECT_EQ(small.logz, large.logz);
      }
      if (c.hidden == 4096 && batch == 1) {
        int sms = 0;
        ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
        if (sms >= 67) {
          EXPECT_EQ(chosen.logz, small.logz) << sms << " SMs";
        }
      }
      // Small tiles, each row alone: the batch's bits (CUDA-core launches only).
      if (tensor_cores) continue;
      problem.cuda_core_tile = 64;
      for (int64_t r = 0; r < batch; ++r) {
        SampleOutputs alone;
        const std::vector<float> h(hidden.begin() + r * c.hidden, hidden.begin() + (r + 1) * c.hidden);
        ASSERT_EQ(gpu_test::RunSampler(problem, h, {params[r]}, true, &alone), KernelStatus::kOk);
        EXPECT_EQ(alone.tokens[0], small.tokens[r]) << "row " << r;
        EXPECT_EQ(alone.logz[0], small.logz[r]) << "row " << r;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// (6) Awkward sizes, all compared with the CPU backend.
struct SizeCase {
  const char* name;
  CudaWeightDType dtype;
  int64_t vocab, valid_vocab, hidden, batch;
  size_t weight_byte_offset;  // != 0: misaligned W (scalar path)
};

class AwkwardSizeTest : public GpuTest, public ::testing::WithParamInterface<SizeCase> {};

TEST_P(AwkwardSizeTest, MatchesCpuBackend) {
  const SizeCase& c = GetParam();
  const bool masked = c.valid_vocab < c.vocab;
  // Masked cases: positive hidden states and W rows >= valid_vocab of all 4s,
  // so a leaked masked token would win every row by a wide margin.
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, WeightStddev(c.hidden));
  const HostWeights w = gpu_test::MakeWeights(
      c.dtype, c.vocab, c.hidden,
      [&](int64_t v, int64_t) { return v >= c.valid_vocab ? 4.0f : normal(rng); });
  std::vector<float> hidden = gpu_test::RandomMatrix(c.batch, c.hidden, 1.0f, 12);
  if (masked) {
    for (float& x : hidden) x = 0.1f + std::fabs(x);
  }
  gpu_test::RoundInPlace(c.dtype, &hidden);  // the tensor-core path's precondition
  const auto params = gpu_test::RandomParams(c.batch, 0.2, 13);
  DeviceWeights dw;
  gpu_test::UploadWeights(w, c.weight_byte_offset, &dw);
  const Problem problem{dw.ptr, w.dtype, c.vocab, c.valid_vocab, c.hidden};

  SampleOutputs gpu;
  ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &gpu), KernelStatus::kOk);
  for (int32_t t : gpu.tokens) EXPECT_LT(t, c.valid_vocab);
  const SampleOutputs cpu = RunCpu(w, c.valid_vocab, hidden, params);
  const int64_t mismatches =
      gpu_test::CountTokenMismatches(gpu.tokens, cpu.tokens, w, hidden, params, kTieTolerance);
  EXPECT_LE(mismatches * 1000, c.batch) << mismatches << " rows differ from the CPU backend";
  ExpectClose(gpu.logz, cpu.logz, 1e-4, "logz vs CPU");
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, AwkwardSizeTest,
    ::testing::Values(
        SizeCase{"B1_V1000", CudaWeightDType::kBFloat16, 1000, 1000, 256, 1, 0},
        SizeCase{"B257_D1023_masked", CudaWeightDType::kBFloat16, 1000, 937, 1023, 257, 0},
        SizeCase{"V3_fp16", CudaWeightDType::kFloat16, 3, 3, 8, 5, 0},
        SizeCase{"V130_B2", CudaWeightDType::kBFloat16, 130, 130, 64, 2, 0},
        SizeCase{"D1_fp16", CudaWeightDType::kFloat16, 2000, 2000, 1, 3, 0},
        SizeCase{"fp16_vector", CudaWeightDType::kFloat16, 3000, 3000, 512, 4, 0},
        SizeCase{"fp32_masked", CudaWeightDType::kFloat32, 5000, 4999, 100, 9, 0},
        SizeCase{"fp32_D7", CudaWeightDType::kFloat32, 777, 777, 7, 16, 0},
        SizeCase{"misaligned_bf16", CudaWeightDType::kBFloat16, 4096, 4096, 264, 17, 2},
        SizeCase{"misaligned_fp32", CudaWeightDType::kFloat32, 1500, 1500, 64, 8, 4},
        // 1 row per block, 48 KB of rows + the static summaries: needs the opt-in.
        SizeCase{"D12288_B6", CudaWeightDType::kBFloat16, 300, 300, 12288, 6, 0},
        SizeCase{"D16384_B3", CudaWeightDType::kBFloat16, 300, 299, 16384, 3, 0}),
    [](const ::testing::TestParamInfo<SizeCase>& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------
// Argument validation: kInvalidArgument, and nothing is written.
TEST_F(FusedSampleTest, RejectsInvalidArguments) {
  constexpr int64_t kVocab = 100, kHidden = 16, kBatch = 4;
  DeviceBuffer<uint16_t> weight(kVocab * kHidden);
  DeviceBuffer<float> hidden(kBatch * kHidden);
  DeviceBuffer<RowParams> params(kBatch);
  DeviceBuffer<int32_t> tokens(kBatch);
  const size_t ws_bytes = FusedSampleWorkspaceBytes(kBatch, kVocab, kHidden);
  ASSERT_GT(ws_bytes, 0u);
  DeviceBuffer<uint8_t> workspace(ws_bytes + 16);
  FS_ASSERT_CUDA(cudaMemset(tokens.data(), 0xff, tokens.bytes()));

  FusedSampleArgs good;
  good.weight = weight.data();
  good.weight_dtype = CudaWeightDType::kBFloat16;
  good.hidden = hidden.data();
  good.params = params.data();
  good.batch = kBatch;
  good.vocab = kVocab;
  good.valid_vocab = kVocab;
  good.hidden_dim = kHidden;
  good.token_ids = tokens.data();
  good.workspace = workspace.data();
  good.workspace_bytes = ws_bytes;

  const std::vector<std::pair<const char*, std::function<void(FusedSampleArgs&)>>> cases = {
      {"null weight", [](FusedSampleArgs& a) { a.weight = nullptr; }},
      {"null hidden", [](FusedSampleArgs& a) { a.hidden = nullptr; }},
      {"null params", [](FusedSampleArgs& a) { a.params = nullptr; }},
      {"null token_ids", [](FusedSampleArgs& a) { a.token_ids = nullptr; }},
      {"null workspace", [](FusedSampleArgs& a) { a.workspace = nullptr; }},
      {"bad dtype", [](FusedSampleArgs& a) { a.weight_dtype = static_cast<CudaWeightDType>(7); }},
      {"batch 0", [](FusedSampleArgs& a) { a.batch = 0; }},
      {"vocab 0", [](FusedSampleArgs& a) { a.vocab = 0; }},
      {"valid_vocab 0", [](FusedSampleArgs& a) { a.valid_vocab = 0; }},
      {"valid_vocab > vocab", [](FusedSampleArgs& a) { a.valid_vocab = a.vocab + 1; }},
      {"hidden_dim 0", [](FusedSampleArgs& a) { a.hidden_dim = 0; }},
      {"vocab > INT32_MAX", [](FusedSampleArgs& a) { a.vocab = a.valid_vocab = 1ll << 31; }},
      {"workspace too small", [](FusedSampleArgs& a) { a.workspace_bytes -= 1; }},
      {"misaligned workspace",
       [](FusedSampleArgs& a) { a.workspace = static_cast<char*>(a.workspace) + 4; }},
      {"misaligned weight",
       [](FusedSampleArgs& a) { a.weight = static_cast<const char*>(a.weight) + 1; }},
      // 100001 fp32 per row does not fit one block's shared memory (CUDA-core
      // path: hidden_dim % 16 != 0 keeps it off the tensor-core path, which
      // has no such limit).
      {"hidden_dim too large", [](FusedSampleArgs& a) { a.hidden_dim = 100001; }},
      {"cuda_core_tile 96", [](FusedSampleArgs& a) { a.cuda_core_tile = 96; }},
      {"cuda_core_tile -1", [](FusedSampleArgs& a) { a.cuda_core_tile = -1; }},
      {"mma_pipeline 7", [](FusedSampleArgs& a) { a.mma_pipeline = static_cast<MmaPipeline>(7); }},
      // Output spans (OutputSpan): each inside the batch, with a token
      // buffer, log Z / logprobs only where the launch computes them, at
      // most kMaxOutputSpans.
      {"span past the batch", [](FusedSampleArgs& a) { a.output_spans[0] = {kBatch - 1, 2, a.token_ids}; a.num_output_spans = 1; }},
      {"span of 0 rows", [](FusedSampleArgs& a) { a.output_spans[0] = {0, 0, a.token_ids}; a.num_output_spans = 1; }},
      {"span at -1", [](FusedSampleArgs& a) { a.output_spans[0] = {-1, 1, a.token_ids}; a.num_output_spans = 1; }},
      {"span without tokens", [](FusedSampleArgs& a) { a.output_spans[0] = {0, 1, nullptr}; a.num_output_spans = 1; }},
      {"misaligned span", [](FusedSampleArgs& a) {
         a.output_spans[0] = {0, 1, reinterpret_cast<int32_t*>(reinterpret_cast<char*>(a.token_ids) + 2)};
         a.num_output_spans = 1;
       }},
      {"span log Z without the launch's", [](FusedSampleArgs& a) {
         a.output_spans[0] = {0, 1, a.token_ids, reinterpret_cast<float*>(a.token_ids)};
         a.num_output_spans = 1;
       }},
      {"span logprobs without the launch's", [](FusedSampleArgs& a) {
         a.output_spans[0] = {0, 1, a.token_ids, nullptr, reinterpret_cast<float*>(a.token_ids)};
         a.num_output_spans = 1;
       }},
      {"second span past the batch", [](FusedSampleArgs& a) {
         a.output_spans[0] = {0, 1, a.token_ids};
         a.output_spans[1] = {kBatch, 1, a.token_ids};
         a.num_output_spans = 2;
       }},
      {"spans -1", [](FusedSampleArgs& a) { a.num_output_spans = -1; }},
      {"span on a shard", [](FusedSampleArgs& a) {
         a.output_spans[0] = {0, 1, a.token_ids};
         a.num_output_spans = 1;
         a.token_offset = 4;
         a.vocab = a.valid_vocab = kVocab - 4;
       }},
      {"spans kMaxOutputSpans + 1", [](FusedSampleArgs& a) {
         for (OutputSpan& span : a.output_spans) span = {0, 1, a.token_ids};
         a.num_output_spans = kMaxOutputSpans + 1;
       }},
  };
  for (const auto& [name, mutate] : cases) {
    FusedSampleArgs args = good;
    mutate(args);
    EXPECT_EQ(LaunchFusedSample(args, nullptr), KernelStatus::kInvalidArgument) << name;
  }
  FS_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<int32_t> untouched = tokens.Download(kBatch);
  for (int32_t t : untouched) EXPECT_EQ(t, -1) << "a rejected launch wrote an output";
  EXPECT_EQ(FusedSampleWorkspaceBytes(0, kVocab, kHidden), 0u);
  EXPECT_EQ(FusedSampleWorkspaceBytes(kBatch, 0, kHidden), 0u);
  EXPECT_EQ(FusedSampleWorkspaceBytes(kBatch, kVocab, 0), 0u);
}

}  // namespace
}  // namespace flashsampler::kernels
