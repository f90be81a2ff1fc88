// LaunchLogitsGemm: the fp32 logits L [batch, valid_vocab] = H W^T written to
// device memory by cuBLAS, the first step of every materialized CUDA path
// (materialized_sample.h: plain rows; controlled_sample.h: rows with sampling
// controls).
//
// What it computes: cublasGemmEx with fp32 accumulation. cuBLAS needs both
// inputs in one type, so for fp16 / bf16 weights the fp32 hidden states are
// first rounded to the weight type (round to nearest even) into `cast_hidden`;
// for fp32 weights they are used as they are (CUBLAS_COMPUTE_32F_PEDANTIC: no
// TF32). Only the first valid_vocab rows of W are read.
//
// Thread safety: enqueues work on `stream` and binds the cuBLAS handle to it
// (cublasSetStream); a handle must not be used by two threads at once.
// Outcomes: kOk (enqueued); kInvalidArgument for a null pointer, a missing
// cast buffer for 16-bit weights or sizes beyond cuBLAS's int range;
// kDeviceError when a launch or cuBLAS fails.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/kernel_status.h"
#include "kernels/cuda/fused_sample.h"

namespace flashsampler::kernels {

// Bytes of the cast buffer: batch * hidden_dim 16-bit elements for 16-bit
// weights, 0 for fp32 weights.
size_t LogitsGemmCastBytes(int64_t batch, int64_t hidden_dim, CudaWeightDType weight_dtype);

struct LogitsGemmArgs {
  const void* weight = nullptr;  // device [vocab, hidden_dim], row-major
  CudaWeightDType weight_dtype = CudaWeightDType::kBFloat16;
  const float* hidden = nullptr;  // device [batch, hidden_dim] fp32
  int64_t batch = 0;
  int64_t valid_vocab = 0;
  int64_t hidden_dim = 0;
  void* cast_hidden = nullptr;  // device, >= LogitsGemmCastBytes, 16-bit weights only
  float* logits = nullptr;      // device [batch, valid_vocab] fp32, row-major
};

KernelStatus LaunchLogitsGemm(const LogitsGemmArgs& args, cublasHandle_t cublas,
                              cudaStream_t stream);

}  // namespace flashsampler::kernels
