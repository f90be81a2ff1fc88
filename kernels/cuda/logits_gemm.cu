// The cuBLAS logits GEMM of the materialized paths (logits_gemm.h).
#include "kernels/cuda/logits_gemm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "kernels/cuda/fused_sample_mma.cuh"
#include "kernels/cuda/fused_sample_sm90.cuh"

namespace flashsampler::kernels {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// ---- Hidden states to the weight type (round to nearest even) ------------------------
__device__ __forceinline__ void StoreAs(__nv_bfloat16* out, float x) { *out = __float2bfloat16_rn(x); }
__device__ __forceinline__ void StoreAs(__half* out, float x) { *out = __float2half_rn(x); }

template <class Out>
__global__ void CastHiddenKernel(const float* __restrict__ in, Out* __restrict__ out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    StoreAs(out + i, in[i]);
  }
}

KernelStatus StatusFromCublas(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? KernelStatus::kOk : KernelStatus::kDeviceError;
}

// The fused samplers' view of a GEMM launch: what their stage 1 reads.
FusedSampleArgs Stage1ArgsOf(const void* weight, CudaWeightDType weight_dtype, const float* hidden,
                             int64_t batch, int64_t valid_vocab, int64_t hidden_dim) {
  FusedSampleArgs a;
  a.weight = weight;
  a.weight_dtype = weight_dtype;
  a.hidden = hidden;
  a.batch = batch;
  a.vocab = valid_vocab;
  a.valid_vocab = valid_vocab;
  a.hidden_dim = hidden_dim;
  return a;
}

}  // namespace

size_t LogitsGemmCastBytes(int64_t batch, int64_t hidden_dim, CudaWeightDType weight_dtype) {
  if (weight_dtype == CudaWeightDType::kFloat32 || batch < 1 || hidden_dim < 1) return 0;
  return static_cast<size_t>(batch) * static_cast<size_t>(hidden_dim) * 2;
}

bool LogitsGemmBatchInvariantServes(const void* weight, CudaWeightDType weight_dtype,
                                    const float* hidden, int64_t hidden_dim) {
  return cuda_internal::MmaStage1Serves(Stage1ArgsOf(weight, weight_dtype, hidden, 0, 0, hidden_dim));
}

