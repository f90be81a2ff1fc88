// Controlled sampling on the GPU, fused path: the sampling controls of
// kernels/common/row_controls.h applied inside the LM-head matmul, so the
// [batch, vocab] logits never reach device memory (issue 3). Same semantics,
// noise and outputs as the materialized path (controlled_sample.h) and the CPU
// backend (kernels/cpu/candidate_sampler.h), for the rows it serves, with two
// documented numeric differences: summary rows' logz / logprob come from the
// fp32 online log-sum-exp of the plain fused sampler (float64 there), and the
// device's float64 exp / log may differ from glibc's in the last ulp, which
// can move a min_p or top_p cut only when a token sits that close to it.
//
// Which rows (FusedRowKindOf, decided per row from its flattened controls):
//   - candidate rows: top_k in [1, kFusedMaxTopK], with any min_p / top_p,
//     bitmask, bans, bias, penalties, num_samples and top_logprobs in the
//     sampled mode;
//   - summary rows: no filter, no top list, one sample (plain rows and rows
//     with only bitmask / bans / bias / penalties);
//   - every other row (top_p or min_p without top_k, top_k above the limit,
//     several samples or a top list without top_k, raw-mode top lists) is not
//     served: row_status 2, and the caller runs it on the materialized path.
//     A top list without top_k stays out by design: the sampled token's rank
//     (vLLM's: every token at least as likely) needs every logit unless the
//     sample falls inside the list, so a fused attempt would hand the batch
//     back whenever a row samples outside its list (often, on flat rows).
//
// What it computes. Stage 1 is the tensor-core GEMM of the plain fused sampler
// (ControlledSampleArgs::stage1, chosen as FusedSampleArgs::stage1: below 16
// rows fused_sample_mma.cu, blocks of 128 tokens x up to 128 rows; from 16
// rows on Hopper fused_sample_sm90.cu's WGMMA kernel (separate epilogue
// warps), the same dots bit for bit, so the same outputs); its epilogue
// turns each dot into l' exactly as the materialized path does (the allowed
// bitmask and bans give -inf, TouchedLogit for the row's touched tokens, one
// fp32 multiply by 1/T, non-finite -> -inf), then per (row, tile):
//   - summary rows fold (l', l' + Gumbel noise) into a SampleSummary, as the
//     plain sampler does: the Gumbel-max over the processed logits;
//   - candidate rows write the tile's best m = min(top_k, kFusedTileCandidates)
//     tokens in the canonical order (l' desc, id asc) and draw no noise,
//     stopping early at tokens that 64 others of the row already beat (the
//     tile-head bound: fused_controls.cuh, kHeadSlots).
// Stage 2, one block per row: a summary row merges its tiles (token, log Z and
// log-prob under the processed distribution). A candidate row takes the top_k
// tiles by their heads (each tile's best token), then the best top_k of
// their candidates (a radix select each, ties to the lower id): the row's
// global top-k, put in canonical order, then min_p,
// top_p (float64, in canonical order), log Z over the kept set, the samples
// (Gumbel-max over the kept set with the contract's noise), their log-probs
// and ranks, and the top list.
//
// Why exact. The global top-k lies within the top_k tiles ranked by their
// heads: a token among the k best has a tile head at least as good, and at
// most k heads can be that good. Each such tile wrote its m best; if for some
// tile that wrote all m slots (m < top_k) the m-th candidate ranks strictly
// before the k-th found (or fewer than k were found), the tile may hold more
// of them than it wrote: the row gets row_status 2 (the caller re-runs it on
// the materialized path). Otherwise the set found is the true top-k: a
// missing token x would displace some found y, so that tile's last candidate
// would rank before x, x before y, and y no later than the k-th found
// (TileMayHoldMoreOfTopK, kernels/common/candidate_order_key.h, tested on the
// host). With m = top_k (top_k <= kFusedTileCandidates) this never happens.
// The tile-head bound changes none of it: it leaves out only tokens that rank
// after the 64th, never one of the top-k, so every tile that holds one still
// writes it, and a tile left short by the bound is not full and its next
// token ranks after the k-th. Stage 2 may select fewer tiles (a tile whose
// head fell below the bound wrote none and holds none of the top-k), but the
// top-k found and the completeness verdict are those of the unpruned
// candidates (row_status 2 in the same cases), and so is everything after.
// Everything after the top-k is the
// CPU's SampleFromCandidates step for step (same order of float64 sums), so
// both backends agree token for token whenever their logits agree.
//
// Preconditions: 16-bit weights, hidden_dim % 16 == 0, W and H 16-byte
// aligned, valid_vocab <= kFusedMaxVocab (FusedControlledShapeSupported), H
// exactly representable in the weight dtype (as the server provides it;
// fused_sample.h). Controls flattened by FlattenControls (device data the
// launcher cannot check). Draft rows (Verify) are not taken: a launch with
// controls.draft_tokens set is kInvalidArgument (the materialized path serves
// them).
//
// Thread safety: enqueues work on `stream`, keeps no state. Distinct launches
// need distinct workspaces and outputs.
// Outcomes: kOk (enqueued; per-row results in outputs.row_status: 0 served, 1
// no token with a finite l' left, 2 not served here); kInvalidArgument for
// null pointers, sizes out of range, an unsupported shape, a workspace too
// small; kDeviceError when a launch fails.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/host_device.h"
#include "kernels/common/kernel_status.h"
#include "kernels/common/row_params.h"
#include "kernels/cuda/controlled_sample.h"

