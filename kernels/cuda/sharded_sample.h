// Sharded sampling: one exact sample per row of softmax(s_b * H W^T) with W
// split by vocabulary over the local GPUs (the paper's distributed
// group-Gumbel reduction, Algorithm B.4). One process, one CUDA stream per GPU
// and, for the NCCL exchange, one communicator per GPU (rank k = shard k,
// ncclCommInitAll).
//
// What it computes. Shard k holds the global tokens [begin_k, end_k) of W (a
// contiguous range; shards in token order, uneven sizes allowed) and runs the
// single-GPU sampler on its slice (LaunchFusedSample, or the cuBLAS
// materialized path) with FusedSampleArgs::token_offset = begin_k, so the
// noise of every token is keyed by its GLOBAL id and the shard's per-row
// SampleSummary names global ids. One NCCL all-gather then exchanges the
// per-row summaries (batch * shards * sizeof(SampleSummary) bytes, never the
// [batch, vocab] logits), and a small kernel on shard 0's GPU merges each row's
// shard summaries with MergeShardSummaries (kernels/common/shard_merge.h):
//   token_ids[b] = the merged winner, logz[b] = logsumexp_k L_k,
//   logprobs[b] = l'_{b,token} - logz[b],
// all on shard 0's device. In ShardMergeMode::kExact the token is pathwise the
// one a single GPU gives for the same seeds (max decomposes over the shards
// and the noise does not depend on the split), and log Z agrees up to fp32
// rounding (a different merge tree). kGroupGumbel picks the shard with a fresh
// Gumbel over the log-masses (exact in distribution, not pathwise).
//
// Shard boundaries must be multiples of 4 (whole Philox blocks; the server
// uses multiples of 128, the kernels' largest tile, so a shard's tiles are
// the single-GPU tiles wherever both launches pick the same tile size,
// stage1_shape.h; the tokens do not depend on the tile either way, only
// log Z's rounding does). Tokens >= valid_vocab are never sampled: a shard's
// valid_vocab counts its own valid rows (>= 1: a shard holding only padding is
// not allowed, drop it instead).
//
// Two ways to exchange the summaries (ShardExchange, shard_exchange.h).
// kNcclAllGather: the all-gather above, through each shard's communicator.
// kPeerWrite: only shard 0 needs the summaries, so each shard's sampler stores its row summaries
// straight into its slot of shard 0's exchange buffer (a store over NVLink /
// PCIe from the kernel's last stage, 20 bytes a row), records an event, and
// shard 0's stream waits for every shard's event before the merge: no
// collective, no copy, one cross-GPU event wait per shard. The kernels are
// the same and write the same summaries to the same layout, so both
// exchanges give the same bits. kPeerWrite needs peer access from every
// shard's GPU to GPU devices[0].device enabled by the caller
// (cudaDeviceEnablePeerAccess), or shards on that same GPU; the communicators
// are not used (they may be null), so it also runs several shards on one GPU.
// With kPeerWrite a shard's next launch writes into shard 0's buffer without
// waiting for shard 0's stream: the caller must wait for every shard
// (WaitForShards) before launching again, or order the shards' streams after
// shard 0's itself (the benchmark records an event on shard 0's stream first
// and makes every other stream wait for it).
//
// Failure and hangs. A launch or NCCL error while enqueuing returns
// kDeviceError before any later shard's collective is enqueued where possible
// (kernel launches of all shards come first, the all-gather is one NCCL group).
// A device that faults mid-run would leave its peers waiting in the
// all-gather forever; WaitForShards therefore polls with a deadline and, on a
// device error, an NCCL async error or the deadline, aborts every
// communicator (ncclCommAbort), after which the group is unusable (the server
// marks itself NOT_SERVING). With kPeerWrite there is no collective to abort:
// a shard that faults leaves shard 0's stream waiting on its event, and
// WaitForShards reports the fault (or the deadline) the same way; the GPUs
// need a new process either way, as after any device fault.
//
// Rows with sampling controls or draft tokens (LaunchShardedControlledSample).
// The controls (top-k / top-p / min-p cuts, penalties, masks, top lists, the
// verification of a draft) need every kept token's logit in one place, so
// here the shards exchange logits, not summaries: for each chunk of at most
// kControlledChunkRows rows, shard k writes its slice [rows, end_k - begin_k]
// with cuBLAS (LaunchLogitsGemm) on its stream, shard 0's stream waits for it
// (an event) and copies it into columns [begin_k, end_k) of one [rows,
// valid_vocab] buffer on its GPU (cudaMemcpy3DPeerAsync: NVLink / PCIe peer
// copies where the GPUs can reach each other, staged by the driver
// otherwise), and the materialized controlled sampler
// (controlled_sample.h, LaunchControlledChunkFromLogits) samples the chunk on
// GPU 0 with the global token ids. So the results are exactly those of
// LaunchControlledSample on one GPU for the same raw logits (the noise, the
// cuts and the sums do not depend on the split); only cuBLAS may round a
// logit differently for another GEMM shape. Bytes moved: rows * valid_vocab *
// 4 per chunk, which is why plain rows keep the summary exchange above.
//
// Thread safety: not thread-safe for one ShardGroup (its streams, communicators
// and buffers belong to one caller at a time); it changes the calling thread's
// current CUDA device.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/kernel_status.h"
#include "kernels/common/shard_exchange.h"
#include "kernels/common/shard_merge.h"
#include "kernels/cuda/controlled_sample.h"
#include "kernels/cuda/fused_controlled_sample.h"
#include "kernels/cuda/fused_sample.h"