KernelStatus LaunchLogitsGemm(const LogitsGemmArgs& args, cublasHandle_t cublas,
                              cudaStream_t stream) {
  const bool half_weights = args.weight_dtype != CudaWeightDType::kFloat32;
  const FusedSampleArgs a = Stage1ArgsOf(args.weight, args.weight_dtype, args.hidden, args.batch,
                                         args.valid_vocab, args.hidden_dim);
  // Where our GEMM serves the head, and whether it runs on WGMMA there (one
  // device query; the WGMMA stage 1 serves exactly the launches mma.sync does).
  const bool ours_serves =
      cuda_internal::MmaStage1Serves(a) && reinterpret_cast<uintptr_t>(args.cast_hidden) % 16 == 0;
  const bool wgmma = ours_serves && WgmmaStage1Available();
  bool ours = false;
  switch (args.path) {
    case LogitsGemmPath::kAuto: ours = wgmma; break;
    case LogitsGemmPath::kCublas: ours = false; break;
    case LogitsGemmPath::kBatchInvariant:
      if (!ours_serves) return KernelStatus::kInvalidArgument;
      ours = true;
      break;
    default: return KernelStatus::kInvalidArgument;
  }
  if ((cublas == nullptr && !ours) || args.weight == nullptr || args.hidden == nullptr ||
      args.logits == nullptr || (half_weights && args.cast_hidden == nullptr) ||
      args.batch < 1 || args.batch > kMaxInt32 || args.valid_vocab < 1 ||
      args.valid_vocab > kMaxInt32 || args.hidden_dim < 1 || args.hidden_dim > kMaxInt32 ||
      CudaWeightDTypeBytes(args.weight_dtype) == 0) {
    return KernelStatus::kInvalidArgument;
  }
  if (ours) {
    // The fused samplers' main loop, which rounds H itself into cast_hidden
    // (batch * hidden_dim 16-bit elements: the same buffer size). As their
    // kAuto: WGMMA from kWgmmaMinAutoBatch rows on Hopper, mma.sync below;
    // the same dots either way (fused_sample_sm90_test).
    auto* rounded = static_cast<unsigned short*>(args.cast_hidden);
    cudaError_t err;
#if FLASHSAMPLER_HAVE_CUTLASS
    if (wgmma && a.batch >= cuda_internal::kWgmmaMinAutoBatch) {
      err = cuda_internal::LaunchWgmmaLogits(a, args.logits, args.valid_vocab, rounded, stream);
    } else {
      err = cuda_internal::LaunchMmaLogits(a, args.logits, args.valid_vocab, rounded, stream);
    }
#else
    err = cuda_internal::LaunchMmaLogits(a, args.logits, args.valid_vocab, rounded, stream);
#endif
    return err == cudaSuccess ? KernelStatus::kOk : KernelStatus::kDeviceError;
  }
  // ---- 1. H in the weight type (16-bit weights): a grid-stride cast, 256
  // threads per block, at most 4096 blocks.
  const void* gemm_hidden = args.hidden;
  const int64_t hidden_elems = args.batch * args.hidden_dim;
  const int64_t cast_blocks_needed = (hidden_elems + 255) / 256;
  const unsigned cast_blocks =
      static_cast<unsigned>(cast_blocks_needed < 4096 ? cast_blocks_needed : 4096);
  if (args.weight_dtype == CudaWeightDType::kBFloat16) {
    auto* cast = static_cast<__nv_bfloat16*>(args.cast_hidden);
    CastHiddenKernel<<<cast_blocks, 256, 0, stream>>>(args.hidden, cast, hidden_elems);
    gemm_hidden = cast;
  } else if (args.weight_dtype == CudaWeightDType::kFloat16) {
    auto* cast = static_cast<__half*>(args.cast_hidden);
    CastHiddenKernel<<<cast_blocks, 256, 0, stream>>>(args.hidden, cast, hidden_elems);
    gemm_hidden = cast;
  }
  if (cudaGetLastError() != cudaSuccess) return KernelStatus::kDeviceError;

  // ---- 2. logits [batch, valid_vocab] (row-major) = H W^T. In cuBLAS's
  // column-major terms: C (valid_vocab x batch, ldc = valid_vocab) =
  // op(A) * B with A = W seen as (hidden_dim x vocab, lda = hidden_dim),
  // op = transpose, and B = H seen as (hidden_dim x batch, ldb = hidden_dim).
  cudaDataType_t ab_type = CUDA_R_16BF;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // fp32 accumulation
  if (args.weight_dtype == CudaWeightDType::kFloat16) ab_type = CUDA_R_16F;
  if (args.weight_dtype == CudaWeightDType::kFloat32) {
    ab_type = CUDA_R_32F;
    compute = CUBLAS_COMPUTE_32F_PEDANTIC;  // true fp32, never TF32
  }
  const float alpha = 1.0f;
  const float beta = 0.0f;
  KernelStatus status = StatusFromCublas(cublasSetStream(cublas, stream));
  if (status == KernelStatus::kOk) {
    status = StatusFromCublas(cublasSetPointerMode(cublas, CUBLAS_POINTER_MODE_HOST));
  }
  if (status == KernelStatus::kOk) {
    const int m = static_cast<int>(args.valid_vocab);
    const int n = static_cast<int>(args.batch);
    const int k = static_cast<int>(args.hidden_dim);
    status = StatusFromCublas(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha,
                                           args.weight, ab_type, k, gemm_hidden, ab_type, k,
                                           &beta, args.logits, CUDA_R_32F, m, compute,
                                           CUBLAS_GEMM_DEFAULT));
  }
  return status;
}

}  // namespace flashsampler::kernels
