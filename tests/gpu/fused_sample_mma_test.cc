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
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/common/half_precision.h"
#include "kernels/cpu/tiled_sampler.h"
#include "kernels/cuda/fused_sample.h"
#include "kernels/cuda/materialized_sample.h"
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

// H handed over in the weights' own dtype (FusedSampleArgs::hidden_in_weight_dtype,
// the serving engine's rows read in place) gives the fp32 rows' tokens, log Z
// and logprobs bit for bit, on mma.sync and on the default stage 1 (WGMMA
// from 16 rows on Hopper, with the chunked Hr layouts above 128 rows); the
// ride-along copy delivers the params stage 1 reads (the device params hold
// other rows' values before the launch); the report names the smallest bad
// index, wherever it lies in the batch, and leaves the device words at their
// start values for the next launch (each batch's good launch follows the
// previous batch's bad one).
class FusedSampleHiddenInWeightDTypeTest : public GpuTest {};

TEST_F(FusedSampleHiddenInWeightDTypeTest, GivesTheFp32RowsBitsAndReportsTheFirstBadElement) {
  constexpr int64_t kHiddenDim = 128;
  const auto bits_of = [](CudaWeightDType dtype, float x) {
    return dtype == CudaWeightDType::kBFloat16 ? FloatToBf16(x) : FloatToFp16(x);
  };
  unsigned long long* host_report = nullptr;  // mapped pinned: the ride's source and the report's word
  RowParams* host_params = nullptr;
  constexpr int64_t kMaxBatch = 300;
  FS_ASSERT_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host_report), sizeof(*host_report), cudaHostAllocMapped));
  FS_ASSERT_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host_params), kMaxBatch * sizeof(RowParams),
                               cudaHostAllocMapped));
  unsigned long long* report_on_device = nullptr;
  RowParams* params_on_device = nullptr;
  FS_ASSERT_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&report_on_device), host_report, 0));
  FS_ASSERT_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&params_on_device), host_params, 0));
  gpu_test::DeviceBuffer<unsigned long long> first_bad(1);
  gpu_test::DeviceBuffer<unsigned int> blocks_done(1);
  FS_ASSERT_CUDA(cudaMemset(first_bad.data(), 0xff, first_bad.bytes()));  // kNoBadHiddenElement
  FS_ASSERT_CUDA(cudaMemset(blocks_done.data(), 0, blocks_done.bytes()));
  cudaStream_t stream = nullptr;
  FS_ASSERT_CUDA(cudaStreamCreate(&stream));
  for (CudaWeightDType dtype : {CudaWeightDType::kBFloat16, CudaWeightDType::kFloat16}) {
    const HostWeights w = gpu_test::RandomWeights(dtype, kVocab, kHiddenDim,
                                                  3.0f / std::sqrt(static_cast<float>(kHiddenDim)), 41);
    DeviceWeights dw;
    gpu_test::UploadWeights(w, 0, &dw);
    for (Stage1Kernel stage1 : {Stage1Kernel::kAuto, Stage1Kernel::kMmaSync}) {
      for (int64_t batch : {int64_t{1}, int64_t{5}, int64_t{33}, int64_t{100}, int64_t{160}, kMaxBatch}) {
        SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dtype) << " stage1 "
                                          << static_cast<int>(stage1) << " B " << batch);
        const std::vector<float> hidden = gpu_test::RandomMatrix(batch, kHiddenDim, 1.0f, 50 + batch, dtype);
        const std::vector<RowParams> params = gpu_test::RandomParams(batch, 0.2, 60 + batch);
        const Problem problem{dw.ptr, dtype, kVocab, kValidVocab, kHiddenDim, 0, MmaPipeline::kAuto, stage1};
        SampleOutputs want;
        ASSERT_EQ(gpu_test::RunSampler(problem, hidden, params, true, &want), KernelStatus::kOk);

        std::vector<uint16_t> rows(hidden.size());
        for (size_t i = 0; i < hidden.size(); ++i) rows[i] = bits_of(dtype, hidden[i]);
        gpu_test::DeviceBuffer<uint16_t> d_rows(rows.size());
        gpu_test::DeviceBuffer<RowParams> d_params(batch);
        gpu_test::DeviceBuffer<int32_t> tokens(batch);
        gpu_test::DeviceBuffer<float> logz(batch), logprobs(batch);
        const size_t ws_bytes = FusedSampleWorkspaceBytes(batch, kValidVocab, kHiddenDim);
        gpu_test::DeviceBuffer<uint8_t> workspace(ws_bytes);
        d_rows.Upload(rows);
        // What stage 1 would read without the ride: other rows' params.
        d_params.Upload(gpu_test::RandomParams(batch, 0.5, 70 + batch));
        std::copy(params.begin(), params.end(), host_params);

        FusedSampleArgs args;
        args.weight = dw.ptr;
        args.weight_dtype = dtype;
        args.hidden_in_weight_dtype.rows = d_rows.data();
        args.hidden_in_weight_dtype.report = {first_bad.data(), blocks_done.data(), report_on_device};
        args.hidden_in_weight_dtype.ride = {params_on_device, d_params.data(), batch * sizeof(RowParams)};
        args.params = d_params.data();
        args.batch = batch;
        args.vocab = kVocab;
        args.valid_vocab = kValidVocab;
        args.hidden_dim = kHiddenDim;
        args.stage1 = stage1;
        args.token_ids = tokens.data();
        args.logz = logz.data();
        args.logprobs = logprobs.data();
        args.workspace = workspace.data();
        args.workspace_bytes = ws_bytes;
        ASSERT_TRUE(FusedSampleReadsHiddenInWeightDType(args));
        *host_report = 12345;  // overwritten by the launch's report
        ASSERT_EQ(LaunchFusedSample(args, stream), KernelStatus::kOk);
        FS_ASSERT_CUDA(cudaStreamSynchronize(stream));
        EXPECT_EQ(*host_report, kNoBadHiddenElement);
        EXPECT_EQ(tokens.Download(batch), want.tokens);
        const std::vector<float> got_logz = logz.Download(batch), got_logprobs = logprobs.Download(batch);
        EXPECT_EQ(std::memcmp(got_logz.data(), want.logz.data(), batch * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(got_logprobs.data(), want.logprobs.data(), batch * sizeof(float)), 0);

        // Two bad elements, the later one NaN and the earlier infinite, in
        // the batch's last rows: the earlier is reported.
        const int64_t late = (batch - 1) * kHiddenDim + 77, early = (batch - 1) / 2 * kHiddenDim + 5;
        rows[late] = bits_of(dtype, std::nanf(""));
        rows[early] = bits_of(dtype, -INFINITY);
        d_rows.Upload(rows);
        *host_report = 12345;
        ASSERT_EQ(LaunchFusedSample(args, stream), KernelStatus::kOk);
        FS_ASSERT_CUDA(cudaStreamSynchronize(stream));
        EXPECT_EQ(*host_report, static_cast<unsigned long long>(early));
        EXPECT_EQ(first_bad.Download(1)[0], kNoBadHiddenElement) << "the device word was not reset";
        EXPECT_EQ(blocks_done.Download(1)[0], 0u) << "the block count was not reset";
      }
    }
  }
  FS_ASSERT_CUDA(cudaStreamDestroy(stream));
  FS_ASSERT_CUDA(cudaFreeHost(host_params));
  FS_ASSERT_CUDA(cudaFreeHost(host_report));
}

