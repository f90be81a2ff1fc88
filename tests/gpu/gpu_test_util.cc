#include "tests/gpu/gpu_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/common/gumbel_noise.h"
#include "kernels/common/half_precision.h"
#include "kernels/cuda/materialized_sample.h"

namespace flashsampler::kernels::gpu_test {

void GpuTest::SetUp() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  ASSERT_TRUE(err == cudaSuccess && count > 0)
      << "This is a GPU test (ctest label `gpu`) and no usable CUDA device was found "
         "(cudaGetDeviceCount: "
      << cudaGetErrorString(err) << ", count " << count
      << "). It fails rather than skips on purpose: run it on a GPU machine, or exclude "
         "GPU tests with `ctest -LE gpu`.";
  FS_ASSERT_CUDA(cudaSetDevice(0));
}

namespace {

// Rounds x to `dtype` and returns (bits, exact fp32 value).
float RoundTo(CudaWeightDType dtype, float x, uint8_t* bytes) {
  switch (dtype) {
    case CudaWeightDType::kFloat32:
      std::memcpy(bytes, &x, 4);
      return x;
    case CudaWeightDType::kFloat16: {
      const uint16_t h = FloatToFp16(x);
      std::memcpy(bytes, &h, 2);
      return Fp16ToFloat(h);
    }
    case CudaWeightDType::kBFloat16: {
      const uint16_t h = FloatToBf16(x);
      std::memcpy(bytes, &h, 2);
      return Bf16ToFloat(h);
    }
  }
  return x;
}

}  // namespace

HostWeights MakeWeights(CudaWeightDType dtype, int64_t vocab, int64_t hidden,
                        const std::function<float(int64_t v, int64_t d)>& value) {
  HostWeights w;
  w.dtype = dtype;
  w.vocab = vocab;
  w.hidden = hidden;
  const size_t elem = CudaWeightDTypeBytes(dtype);
  w.bytes.resize(static_cast<size_t>(vocab * hidden) * elem);
  w.values.resize(static_cast<size_t>(vocab * hidden));
  for (int64_t v = 0; v < vocab; ++v) {
    for (int64_t d = 0; d < hidden; ++d) {
      const size_t i = static_cast<size_t>(v * hidden + d);
      w.values[i] = RoundTo(dtype, value(v, d), w.bytes.data() + i * elem);
    }
  }
  return w;
}

HostWeights RandomWeights(CudaWeightDType dtype, int64_t vocab, int64_t hidden, float stddev,
                          uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  return MakeWeights(dtype, vocab, hidden, [&](int64_t, int64_t) { return dist(rng); });
}

void UploadWeights(const HostWeights& w, size_t byte_offset, DeviceWeights* out) {
  out->buffer.Allocate(w.bytes.size() + byte_offset);
  ASSERT_NE(out->buffer.data(), nullptr);
  FS_ASSERT_CUDA(cudaMemcpy(out->buffer.data() + byte_offset, w.bytes.data(), w.bytes.size(),
                            cudaMemcpyHostToDevice));
  out->ptr = out->buffer.data() + byte_offset;
}

std::vector<float> RandomMatrix(int64_t rows, int64_t cols, float stddev, uint32_t seed,
                                CudaWeightDType round_to) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> m(static_cast<size_t>(rows * cols));
  uint8_t scratch[4];
  for (float& x : m) x = RoundTo(round_to, dist(rng), scratch);
  return m;
}

void RoundInPlace(CudaWeightDType dtype, std::vector<float>* values) {
  uint8_t scratch[4];
  for (float& x : *values) x = RoundTo(dtype, x, scratch);
}

std::vector<RowParams> RandomParams(int64_t batch, double greedy_fraction, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> temperature(0.3f, 2.0f);
  std::bernoulli_distribution greedy(greedy_fraction);
  std::vector<RowParams> params(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    RowParams& p = params[b];
    p.temperature = greedy(rng) ? 0.0f : temperature(rng);
    p.seed = rng();
    p.offset = rng() >> 24;
    p.stream = static_cast<uint32_t>(b);
  }
  return params;
}

