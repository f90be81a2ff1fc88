// Materialized baseline: the conventional two-pass way to sample from an LM
// head, kept to measure the fused kernel against and to cross-check it.
//
// What it computes: the same function as LaunchFusedSample (fused_sample.h),
// in two steps that go through device memory:
//   1. cuBLAS writes the full fp32 logits L [batch, valid_vocab] = H W^T
//      (cublasGemmEx, fp32 accumulation). cuBLAS needs both inputs in one type,
//      so for fp16 / bf16 weights the fp32 hidden states are first rounded to
//      the weight type (round to nearest even) into the workspace; for fp32
//      weights they are used as they are (CUBLAS_COMPUTE_32F_PEDANTIC: no TF32).
//   2. Our Gumbel-max kernel reads L and, per row, takes
//      argmax_i (L_bi * LogitScale + GumbelNoise(seed, offset, stream, i)),
//      with the same noise, the same fp32 rounding of l', the same
//      SampleSummary / MergeSummaries reduction and the same second stage as the
//      fused kernel; logz / logprobs likewise.
// Why exact: the Gumbel-max argument of fused_sample.h, applied to L. Tokens
// equal the fused kernel's whenever the two logit computations agree up to
// rounding on the winner, e.g. always when H is exactly representable in the
// weight type and the best two scores of a row are not within rounding.
//
// Thread safety: enqueues work on `stream` and keeps no state, but it binds the
// cuBLAS handle to `stream` (cublasSetStream); a handle must not be used by two
// threads at once. Distinct launches need distinct workspaces and outputs.
// Outcomes: as LaunchFusedSample; kInvalidArgument also for a null handle or
// sizes beyond cuBLAS's int range; kDeviceError also when cuBLAS fails.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/kernel_status.h"
#include "kernels/cuda/fused_sample.h"

namespace flashsampler::kernels {

// Device scratch: the fp32 logits [batch, vocab], the hidden states cast to the
// weight type (16-bit weights only) and one SampleSummary per (row, tile).
// Pass valid_vocab, or vocab for an upper bound. Returns 0 for sizes out of range.
size_t MaterializedSampleWorkspaceBytes(int64_t batch, int64_t vocab, int64_t hidden_dim,
                                        CudaWeightDType weight_dtype);

// Same arguments and outputs as LaunchFusedSample; args.workspace must be
// 256-byte aligned (as cudaMalloc returns) and hold
// MaterializedSampleWorkspaceBytes(batch, valid_vocab, hidden_dim, weight_dtype).
// H comes as fp32 rows (args.hidden) only: hidden_in_weight_dtype set is
// InvalidArgument.
KernelStatus LaunchMaterializedSample(const FusedSampleArgs& args, cublasHandle_t cublas,
                                      cudaStream_t stream);

}  // namespace flashsampler::kernels
