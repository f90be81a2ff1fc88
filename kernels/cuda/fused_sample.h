// Fused LM-head sampling on the GPU: one exact sample per row of
// softmax(s_b * H W^T), without ever writing the [batch, vocab] logits to memory.
//
// What it computes. For every row b of H [batch, hidden_dim] (fp32) and the LM
// head W [vocab, hidden_dim] (fp32, fp16 or bf16, row-major), with
// s_b = LogitScale(params[b]) (1/T; 1 for greedy rows) and l'_bi = s_b * (h_b . w_i):
//   token_ids[b] = argmax_{i < valid_vocab} (l'_bi + g_b(i)),
// where g_b(i) = GumbelNoise(seed, offset, stream, i) of the row (the RNG
// contract, kernels/common/gumbel_noise.h) and greedy rows (T = 0) add no noise
// (ties go to the lowest id). Optionally
//   logz[b]     = log sum_{i < valid_vocab} exp(l'_bi),
//   logprobs[b] = l'_{b,token} - logz[b]
// (for greedy rows these are those of softmax(logits), i.e. T = 1).
//
// Why it is exact. argmax_i (l'_i + g_i) with i.i.d. Gumbel(0, 1) noise is a
// sample of softmax(l') (the Gumbel-max trick). Max decomposes over any
// partition of the vocabulary, so each vocabulary tile keeps only its best
// (score, token) per row, and merging the tiles with MergeSummaries
// (kernels/common/sample_summary.h) yields the global winner. The noise is a pure
// function of (seed, offset, stream, token id) computed with the same fp32 code
// (IEEE logf / log1pf) as the CPU backend, and l' is one fp32 multiply of the
// fp32-accumulated dot product by the fp32 reciprocal 1/T. So a row's token does
// not depend on the batch it is in (kAuto keeps every batch of a head on one
// kernel family, see Stage1Kernel), and agrees with the CPU backend
// (kernels/cpu/tiled_sampler.h) up to the fp32 rounding of the dot products,
// i.e. except for near-ties of the two best scores.
//
// How (details next to the launch in fused_sample.cu). Two stage-1 kernels
// by default, a third on request (FusedSampleArgs::stage1 = kWgmma: the
// Hopper WGMMA + TMA kernel of fused_sample_sm90.cu, the same outputs; its
// tile summaries' winner fields may differ where no token of the tile can
// win the row: its cross-tile bound, fused_sample_sm90.cu):
// - tensor cores (fused_sample_mma.cu), for fp16 / bf16 weights,
//   hidden_dim % 16 == 0 and 16-byte aligned W and H, at any batch: H is
//   rounded to the weight dtype once (round to nearest even) into the
//   workspace, then a GEMM-shaped kernel (blocks of 128 tokens x 8..128 rows,
//   W and H tiles through a cp.async ring, mma.sync m16n8k16 with fp32
//   accumulation) folds its accumulators into the tile summaries. W crosses
//   HBM once for batches up to 128 (larger batches re-read it per 128-row
//   chunk, mostly from L2). PRECONDITION for 16-bit weights: the hidden
//   values must be exactly representable in the weight dtype (as the server
//   provides them: it rounds H to the weight dtype) for the results to be those
//   of the CUDA-core path and the CPU backend up to fp32 summation order;
//   otherwise they are those of the rounded H (and values beyond the fp16
//   range become infinite for fp16 weights). Tile summaries, noise, merge
//   order and stage 2 are as below; only the dot products' fp32 summation
//   order differs, so the two paths agree except at near-ties, and each path
//   on its own is batch-invariant.
// - CUDA cores (fused_sample.cu), every other case. Stage 1: one block per
// (vocabulary tile of 64 or 128 tokens, stage1_shape.h; chunk of up to
// 8 rows) streams its tile of W once with 16-byte loads, forms the dot
// products with the rows held in shared memory, adds the noise and reduces
// the tile to one SampleSummary per row in the workspace. Stage 2: one block
// per row merges that row's tile summaries in a fixed order (deterministic:
// identical outputs on every launch).
//
// Preconditions the launcher cannot check (device data): params are validated
// (temperature == 0 or finite > 0; other values are treated like 0 for the
// noise and like the CPU's LogitScale for the scale), and H and W are finite.
// A token whose score is NaN (non-finite weights) is never sampled; a row whose
// every score is NaN gets token -1.
//
// Thread safety: LaunchFusedSample only enqueues work on `stream` and keeps no
// state; concurrent calls are safe when they use distinct workspaces and
// outputs. The workspace and outputs belong to the launch until `stream`
// passes it; inputs must stay unchanged until then.
//
// Outcomes: kOk: the two kernels are enqueued; outputs are valid once the
// stream reaches them. kInvalidArgument: a null pointer, a size out of range, a
// workspace too small or misaligned, or (CUDA-core path only) a hidden_dim too
// large for one block's shared memory (> ~57k fp32 on H100); nothing was enqueued. kDeviceError: a
// CUDA call or a launch failed (errors of the running kernels surface, as
// usual, at the caller's next synchronization).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/kernel_status.h"
#include "kernels/common/row_params.h"
#include "kernels/common/sample_summary.h"
#include "kernels/cuda/hidden_check.h"