KernelStatus RunSampler(const Problem& problem, const std::vector<float>& hidden,
                        const std::vector<RowParams>& params, bool want_lse,
                        SampleOutputs* out, cublasHandle_t cublas,
                        const std::vector<int32_t>* drafts) {
  const int64_t batch = static_cast<int64_t>(params.size());
  EXPECT_EQ(hidden.size(), static_cast<size_t>(batch * problem.hidden));
  DeviceBuffer<float> d_hidden(hidden.size());
  DeviceBuffer<RowParams> d_params(params.size());
  DeviceBuffer<int32_t> d_tokens(params.size());
  DeviceBuffer<float> d_logz(params.size());
  DeviceBuffer<float> d_logprobs(params.size());
  DeviceBuffer<int32_t> d_drafts(params.size());
  DeviceBuffer<float> d_draft_logprobs(params.size());
  const size_t ws_bytes =
      cublas != nullptr
          ? MaterializedSampleWorkspaceBytes(batch, problem.valid_vocab, problem.hidden,
                                             problem.dtype)
          : FusedSampleWorkspaceBytes(batch, problem.valid_vocab, problem.hidden);
  EXPECT_GT(ws_bytes, 0u);
  DeviceBuffer<uint8_t> d_workspace(ws_bytes);
  if (d_hidden.data() == nullptr || d_params.data() == nullptr || d_tokens.data() == nullptr ||
      d_logz.data() == nullptr || d_logprobs.data() == nullptr ||
      d_workspace.data() == nullptr || d_drafts.data() == nullptr ||
      d_draft_logprobs.data() == nullptr) {
    return KernelStatus::kOutOfMemory;  // already reported by DeviceBuffer
  }
  d_hidden.Upload(hidden);
  d_params.Upload(params);
  // Poison: token -1, logz / logprob NaN.
  EXPECT_EQ(cudaMemset(d_tokens.data(), 0xff, d_tokens.bytes()), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_logz.data(), 0xff, d_logz.bytes()), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_logprobs.data(), 0xff, d_logprobs.bytes()), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_draft_logprobs.data(), 0xff, d_draft_logprobs.bytes()), cudaSuccess);
  if (drafts != nullptr) {
    EXPECT_EQ(drafts->size(), params.size());
    d_drafts.Upload(*drafts);
  }

  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  FusedSampleArgs args;
  args.weight = problem.weight;
  args.weight_dtype = problem.dtype;
  args.hidden = d_hidden.data();
  args.params = d_params.data();
  args.batch = batch;
  args.vocab = problem.vocab;
  args.valid_vocab = problem.valid_vocab;
  args.hidden_dim = problem.hidden;
  args.cuda_core_tile = problem.cuda_core_tile;
  args.mma_pipeline = problem.mma_pipeline;
  args.stage1 = problem.stage1;
  args.token_ids = d_tokens.data();
  args.logz = want_lse ? d_logz.data() : nullptr;
  args.logprobs = want_lse ? d_logprobs.data() : nullptr;
  args.workspace = d_workspace.data();
  args.workspace_bytes = ws_bytes;
  if (drafts != nullptr) {
    args.draft_tokens = d_drafts.data();
    args.draft_logprobs = d_draft_logprobs.data();
  }
  KernelStatus status = cublas != nullptr ? LaunchMaterializedSample(args, cublas, stream)
                                          : LaunchFusedSample(args, stream);
  const cudaError_t sync = cudaStreamSynchronize(stream);
  EXPECT_EQ(sync, cudaSuccess) << cudaGetErrorString(sync);
  if (sync != cudaSuccess && status == KernelStatus::kOk) status = KernelStatus::kDeviceError;
  cudaStreamDestroy(stream);
  if (status != KernelStatus::kOk) return status;

  out->tokens = d_tokens.Download(params.size());
  out->logz.clear();
  out->logprobs.clear();
  out->draft_logprobs.clear();
  if (drafts != nullptr) out->draft_logprobs = d_draft_logprobs.Download(params.size());
  if (want_lse) {
    out->logz = d_logz.Download(params.size());
    out->logprobs = d_logprobs.Download(params.size());
  }
  int64_t unwritten = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t t = out->tokens[b];
    bool ok = t >= 0 && t < problem.valid_vocab;
    if (want_lse) ok = ok && std::isfinite(out->logz[b]) && std::isfinite(out->logprobs[b]);
    if (!ok && ++unwritten <= 5) {
      ADD_FAILURE() << "row " << b << ": token " << t
                    << (want_lse ? " logz " + std::to_string(out->logz[b]) : std::string())
                    << " (valid_vocab " << problem.valid_vocab << ")";
    }
  }
  EXPECT_EQ(unwritten, 0) << "rows with an unwritten or invalid output";
  return status;
}

double DotDouble(const HostWeights& w, const float* h, int64_t v) {
  const float* row = w.Row(v);
  double dot = 0.0;
  for (int64_t d = 0; d < w.hidden; ++d) dot += static_cast<double>(h[d]) * row[d];
  return dot;
}

double TransformedLogit(const HostWeights& w, const float* h, const RowParams& p, int64_t v) {
  return DotDouble(w, h, v) * static_cast<double>(LogitScale(p));
}

double ReferenceScore(const HostWeights& w, const float* h, const RowParams& p, int64_t v) {
  const double l = TransformedLogit(w, h, p, v);
  if (p.temperature == 0.0f) return l;
  return l + GumbelNoise(p.seed, p.offset, p.stream, static_cast<uint32_t>(v));
}

double ReferenceLogZ(const HostWeights& w, const float* h, const RowParams& p,
                     int64_t valid_vocab) {
  std::vector<double> l(static_cast<size_t>(valid_vocab));
  double m = -INFINITY;
  for (int64_t v = 0; v < valid_vocab; ++v) m = std::max(m, l[v] = TransformedLogit(w, h, p, v));
  double sum = 0.0;
  for (double x : l) sum += std::exp(x - m);
  return m + std::log(sum);
}

int64_t CountTokenMismatches(const std::vector<int32_t>& a, const std::vector<int32_t>& b,
                             const HostWeights& w, const std::vector<float>& hidden,
                             const std::vector<RowParams>& params, double tie_tolerance) {
  EXPECT_EQ(a.size(), b.size());
  int64_t mismatches = 0;
  for (size_t row = 0; row < a.size() && row < b.size(); ++row) {
    if (a[row] == b[row]) continue;
    ++mismatches;
    if (a[row] < 0 || a[row] >= w.vocab || b[row] < 0 || b[row] >= w.vocab) {
      ADD_FAILURE() << "row " << row << ": tokens " << a[row] << " vs " << b[row];
      continue;
    }
    const float* h = hidden.data() + row * w.hidden;
    const double sa = ReferenceScore(w, h, params[row], a[row]);
    const double sb = ReferenceScore(w, h, params[row], b[row]);
    EXPECT_LE(std::fabs(sa - sb), tie_tolerance)
        << "row " << row << ": token " << a[row] << " (score " << sa << ") vs " << b[row]
        << " (score " << sb << ") is not a near-tie";
  }
  return mismatches;
}

}  // namespace flashsampler::kernels::gpu_test
