// Shared helpers of the GPU tests (label `gpu`): the fixture that fails loudly
// without a GPU, device buffers, LM heads in the three weight types with their
// exact fp32 values, runners for the fused and materialized samplers that
// poison the outputs first, and float64 references.
//
// Every test here needs a CUDA device. Started on a machine without one, the
// GpuTest fixture FAILS (it does not skip): a GPU test that silently passes
// proves nothing. Exclude the label instead: `ctest -LE gpu`.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "kernels/common/kernel_status.h"
#include "kernels/common/row_params.h"
#include "kernels/cuda/fused_sample.h"

namespace flashsampler::kernels::gpu_test {

// ASSERT that a CUDA runtime call succeeded, with its error string.
#define FS_ASSERT_CUDA(expr)                                                              \
  do {                                                                                    \
    const cudaError_t fs_err_ = (expr);                                                   \
    ASSERT_EQ(fs_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(fs_err_);      \
  } while (0)

// Base fixture of every GPU test: SetUp fails the test unless a CUDA device is
// usable (and makes device 0 current).
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override;
};

// Owning device allocation of `count` elements of T (cudaMalloc: 256-byte
// aligned). A failed allocation is reported as a test failure and leaves
// data() null.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) { Allocate(count); }
  ~DeviceBuffer() { Release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void Allocate(size_t count) {
    Release();
    count_ = count;
    const cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&ptr_), count * sizeof(T));
    if (err != cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc(" << count * sizeof(T) << "): " << cudaGetErrorString(err);
      ptr_ = nullptr;
      count_ = 0;
    }
  }
  void Release() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    count_ = 0;
  }
  T* data() const { return ptr_; }
  size_t count() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  // Copies host -> device (the whole host vector; it must fit).
  void Upload(const std::vector<T>& host) {
    ASSERT_LE(host.size(), count_);
    const cudaError_t err =
        cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
  }
  std::vector<T> Download(size_t count) const {
    std::vector<T> host(count);
    const cudaError_t err = cudaMemcpy(host.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost);
    EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// An LM head [vocab, hidden] in one weight type: its raw bytes (what the GPU
// reads) and the exact fp32 value of every element (what the CPU reference
// and the float64 references use).
struct HostWeights {
  CudaWeightDType dtype = CudaWeightDType::kBFloat16;
  int64_t vocab = 0;
  int64_t hidden = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
  const float* Row(int64_t v) const { return values.data() + v * hidden; }
};

// W[v][d] = value(v, d) rounded to `dtype` (round to nearest even).
HostWeights MakeWeights(CudaWeightDType dtype, int64_t vocab, int64_t hidden,
                        const std::function<float(int64_t v, int64_t d)>& value);
// Gaussian weights with standard deviation `stddev`.
HostWeights RandomWeights(CudaWeightDType dtype, int64_t vocab, int64_t hidden, float stddev,
                          uint32_t seed);

// The weights on the device, starting `byte_offset` bytes into the allocation
// (a non-zero offset exercises misaligned W, i.e. the scalar path).
struct DeviceWeights {
  DeviceBuffer<uint8_t> buffer;
  const void* ptr = nullptr;
};
void UploadWeights(const HostWeights& w, size_t byte_offset, DeviceWeights* out);

// Gaussian fp32 matrix [rows, cols]; `round_to` (when not kFloat32) rounds
// every value to that type, so the GEMM of the materialized baseline sees the
// same hidden states as the fused kernel.
std::vector<float> RandomMatrix(int64_t rows, int64_t cols, float stddev, uint32_t seed,
                                CudaWeightDType round_to = CudaWeightDType::kFloat32);

// Rounds every value to `dtype` (round to nearest even; kFloat32: unchanged).
// The fused sampler's tensor-core path needs hidden states exactly
// representable in the 16-bit weight dtype (fused_sample.h), as the server
// provides them; tests comparing it with the CPU backend round H this way.
void RoundInPlace(CudaWeightDType dtype, std::vector<float>* values);

// Random per-row params: temperature uniform in [0.3, 2] (or 0 with
// probability greedy_fraction), random seed / offset, stream = row index.
std::vector<RowParams> RandomParams(int64_t batch, double greedy_fraction, uint32_t seed);

struct SampleOutputs {
  std::vector<int32_t> tokens;
  std::vector<float> logz;      // empty unless requested
  std::vector<float> logprobs;  // empty unless requested
  std::vector<float> draft_logprobs;  // empty unless drafts were given
};

// A problem on the device: the weights plus the batch to sample.
struct Problem {
  const void* weight = nullptr;
  CudaWeightDType dtype = CudaWeightDType::kBFloat16;
  int64_t vocab = 0;
  int64_t valid_vocab = 0;
  int64_t hidden = 0;
  int32_t cuda_core_tile = 0;  // FusedSampleArgs::cuda_core_tile (0: the launcher's choice)
  MmaPipeline mma_pipeline = MmaPipeline::kAuto;  // FusedSampleArgs::mma_pipeline
  Stage1Kernel stage1 = Stage1Kernel::kAuto;       // FusedSampleArgs::stage1
};

// Uploads H and params, poisons the outputs (0xff bytes: token -1, NaN),
// launches the fused (or materialized, when cublas != nullptr) sampler on a
// fresh stream, synchronizes, and downloads. Returns the launcher's status
// (kDeviceError as well if the stream reports an error). Fails the test if a
// row's token was not written (still -1 or out of [0, valid_vocab)) or, when
// want_lse, if its logz / logprob is not finite. With `drafts` ([batch], -1 for
// a plain row) the launch verifies those draft tokens (FusedSampleArgs::
// draft_tokens) and out->draft_logprobs is filled.
KernelStatus RunSampler(const Problem& problem, const std::vector<float>& hidden,
                        const std::vector<RowParams>& params, bool want_lse,
                        SampleOutputs* out, cublasHandle_t cublas = nullptr,
                        const std::vector<int32_t>* drafts = nullptr);

// ---- float64 references --------------------------------------------------------
// h . w_v in double.
double DotDouble(const HostWeights& w, const float* h, int64_t v);
// The fp32 transformed logit the samplers form: float(dot) * LogitScale, where
// the dot is taken in double (the samplers' fp32 sum differs by rounding).
double TransformedLogit(const HostWeights& w, const float* h, const RowParams& p, int64_t v);
// TransformedLogit + the row's Gumbel noise (none for greedy rows).
double ReferenceScore(const HostWeights& w, const float* h, const RowParams& p, int64_t v);
// log sum_{v < valid_vocab} exp(TransformedLogit) in double.
double ReferenceLogZ(const HostWeights& w, const float* h, const RowParams& p,
                     int64_t valid_vocab);

// Compares two token vectors of the same batch. A difference is accepted only
// as a near-tie: both tokens' reference scores within tie_tolerance of each
// other (fp32 rounding of the dot products can flip those); any other
// difference fails the test. Returns the number of differing rows.
int64_t CountTokenMismatches(const std::vector<int32_t>& a, const std::vector<int32_t>& b,
                             const HostWeights& w, const std::vector<float>& hidden,
                             const std::vector<RowParams>& params, double tie_tolerance);

}  // namespace flashsampler::kernels::gpu_test