namespace flashsampler::kernels {

// One shard's GPU: its ordinal, stream and communicator (rank = index in the
// group), and an optional cuBLAS handle (required for the materialized path).
struct ShardDevice {
  int device = 0;
  cudaStream_t stream = nullptr;
  ncclComm_t comm = nullptr;
  cublasHandle_t cublas = nullptr;
};

// Device scratch each shard needs for the exchange: the all-gather buffer of
// num_shards * batch summaries, then batch floats (the shard's own log Z).
// 0 for sizes out of range.
size_t ShardExchangeBytes(int64_t batch, int32_t num_shards);

struct ShardedSampleArgs {
  // Per shard k (num_shards entries): the sampler's arguments on device k for
  // its slice: weight, weight_dtype, hidden / params (copies on device k),
  // batch, vocab / valid_vocab (the shard's rows / valid rows), hidden_dim,
  // token_offset (= begin_k), workspace. token_ids, logz, logprobs and
  // row_summaries are ignored: the launcher points them into `exchange`.
  const FusedSampleArgs* shard_args = nullptr;
  // Per shard k: device buffer of ShardExchangeBytes(batch, num_shards) bytes
  // on device k, 256-byte aligned.
  void* const* exchange = nullptr;
  const ShardDevice* devices = nullptr;
  int32_t num_shards = 0;  // >= 1
  ShardMergeMode mode = ShardMergeMode::kExact;
  // How the summaries reach shard 0 (kernels/common/shard_exchange.h).
  ShardExchange exchange_mode = ShardExchange::kNcclAllGather;
  bool materialized = false;  // every shard uses LaunchMaterializedSample
  // Outputs on shard 0's device, [batch]; logz / logprobs optional.
  int32_t* token_ids = nullptr;
  float* logz = nullptr;
  float* logprobs = nullptr;
};

// Enqueues, in order: every shard's sampler (its summaries land in its slot
// of its own exchange buffer, or with kPeerWrite of shard 0's), the exchange
// (one NCCL group of in-place all-gathers, or shard 0's stream waiting for
// each shard's event), and the merge on shard 0's stream. Outputs are valid
// once devices[0].stream passes them (wait with WaitForShards).
// kInvalidArgument: inconsistent arguments (nothing enqueued); kDeviceError: a
// launch, an event or an NCCL call failed (earlier shards' work may be
// enqueued; call WaitForShards before reusing the buffers).
KernelStatus LaunchShardedSample(const ShardedSampleArgs& args);

// What both controlled launchers below take besides their shards: the GPUs,
// the batch's sizes, and on shard 0's device the params, controls (draft
// tokens in them), outputs (as ControlledSampleArgs) and the gather scratch
// (its size from the launcher's own *GatherBytes, 256-byte aligned).
struct ShardedControlledBatch {
  const ShardDevice* devices = nullptr;  // num_shards; comms unused
  int32_t num_shards = 0;                // >= 1
  CudaWeightDType weight_dtype = CudaWeightDType::kBFloat16;
  int64_t batch = 0;
  int64_t hidden_dim = 0;
  int64_t valid_vocab = 0;  // = the last shard's end
  const RowParams* params = nullptr;
  ControlledDeviceControls controls;
  ControlledSampleOutputs outputs;
  void* gather_scratch = nullptr;
  size_t gather_scratch_bytes = 0;
};

// One shard of LaunchShardedControlledSample, on devices[k].
struct ShardedControlledShard {
  const void* weight = nullptr;   // the shard's rows of W, [end - begin, hidden_dim]
  const float* hidden = nullptr;  // [batch, hidden_dim] fp32, a copy on this device
  int64_t begin = 0;              // global id of the shard's first token
  int64_t end = 0;                // one past its last (valid) token
  void* scratch = nullptr;        // ShardedControlledShardBytes, 256-byte aligned
  size_t scratch_bytes = 0;
};

// Scratch of shard k (its logits of one chunk and the GEMM's cast inputs) and
// of shard 0's GPU (one chunk's gathered logits and their l'), for batches of
// up to `batch` rows. 0 for sizes out of range.
size_t ShardedControlledShardBytes(int64_t batch, int64_t shard_vocab, int64_t hidden_dim,
                                   CudaWeightDType weight_dtype);
size_t ShardedControlledGatherBytes(int64_t batch, int64_t valid_vocab);

// devices need cuBLAS handles; gather_scratch: ShardedControlledGatherBytes.
struct ShardedControlledArgs : ShardedControlledBatch {
  const ShardedControlledShard* shards = nullptr;  // num_shards, in token order from 0
};

// Enqueues the chunks' GEMMs, copies and sampler. Outputs are valid once
// devices[0].stream passes them; wait with WaitForShards, which also covers
// the shards' streams. kInvalidArgument: inconsistent arguments (nothing
// enqueued); kDeviceError: a launch or copy failed (earlier work may be
// enqueued: wait before reusing the buffers).
KernelStatus LaunchShardedControlledSample(const ShardedControlledArgs& args);

// Controlled rows that the fused controlled path serves (every row's
// FusedRowKindOf is a candidate or summary row, no drafts; a batch of at most
// the caller's fused limit): no logits in memory on any GPU. Each shard runs
// stage 1 of fused_controlled_sample.h on its slice (global ids from its
// begin), shard 0's stream copies every shard's tile outputs (per row and
// 128-token tile: one summary and kFusedTileCandidates candidates, 180 bytes)
// into tile order and runs stage 2 over all of them. Shards begin at
// multiples of 128, so their tiles are the whole head's and the outputs are
// LaunchFusedControlledSample's on one GPU, bit for bit, row_status 2 (a
// tile held more of a row's top-k than it kept: re-run the batch with
// LaunchShardedControlledSample) included. Bytes moved: rows * tiles * 180.
struct ShardedFusedControlledShard {
  const void* weight = nullptr;        // the shard's rows of W, [end - begin, hidden_dim], 16-bit
  const float* hidden = nullptr;       // [batch, hidden_dim] fp32 on this device, 16-byte aligned
  const RowParams* params = nullptr;   // [batch] on this device
  ControlledDeviceControls controls;   // the batch's flattened controls, a copy on this device
  int64_t begin = 0;                   // global id of the first token, a multiple of 128
  int64_t end = 0;
  void* workspace = nullptr;  // FusedControlledWorkspaceBytes(batch, end - begin, hidden_dim)
  size_t workspace_bytes = 0;
};

// Scratch on shard 0's GPU: the gathered tile outputs. 0 when out of range.
size_t ShardedFusedControlledGatherBytes(int64_t batch, int64_t valid_vocab);

// cuBLAS unused; no drafts; gather_scratch: ShardedFusedControlledGatherBytes.
struct ShardedFusedControlledArgs : ShardedControlledBatch {
  const ShardedFusedControlledShard* shards = nullptr;  // num_shards, in token order from 0
};

// Enqueues stage 1 on every shard, the copies and stage 2; outcomes as
// LaunchShardedControlledSample's.
KernelStatus LaunchShardedFusedControlledSample(const ShardedFusedControlledArgs& args);

// Waits until every shard's stream is idle, polling the streams and the
// communicators' asynchronous errors. kOk when all finished cleanly. On a CUDA
// error, an NCCL error or after `timeout_seconds`, aborts every communicator
// (ncclCommAbort; their handles in `devices` become null), writes what
// happened to *error (when not null) and returns kDeviceError.
KernelStatus WaitForShards(ShardDevice* devices, int32_t num_shards, double timeout_seconds,
                           std::string* error);

// The merge alone (exposed for tests and the benchmark): for each row b <
// batch, MergeShardSummaries over gathered[k * batch + b], k < num_shards, with
// params[b] (device), written as LaunchShardedSample's outputs. One thread per
// row on `stream`. Returns the launch error.
cudaError_t LaunchMergeShardSummaries(const SampleSummary* gathered, int64_t batch,
                                      int32_t num_shards, const RowParams* params,
                                      ShardMergeMode mode, int32_t* token_ids, float* logz,
                                      float* logprobs, cudaStream_t stream);

}  // namespace flashsampler::kernels
