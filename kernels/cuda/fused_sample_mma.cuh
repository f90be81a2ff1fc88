// Tensor-core stage 1 of the fused sampler (fused_sample_mma.cu), used by
// LaunchFusedSample for 16-bit weights and batches of kMmaMinBatch rows or
// more. Internal to kernels/cuda: include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/sample_summary.h"
#include "kernels/cuda/fused_sample.h"

namespace flashsampler::kernels::cuda_internal {

struct MmaControls;  // fused_controls.cuh

// Smallest batch that takes the tensor-core path (below it the CUDA-core
// kernel already reads W once and is at the bandwidth floor).
constexpr int64_t kMmaMinBatch = 3;

// Tokens per workspace tile; the CUDA-core stage 1 uses these or their 64-token
// halves (stage1_shape.h).
constexpr int kMmaTileVocab = 128;

// True when the tensor-core stage 1 can serve the launch: fp16 / bf16
// weights, hidden_dim % 16 == 0, W and H 16-byte aligned (any batch >= 1).
bool MmaStage1Serves(const FusedSampleArgs& args);

// True when LaunchFusedSample picks it by itself (Stage1Kernel::kAuto):
// MmaStage1Serves and batch >= kMmaMinBatch.
bool MmaStage1Eligible(const FusedSampleArgs& args);

// Enqueues kernel 1 of the tensor-core stage 1 alone: H (fp32 [batch,
// hidden_dim]) rounded to the weight dtype (round to nearest even, as the
// host's conversions) into hidden_rounded (batch * hidden_dim 16-bit
// elements, 16-byte aligned; hidden_dim % 16 == 0). The kernel allows a
// programmatic dependent launch (DependentLaunch) to start before it ends; the
// dependent must GridDependencyWait before reading hidden_rounded. Shared with
// the WGMMA stage 1 (fused_sample_sm90.cu), so both GEMMs see the same bits.
cudaError_t LaunchRoundHidden(const FusedSampleArgs& args, unsigned short* hidden_rounded,
                              cudaStream_t stream);

// Enqueues the tensor-core stage 1 (two kernels): H rounded to the weight
// dtype into hidden_rounded (device scratch of batch * hidden_dim 16-bit
// elements, 16-byte aligned), then tile_summaries[row * num_tiles + tile]
// (tiles of kMmaTileVocab tokens, the CUDA-core stage 1's layout) for
// every row and tile. Returns the launch error, if any.
// controls: null for the plain sampler; else the fused controlled path's
// epilogue (fused_controls.cuh) replaces the plain one, for any batch >= 1
// (args.draft_tokens must then be null).
cudaError_t LaunchMmaStage1(const FusedSampleArgs& args, int64_t num_tiles, bool want_lse,
                            SampleSummary* tile_summaries, unsigned short* hidden_rounded,
                            cudaStream_t stream, const MmaControls* controls = nullptr);

}  // namespace flashsampler::kernels::cuda_internal
