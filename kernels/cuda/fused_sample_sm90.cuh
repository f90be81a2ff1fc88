// Hopper (sm_90a) WGMMA + TMA stage 1 of the fused sampler
// (fused_sample_sm90.cu), selected by FusedSampleArgs::stage1 = kWgmma. Built
// only with FLASHSAMPLER_CUTLASS (CMake defines FLASHSAMPLER_HAVE_CUTLASS=1 on
// kernels/cuda then). Internal to kernels/cuda: include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/sample_summary.h"
#include "kernels/cuda/fused_sample.h"

namespace flashsampler::kernels::cuda_internal {

struct MmaControls;  // fused_controls.cuh

// Stage1Kernel::kAuto takes the WGMMA kernel for batches of at least this
// many rows, where it measured at least as fast as mma.sync: with separate
// epilogue warps (128-element K steps) 0.4-5% faster from 16 to 31 rows on an
// H100 (both shapes), equal to 1% faster at 16 rows and 6-10% at 24 on an
// H200; at 8 rows mma.sync was 2-3% faster there (2026-11-26).
constexpr int64_t kWgmmaMinAutoBatch = 16;

// Which WGMMA schedule kAuto takes (from kWgmmaMinAutoBatch rows), for plain
// sampling and the fused controlled path alike: separate epilogue warps
// (kWgmmaSeparateEpilogue) at every batch. Up to 128 rows it measured
// 0.84-0.98 of two blocks per SM on both shapes (2026-11-26); from 224 rows
// 0.87-1.00 (2026-11-28, 11 epilogue warps, H100), except 1.05 for the
// controlled path at 1024 rows. Two blocks per SM were ahead at 129-192 rows
// at D = 4096 until the chunks above 128 rows were balanced (HiddenChunks,
// 2026-11-28): now separate / two blocks per SM is 0.92-0.99 plain at
// 136-208 rows and 0.90-0.95 for the controlled path (H200, BENCHMARKS.md,
// "Chunks of the batch above 128 rows"). All schedules give the same bits.

// True when the WGMMA stage 1 can serve `args` (the sizes and pointers only;
// the device is WgmmaStage1Available's check): fp16 / bf16 weights,
// hidden_dim % 16 == 0 (TMA needs 16-byte row pitches; 16 keeps the
// precondition of the mma.sync path, so both serve the same launches), W
// 16-byte aligned (a TMA base address) and H 16-byte aligned (the rounding
// kernel's float4 loads). The workspace's rounded H is 16-byte aligned by the
// workspace layout. Any batch >= 1.
bool WgmmaStage1Eligible(const FusedSampleArgs& args);

// Enqueues the WGMMA stage 1: H rounded to the weight dtype into
// hidden_rounded (LaunchRoundHidden, fused_sample_mma.cuh), then
// tile_summaries[row * num_tiles + tile] for every row < batch and every
// 128-token tile < num_tiles (= ceil(valid_vocab / 128)), exactly the layout
// and the per-tile fold of LaunchMmaStage1, so LaunchMergeTileSummaries
// (stage 2) is shared. Returns the first CUDA error; cudaErrorNotSupported
// when the current device is not compute capability 9.0. variant: which
// schedule, all with the same bits: kWgmmaOverlap (two blocks per SM),
// kWgmmaPingpong (persistent ping-pong), kWgmmaSeparateEpilogue (persistent,
// separate epilogue warps), anything else one block per SM
// (kWgmma's). controls: as LaunchMmaStage1's (the fused controlled path's
// epilogue, the same bits as mma.sync's), not with kWgmmaPingpong
// (cudaErrorInvalidValue: its epilogue is built plain only).
// row_best_keys: null, or device scratch of args.batch words for the
// cross-tile bound of the plain sampler's pruned fold (fused_sample_sm90.cu,
// "The cross-tile bound"; zeroed here, by the rounding kernel). With it,
// the schedules that prune (all but kWgmma) may leave a tile's winner
// fields empty, or at a token that is not the tile's best, where no token
// of the tile can win the row; the merged row (stage 2) is unchanged, bit
// for bit. Used only where it pays: batches of more than 128 rows and
// hidden_dim below 8192, and never with controls.
cudaError_t LaunchWgmmaStage1(const FusedSampleArgs& args, int64_t num_tiles, bool want_lse,
                              SampleSummary* tile_summaries, unsigned short* hidden_rounded,
                              cudaStream_t stream, Stage1Kernel variant,
                              const MmaControls* controls = nullptr,
                              uint32_t* row_best_keys = nullptr);

// LaunchMmaLogits (fused_sample_mma.cuh) on the WGMMA main loop (one block
// per SM, kWgmma's schedule): logits[row * logits_ld + token] = the fp32 dot
// of row and token for every row < args.batch and token < args.valid_vocab,
// the dots the WGMMA samplers fold, bit for bit, which are mma.sync's
// (fused_sample_sm90_test). WgmmaStage1Eligible(args) must hold;
// cudaErrorNotSupported off compute capability 9.0, cudaErrorInvalidValue
// for logits_ld < valid_vocab.
cudaError_t LaunchWgmmaLogits(const FusedSampleArgs& args, float* logits, int64_t logits_ld,
                              unsigned short* hidden_rounded, cudaStream_t stream);

}  // namespace flashsampler::kernels::cuda_internal
