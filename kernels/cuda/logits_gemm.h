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
// cuBLAS picks its kernel, tiling and split of K by the shape, so a row's
// logits may round differently with another number of rows beside it. The
// other GEMM here is the fused samplers' own tensor-core main loop, chosen as
// theirs is (fused_sample.h, Stage1Kernel::kAuto): mma.sync below 16 rows
// (fused_sample_mma.cuh: LaunchMmaLogits), WGMMA from 16 on Hopper
// (fused_sample_sm90.cuh: LaunchWgmmaLogits). Both form one fp32 chain of
// k16 products in increasing k for every block shape, with the same bits, so
// a row's logits are bit-identical in every batch, and they are the very dot
// products the fused kernels sample from. It serves fp16 / bf16 weights with
// hidden_dim % 16 == 0 and W and H 16-byte aligned
// (LogitsGemmBatchInvariantServes). LogitsGemmPath says which runs.
//
// Thread safety: enqueues work on `stream` and binds the cuBLAS handle to it
// (cublasSetStream); a handle must not be used by two threads at once.
// Outcomes: kOk (enqueued); kInvalidArgument for a null pointer, a missing
// cast buffer for 16-bit weights, sizes beyond cuBLAS's int range, a null
// cuBLAS handle where cuBLAS runs, kBatchInvariant for a head it does not
// serve, or a path outside the enum; kDeviceError when a launch or cuBLAS
// fails.
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

// Which GEMM LaunchLogitsGemm runs (above).
enum class LogitsGemmPath : int32_t {
  // The fused samplers' GEMM where it runs on WGMMA (a Hopper device, a head
  // it serves): there it is as fast as cuBLAS (the materialized controlled
  // path from H to tokens takes 0.93-1.03x its time on cuBLAS logits at 1 to
  // 256 rows, H100, BENCHMARKS.md) and a row's logits are the same in every
  // batch. cuBLAS elsewhere. The choice depends on the device and the head,
  // never on the batch.
  kAuto = 0,
  // cuBLAS (benchmarks: the comparison).
  kCublas = 1,
  // The fused samplers' GEMM on any device (mma.sync off Hopper, slower than
  // cuBLAS there from a few dozen rows); kInvalidArgument for a head it does
  // not serve. The cuBLAS handle is unused.
  kBatchInvariant = 2,
};

struct LogitsGemmArgs {
  const void* weight = nullptr;  // device [vocab, hidden_dim], row-major
  CudaWeightDType weight_dtype = CudaWeightDType::kBFloat16;
  const float* hidden = nullptr;  // device [batch, hidden_dim] fp32
  int64_t batch = 0;
  int64_t valid_vocab = 0;
  int64_t hidden_dim = 0;
  void* cast_hidden = nullptr;  // device, >= LogitsGemmCastBytes, 16-bit weights only
  float* logits = nullptr;      // device [batch, valid_vocab] fp32, row-major
  LogitsGemmPath path = LogitsGemmPath::kAuto;
};

// Whether the batch-invariant GEMM serves these weights, hidden states and
// hidden_dim (pointers are checked for 16-byte alignment only).
bool LogitsGemmBatchInvariantServes(const void* weight, CudaWeightDType weight_dtype,
                                    const float* hidden, int64_t hidden_dim);

KernelStatus LaunchLogitsGemm(const LogitsGemmArgs& args, cublasHandle_t cublas,
                              cudaStream_t stream);

}  // namespace flashsampler::kernels