// Arguments of H in the weights' dtype: exactly one H, 16-bit weights, a
// 16-byte aligned source, a whole report, a ride that overlaps nothing, a
// tensor-core stage 1; the materialized sampler refuses it. Nothing is
// enqueued for a refused launch.
TEST_F(FusedSampleHiddenInWeightDTypeTest, RejectsWhatItCannotServe) {
  constexpr int64_t kBatch = 4, kHiddenDim = 64;
  gpu_test::DeviceBuffer<uint16_t> weight(kVocab * kHiddenDim), rows(kBatch * kHiddenDim + 8);
  gpu_test::DeviceBuffer<RowParams> params(kBatch);
  gpu_test::DeviceBuffer<int32_t> tokens(kBatch);
  gpu_test::DeviceBuffer<unsigned long long> words(2);
  gpu_test::DeviceBuffer<unsigned int> blocks_done(1);
  const size_t ws_bytes = FusedSampleWorkspaceBytes(kBatch, kVocab, kHiddenDim);
  gpu_test::DeviceBuffer<uint8_t> workspace(ws_bytes);
  FS_ASSERT_CUDA(cudaMemset(tokens.data(), 0xff, tokens.bytes()));
  gpu_test::DeviceBuffer<float> fp32_hidden(kBatch * kHiddenDim);
  FusedSampleArgs good;
  good.weight = weight.data();
  good.weight_dtype = CudaWeightDType::kBFloat16;
  good.hidden_in_weight_dtype.rows = rows.data();
  // The report's host word: device memory serves here (nothing is launched).
  good.hidden_in_weight_dtype.report = {words.data(), blocks_done.data(), words.data() + 1};
  good.params = params.data();
  good.batch = kBatch;
  good.vocab = kVocab;
  good.valid_vocab = kVocab;
  good.hidden_dim = kHiddenDim;
  good.token_ids = tokens.data();
  good.workspace = workspace.data();
  good.workspace_bytes = ws_bytes;
  ASSERT_TRUE(FusedSampleReadsHiddenInWeightDType(good));
  const std::vector<std::pair<const char*, std::function<void(FusedSampleArgs&)>>> cases = {
      {"both H", [&](FusedSampleArgs& a) { a.hidden = fp32_hidden.data(); }},
      {"fp32 weights", [](FusedSampleArgs& a) { a.weight_dtype = CudaWeightDType::kFloat32; }},
      {"misaligned rows", [&](FusedSampleArgs& a) { a.hidden_in_weight_dtype.rows = rows.data() + 4; }},
      {"no report word", [](FusedSampleArgs& a) { a.hidden_in_weight_dtype.report.first_bad = nullptr; }},
      {"no block count", [](FusedSampleArgs& a) { a.hidden_in_weight_dtype.report.blocks_done = nullptr; }},
      {"no host word", [](FusedSampleArgs& a) { a.hidden_in_weight_dtype.report.first_bad_host = nullptr; }},
      {"ride onto the rows", [&](FusedSampleArgs& a) {
         a.hidden_in_weight_dtype.ride = {params.data(), rows.data() + 8, sizeof(RowParams)};
       }},
      {"ride onto the workspace", [&](FusedSampleArgs& a) {
         a.hidden_in_weight_dtype.ride = {params.data(), workspace.data(), sizeof(RowParams)};
       }},
      {"ride of 2 bytes", [&](FusedSampleArgs& a) { a.hidden_in_weight_dtype.ride = {params.data(), tokens.data(), 2}; }},
      {"CUDA-core stage 1", [](FusedSampleArgs& a) { a.stage1 = Stage1Kernel::kCudaCore; }},
  };
  for (const auto& [name, mutate] : cases) {
    FusedSampleArgs args = good;
    mutate(args);
    EXPECT_EQ(LaunchFusedSample(args, nullptr), KernelStatus::kInvalidArgument) << name;
  }
  FusedSampleArgs cuda_core = good;
  cuda_core.stage1 = Stage1Kernel::kCudaCore;
  EXPECT_FALSE(FusedSampleReadsHiddenInWeightDType(cuda_core));
  FusedSampleArgs fp32_weights = good;
  fp32_weights.weight_dtype = CudaWeightDType::kFloat32;
  EXPECT_FALSE(FusedSampleReadsHiddenInWeightDType(fp32_weights));
  cublasHandle_t cublas = nullptr;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  gpu_test::DeviceBuffer<uint8_t> materialized_workspace(
      MaterializedSampleWorkspaceBytes(kBatch, kVocab, kHiddenDim, CudaWeightDType::kBFloat16));
  FusedSampleArgs materialized = good;
  materialized.workspace = materialized_workspace.data();
  materialized.workspace_bytes = materialized_workspace.bytes();
  EXPECT_EQ(LaunchMaterializedSample(materialized, cublas, nullptr), KernelStatus::kInvalidArgument);
  cublasDestroy(cublas);
  FS_ASSERT_CUDA(cudaDeviceSynchronize());
  for (int32_t t : tokens.Download(kBatch)) EXPECT_EQ(t, -1) << "a rejected launch wrote an output";
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
