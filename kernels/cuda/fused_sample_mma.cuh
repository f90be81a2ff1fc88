// Tensor-core stage 1 of the fused sampler (fused_sample_mma.cu), used by
// LaunchFusedSample and the fused controlled path for 16-bit weights, and the
// choice between the stage-1 kernels (ChooseStage1). Internal to
// kernels/cuda: include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/sample_summary.h"
#include "kernels/cuda/stage1_shape.h"
#include "kernels/cuda/fused_sample.h"

namespace flashsampler::kernels::cuda_internal {

struct MmaControls;  // fused_controls.cuh

// Tokens per workspace tile; the CUDA-core stage 1 uses these or their 64-token
// halves (stage1_shape.h).
constexpr int kMmaTileVocab = 128;

// True when the tensor-core stage 1 can serve the launch: fp16 / bf16
// weights, hidden_dim % 16 == 0, W and H 16-byte aligned (any batch >= 1).
bool MmaStage1Serves(const FusedSampleArgs& args);

// The stage-1 kernel a launch runs: Stage1Kernel resolved for its head and
// batch. wgmma_schedule (kWgmma, kWgmmaOverlap or kWgmmaPingpong) applies to
// the WGMMA family.
struct Stage1Choice {
  enum Family { kCudaCore, kMmaSync, kWgmma };
  Family family = kCudaCore;
  Stage1Kernel wgmma_schedule = Stage1Kernel::kWgmmaOverlap;
};

// Resolves `requested` for the launch `args` (weights, sizes, pointers,
// batch; fused_sample.cu): kAuto as Stage1Kernel::kAuto says, a forced kernel
// as itself. False when a forced kernel cannot serve the launch (its
// conditions, the build, the device) or `requested` is outside the enum: an
// argument error, never a silent fallback. The fused controlled path makes
// the same choice for its launches.
bool ChooseStage1(const FusedSampleArgs& args, Stage1Kernel requested, Stage1Choice* choice);

// HiddenChunks and RoundedHiddenRows: kernels/cuda/stage1_shape.h.

// Enqueues kernel 1 of the tensor-core stage 1 alone: H (fp32 [batch,
// hidden_dim]) rounded to the weight dtype (round to nearest even, as the
// host's conversions) into hidden_rounded (layout.rows_filled() *
// hidden_dim 16-bit elements, 16-byte aligned; hidden_dim % 16 == 0), laid
// out as `layout` says. The kernel is itself launched as a programmatic
// dependent of the kernel before it on the stream and waits for it at its
// top, before touching memory; then it allows its own programmatic
// dependent (DependentLaunch) to start before it ends, which must
// GridDependencyWait before reading hidden_rounded. Shared with the WGMMA
// stage 1 (fused_sample_sm90.cu), so both GEMMs see the same bits.
// zero_words: null, or args.batch words the kernel sets to 0 (the WGMMA
// sampler's RowBestKeys), under the same wait.
cudaError_t LaunchRoundHidden(const FusedSampleArgs& args, unsigned short* hidden_rounded,
                              cudaStream_t stream, const HiddenChunks& layout,
                              uint32_t* zero_words = nullptr);

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

// Enqueues the tensor-core stage 1's GEMM with its dot products written out
// instead of sampled: H rounded into hidden_rounded as above, then
// logits[row * logits_ld + token] = the fp32 dot product of row and token
// (no scale) for every row < args.batch and token < args.valid_vocab. The
// same kernel, block shapes and K order as LaunchMmaStage1, so these are the
// dots the fused samplers fold, bit for bit, and a row's logits are the same
// in every batch. Reads args.weight, weight_dtype, hidden, batch,
// valid_vocab, hidden_dim and mma_pipeline; MmaStage1Serves(args) must hold.
// logits_ld >= valid_vocab, else cudaErrorInvalidValue.
cudaError_t LaunchMmaLogits(const FusedSampleArgs& args, float* logits, int64_t logits_ld,
                            unsigned short* hidden_rounded, cudaStream_t stream);

}  // namespace flashsampler::kernels::cuda_internal