namespace flashsampler::kernels {

// Storage type of the LM head on the device.
enum class CudaWeightDType { kFloat32, kFloat16, kBFloat16 };

// The tensor-core stage 1's pipeline at B <= 16 (kernels/cuda/stage1_shape.h):
// the launcher's choice, or forced (tests, benchmarks). Bit-identical outputs.
enum class MmaPipeline : int32_t {
  kAuto = 0,     // MmaDeepPipeline decides
  kShallow = 1,  // 3 blocks per SM, one K step in flight each
  kDeep = 2,     // 1 block per SM, three K steps in flight
};

// Which stage-1 kernel a launch uses (FusedSampleArgs::stage1). Tests and
// benchmarks force one; the server leaves kAuto.
enum class Stage1Kernel : int32_t {
  // A tensor-core kernel wherever one serves (16-bit weights, hidden_dim % 16
  // == 0, 16-byte aligned W and H), at every batch from 1 row: mma.sync up to
  // 15 rows, from 16 rows the WGMMA kernel where it is available
  // (WgmmaStage1Available), with separate epilogue warps
  // (kWgmmaSeparateEpilogue; fused_sample_sm90.cuh). They all
  // give the same bits, so a row's token, log Z and logprob are the same in
  // every batch it can be part of (batch invariance by construction); the
  // price, at 1 row, is at most 0.9% over the CUDA-core kernel (H100,
  // BENCHMARKS.md). The CUDA-core kernel for every other launch.
  kAuto = 0,
  // The mma.sync tensor-core kernel (fused_sample_mma.cu) for any batch >= 1;
  // the 16-bit weight, hidden_dim and alignment conditions above must hold.
  kMmaSync = 1,
  // The Hopper WGMMA + TMA kernel (fused_sample_sm90.cu) for any batch >= 1:
  // the same conditions as kMmaSync, a build with FLASHSAMPLER_CUTLASS and a
  // compute capability 9.0 device (WgmmaStage1Available()).
  kWgmma = 2,
  // The same WGMMA + TMA kernel at two blocks per SM (fused_sample_sm90.cu,
  // "Two blocks per SM"): fewer ring stages and at most 128 rows per block,
  // so one block's epilogue overlaps the other's main loop. The same
  // conditions and the same bits as kWgmma. Not chosen by kAuto since the
  // chunks above 128 rows were balanced (separate epilogue warps 1-10%
  // faster at 136-208 rows, H200, BENCHMARKS.md).
  kWgmmaOverlap = 3,
  // The WGMMA + TMA stage 1 as a persistent ping-pong kernel
  // (fused_sample_sm90.cu, "Ping-pong"): one block per SM whose two consumer
  // warpgroups alternate main loop and epilogue, at most 128 rows a work
  // item. The same conditions and the same bits as kWgmma. Not chosen by
  // kAuto: within 3% of kWgmmaOverlap up to 64 rows, 12-44% slower from 128
  // rows, where it is slower than kWgmma too (its epilogue runs on one
  // warpgroup; H200, BENCHMARKS.md).
  kWgmmaPingpong = 4,
  // The CUDA-core kernel (fused_sample.cu) at any batch, for any weight
  // dtype: kAuto's kernel before it took the tensor cores at 1-2 rows.
  // Its dot products sum in another order than the tensor cores', so its
  // tokens differ from theirs at near-ties and its log Z by rounding.
  // Tests and benchmarks only.
  kCudaCore = 5,
  // The WGMMA + TMA stage 1 with separate epilogue warps
  // (fused_sample_sm90.cu, "Separate epilogue warps"): one persistent block
  // per SM whose two MMA warpgroups go on to the next work item while two
  // other warpgroups fold the last one, at most 128 rows a work item. The
  // same conditions and the same bits as kWgmma. kAuto's choice from 16 to
  // 128 rows, and above at hidden_dim >= 8192 (H100, BENCHMARKS.md).
  kWgmmaSeparateEpilogue = 6,
};

// Whether Stage1Kernel::kWgmma (kWgmmaOverlap, kWgmmaPingpong) can run on the current device: the library was
// built with the CUTLASS-based kernel and the device is compute capability
// 9.0 (sm_90a code runs there only). False when the device query fails.
bool WgmmaStage1Available();

// Bytes per weight element (4 or 2); 0 for an unknown value.
size_t CudaWeightDTypeBytes(CudaWeightDType dtype);

// Rows of a launch's results that stage 2 also writes somewhere else
// (FusedSampleArgs::output_spans): for rows [first_row, first_row + rows),
// the token goes to token_ids[row - first_row], and log Z and the logprob to
// logz / logprobs the same way where those are set. For a caller that wants
// some rows' results in a buffer of its own (a serving engine's CUDA IPC
// output region): the kernel that computes them writes them there, so no
// copy follows the launch. Every pointer is device-accessible and 4-byte
// aligned.
struct OutputSpan {
  int64_t first_row = 0;  // 0 .. batch - 1
  int64_t rows = 0;       // >= 1, first_row + rows <= batch
  int32_t* token_ids = nullptr;  // [rows], required
  float* logz = nullptr;         // [rows], or null; set only with FusedSampleArgs::logz
  float* logprobs = nullptr;     // [rows], or null; set only with FusedSampleArgs::logprobs
};

// Spans a launch takes (by value, in stage 2's kernel parameters: 8 x 40
// bytes). A caller with more rows to place copies the rest itself.
inline constexpr int kMaxOutputSpans = 8;

// H in the weights' own 16-bit dtype, read where it lies (a serving engine's
// rows already on the GPU: a CUDA IPC buffer, an upload), instead of fp32
// rows a widening kernel wrote first. The tensor-core path's first kernel,
// which rounds fp32 H to the weights' dtype into the workspace, then copies
// these rows there instead (a 16-bit value is its own rounding, so every
// output is the one the widened fp32 rows give, bit for bit) and checks them
// on the way: the smallest index of a NaN or infinite element (row * hidden_dim
// + column) reaches the host through `report` (hidden_check.h), and `ride`'s
// bytes are copied by the same kernel, in place of a widening launch's.
// Stage 1 waits for that kernel, so the ride may carry the launch's params.
// A launch with bad rows still runs to the end, its outputs garbage (never a
// fault); the caller reads the report after the stream has passed the
// launch and discards them.
struct HiddenInWeightDType {
  const void* rows = nullptr;  // device [batch, hidden_dim] of weight_dtype, 16-byte aligned
  FirstBadToHost report;       // every pointer required
  RideAlongCopy ride;          // optional; its dst overlaps neither its src, `rows`, the workspace nor the report words
};

struct FusedSampleArgs {
  const void* weight = nullptr;  // device [vocab, hidden_dim], row-major
  CudaWeightDType weight_dtype = CudaWeightDType::kBFloat16;
  // Exactly one of the two: fp32 rows, or (LaunchFusedSample only, on the
  // tensor-core path: FusedSampleReadsHiddenInWeightDType; else
  // InvalidArgument) rows in the weights' 16-bit dtype.
  const float* hidden = nullptr;       // device [batch, hidden_dim] fp32, row-major
  HiddenInWeightDType hidden_in_weight_dtype;
  const RowParams* params = nullptr;   // device [batch]
  int64_t batch = 0;                   // 1 .. INT32_MAX
  int64_t vocab = 0;                   // rows of W, 1 .. INT32_MAX
  int64_t valid_vocab = 0;             // 1 .. vocab; tokens >= valid_vocab are never sampled
  int64_t hidden_dim = 0;              // >= 1
  // The outputs are device-accessible: device memory, or pinned host memory
  // mapped into the device's address space (stage 2 writes each word once
  // and never reads it, so a serving engine's host buffers take the results
  // straight from the kernel, with no copy after it).
  int32_t* token_ids = nullptr;        // [batch]; required unless row_summaries
  float* logz = nullptr;               // [batch], optional
  float* logprobs = nullptr;           // [batch], optional
  void* workspace = nullptr;           // device, >= FusedSampleWorkspaceBytes, 16-byte aligned
  size_t workspace_bytes = 0;
  // Speculative verification (server/engine/engine.h's draft_tokens), optional.
  // draft_tokens: device [batch], a greedy draft token x per row or -1 for a
  // plain row. For a sampled row (T > 0) with x in [0, valid_vocab) the sample
  // excludes x: token = argmax_{i != x} (l'_i + g_i), a sample of the residual
  // softmax(l') restricted to i != x (the Gumbel-max argument over the other
  // tokens), while log Z still counts x. Greedy rows sample as without a draft.
  // draft_logprobs: device-accessible [batch] (stage 1 stores l'_x there and
  // stage 2 reads it back, so mapped host memory costs a word each way),
  // required exactly when draft_tokens is set:
  // l'_x - log Z (greedy rows: at T = 1), NaN for rows without a valid draft.
  // Rows without a draft are unaffected bit for bit. A row whose only token is
  // its draft gets token -1 (no residual exists; its p(x) is 1). Not with
  // vocabulary shards (token_offset != 0 or row_summaries): InvalidArgument.
  const int32_t* draft_tokens = nullptr;
  float* draft_logprobs = nullptr;
  // Vocabulary shards (kernels/cuda/sharded_sample.h). `weight` holds the
  // global tokens [token_offset, token_offset + vocab): token ids, the noise
  // key and the outputs use global ids, so a shard scores its tokens exactly
  // as the whole head would. A multiple of 4 (whole Philox blocks), with
  // token_offset + vocab <= INT32_MAX; 0 for a whole head.
  int64_t token_offset = 0;
  // Optional device [batch]: each row's merged summary over this launch's
  // tokens (global best_index; max_logit / sum_exp only when logz or logprobs
  // is requested). token_ids may be null when this is given.
  SampleSummary* row_summaries = nullptr;
  // Tokens per block of the CUDA-core stage 1: 0 lets the launcher choose 64
  // or 128 for the head (kernels/cuda/stage1_shape.h); 64 or 128 forces
  // one (tests, benchmarks). The token is the same either way, log Z agrees to
  // fp32 rounding. The tensor-core path always uses 128. Other values:
  // InvalidArgument.
  int32_t cuda_core_tile = 0;
  // The tensor-core path's pipeline at B <= 16 (see MmaPipeline). Values
  // outside the enum: InvalidArgument.
  MmaPipeline mma_pipeline = MmaPipeline::kAuto;
  // The stage-1 kernel (see Stage1Kernel). kMmaSync and kWgmma give
  // InvalidArgument, with nothing enqueued, where their conditions do not
  // hold; values outside the enum too. The two tensor-core kernels give the
  // same bits (same operands, same K order on the same tensor-core datapath;
  // fused_sample_sm90_test checks it), and each is batch-invariant.
  Stage1Kernel stage1 = Stage1Kernel::kAuto;
  // Rows whose results stage 2 also writes elsewhere (OutputSpan), the first
  // num_output_spans of output_spans; 0 .. kMaxOutputSpans, each span inside
  // the batch, else InvalidArgument. Spans may overlap (a row is written to
  // each of its spans). Both samplers honour them (LaunchFusedSample and
  // LaunchMaterializedSample, which share stage 2).
  OutputSpan output_spans[kMaxOutputSpans] = {};
  int32_t num_output_spans = 0;
};

// Device scratch a launch needs: one SampleSummary per (row, vocabulary tile),
// then batch * hidden_dim 16-bit elements (H rounded for the tensor cores).
// Pass valid_vocab, or vocab for an upper bound that serves any valid_vocab;
// a workspace sized for (batch, vocab, hidden_dim) serves any smaller batch.
// Returns 0 for sizes out of range.
size_t FusedSampleWorkspaceBytes(int64_t batch, int64_t vocab, int64_t hidden_dim);

// Enqueues stage 1 and stage 2 on `stream` (see the top of this file).
KernelStatus LaunchFusedSample(const FusedSampleArgs& args, cudaStream_t stream);

// Whether LaunchFusedSample would take these args' H from
// hidden_in_weight_dtype: 16-bit weights and a tensor-core stage 1 for the
// batch (args.stage1, the shape, W's alignment). Reads no pointer but weight.
bool FusedSampleReadsHiddenInWeightDType(const FusedSampleArgs& args);

}  // namespace flashsampler::kernels