namespace flashsampler::kernels {

// Largest top_k the fused path serves (issue 3 asks for at least 64).
inline constexpr int32_t kFusedMaxTopK = 64;
// Candidates a tile writes per row: min(top_k, this). Larger values make the
// fallback rarer and cost epilogue work and workspace traffic on every launch.
inline constexpr int kFusedTileCandidates = 16;
// Largest valid vocabulary (tiles of 128 tokens stage 2 holds, 8 a thread).
inline constexpr int64_t kFusedMaxVocab = 2048 * 128;

enum FusedRowKind : int32_t {
  kFusedCandidateRow = 0,
  kFusedSummaryRow = 1,
  kFusedUnservedRow = 2,
};

// row_status value of a row this path did not serve (run it materialized).
inline constexpr int32_t kFusedRowNotServed = 2;

FS_HOST_DEVICE FS_FORCE_INLINE int32_t FusedRowKindOf(const ControlledRowDesc& d) {
  if (d.top_logprobs > 0 && d.logprobs_mode != 0) return kFusedUnservedRow;  // raw mode
  if (d.top_k >= 1 && d.top_k <= kFusedMaxTopK) return kFusedCandidateRow;
  if (d.top_k == 0 && !(d.top_p < 1.0f) && !(d.min_p > 0.0f) && d.top_logprobs == 0 &&
      d.num_samples == 1) {
    return kFusedSummaryRow;
  }
  return kFusedUnservedRow;
}

// True when the fused controlled path can run on this head at all.
bool FusedControlledShapeSupported(CudaWeightDType dtype, int64_t valid_vocab, int64_t hidden_dim);

// Workspace for batches of up to `batch` rows (tile summaries, tile
// candidates, 256 bytes a row of tile-head slots, H rounded to 16 bits). 0
// when out of range.
size_t FusedControlledWorkspaceBytes(int64_t batch, int64_t valid_vocab, int64_t hidden_dim);

// Arguments as for the materialized path (ControlledSampleArgs; W fp16 or
// bf16, H 16-byte aligned, the workspace 256-byte aligned and at least
// FusedControlledWorkspaceBytes); cluster_blocks is not used here.
KernelStatus LaunchFusedControlledSample(const ControlledSampleArgs& args, cudaStream_t stream);

// ---- The two stages apart, for vocabulary shards (sharded_sample.h) --------
// LaunchFusedControlledSample is stage 1 then stage 2 on one device. A
// sharded launcher runs stage 1 on every shard's slice of W (token_offset =
// the shard's first global id, a multiple of 128: its tiles are then the
// whole head's tiles, with global ids in the candidates and summaries),
// copies every shard's tile outputs next to each other in tile order, and
// runs stage 2 once over all of them: the single-GPU result, bit for bit.
//
// Stage 1's outputs per (row, tile): one summary and kFusedTileCandidates
// candidates, FusedControlledTileSummaryBytes() and
// FusedControlledTileCandidateBytes() bytes, stored row-major ([batch,
// tiles] and [batch, tiles, kFusedTileCandidates]) inside the workspace where
// FusedControlledTilesIn says.
struct FusedControlledTiles {
  void* summaries = nullptr;
  void* candidates = nullptr;
  int64_t tiles = 0;  // ceil(valid_vocab / 128)
};
size_t FusedControlledTileSummaryBytes();
size_t FusedControlledTileCandidateBytes();
FusedControlledTiles FusedControlledTilesIn(void* workspace, int64_t batch, int64_t valid_vocab);
// Stage 1 over args' rows of W with global ids from token_offset (args'
// outputs are not used: stage 2 writes them). FusedControlledStage1Valid says
// whether it would take the arguments (a launcher that enqueues work on
// several devices checks them all first); kInvalidArgument when not, which
// includes a token_offset that is not a multiple of 128 or ends past
// kFusedMaxVocab; else as LaunchFusedControlledSample.
bool FusedControlledStage1Valid(const ControlledSampleArgs& args, int64_t token_offset);
KernelStatus LaunchFusedControlledStage1(const ControlledSampleArgs& args, int64_t token_offset,
                                         cudaStream_t stream);
// Stage 2 over `tiles` tiles (at most kFusedMaxVocab / 128) of every row's
// gathered stage-1 outputs, on the device that holds them, params, controls
// and outputs.
KernelStatus LaunchFusedControlledStage2(const void* tile_summaries, const void* tile_candidates,
                                         int64_t tiles, int64_t batch, const RowParams* params,
                                         const ControlledDeviceControls& controls,
                                         const ControlledSampleOutputs& outputs,
                                         cudaStream_t stream);

}  // namespace flashsampler::kernels
