// Device-side building blocks shared by the CUDA samplers (fused_sample.cu and
// materialized_sample.cu): how one thread folds a token into its running
// SampleSummary, how summaries move between lanes, and the second stage that
// merges each row's tile summaries into its token, log Z and log-prob.
//
// Internal to kernels/cuda: include only from .cu files.
//
// Every combination of two summaries goes through MergeSummaries
// (kernels/common/sample_summary.h), the same function the CPU backend and the
// shard reduction use, so all of them pick the same winner for the same scores.
// Every reduction here has a fixed shape (no atomics, no order that depends on
// timing), so repeated launches give bit-identical outputs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/gumbel_noise.h"
#include "kernels/common/kernel_status.h"
#include "kernels/common/row_params.h"
#include "kernels/common/sample_summary.h"
#include "kernels/cuda/fused_sample.h"

namespace flashsampler::kernels::cuda_internal {

constexpr unsigned kFullWarpMask = 0xffffffffu;

// The fp32 multiplier of a row's logits: 1/T for sampled rows, 1 for greedy
// rows. Same expression as LogitScale (kernels/common/row_params.h), which is a
// host-only function; 1.0f / t is IEEE-rounded on the device too (nvcc's
// default -prec-div=true), so both give the same float.
__device__ __forceinline__ float DeviceLogitScale(float temperature) {
  return temperature > 0.0f ? 1.0f / temperature : 1.0f;
}

// The transformed logit l' = logit * scale, as one IEEE fp32 multiply (the
// _rn intrinsic keeps the compiler from fusing it into a later add), exactly
// as the CPU backend rounds it.
__device__ __forceinline__ float TransformLogit(float logit, float scale) {
  return __fmul_rn(logit, scale);
}

// GumbelNoise(seed, offset, stream, token) of the RNG contract, bit for bit:
// the same Philox block and GumbelFromBits as kernels/common/gumbel_noise.h.
// Only the word is picked with selects instead of NoiseBits' run-time array
// index, which would put the 4-word block in local memory.
__device__ __forceinline__ float DeviceGumbelNoise(const RowParams& p, uint32_t token) {
  const r123::Philox4x32::ctr_type block = PhiloxNoiseBlock(p.seed, p.offset, p.stream, token >> 2);
  const uint32_t word = token & 3u;
  const uint32_t bits = word == 0u   ? block.v[0]
                        : word == 1u ? block.v[1]
                        : word == 2u ? block.v[2]
                                     : block.v[3];
  return GumbelFromBits(bits);
}

// Fold one token into a thread's running summary.
//   logit: its transformed logit l'; score: l' + noise (l' for greedy rows).
// A NaN score (only possible with non-finite weights) never becomes the best:
// ScoreBeats would let it into an empty summary and nothing could replace it.
// When want_lse, the token also enters the online log-sum-exp (max_logit,
// sum_exp); a NaN logit is left out of it as well.
__device__ __forceinline__ void AddToken(SampleSummary& s, int32_t token, float logit,
                                         float score, bool want_lse) {
  if (score == score && ScoreBeats(score, token, s.best_score, s.best_index)) {
    s.best_score = score;
    s.best_index = token;
    s.best_logit = logit;
  }
  if (want_lse) {
    if (logit > s.max_logit) {
      // New maximum: rescale the old sum to it. An empty summary has max -inf
      // and sum 0, and exp(-inf) = 0, so the first token gives sum = 1.
      s.sum_exp = __fmaf_rn(s.sum_exp, expf(s.max_logit - logit), 1.0f);
      s.max_logit = logit;
    } else if (logit > -INFINITY) {  // skips -inf (adds 0) and NaN
      s.sum_exp = __fadd_rn(s.sum_exp, expf(logit - s.max_logit));
    }
  }
}

// The summary held by lane (this lane ^ lane_mask) of the same warp. All 32
// lanes must call it together.
__device__ __forceinline__ SampleSummary ShuffleXorSummary(const SampleSummary& s,
                                                           int lane_mask) {
  SampleSummary o;
  o.best_score = __shfl_xor_sync(kFullWarpMask, s.best_score, lane_mask);
  o.best_index = __shfl_xor_sync(kFullWarpMask, s.best_index, lane_mask);
  o.best_logit = __shfl_xor_sync(kFullWarpMask, s.best_logit, lane_mask);
  o.max_logit = __shfl_xor_sync(kFullWarpMask, s.max_logit, lane_mask);
  o.sum_exp = __shfl_xor_sync(kFullWarpMask, s.sum_exp, lane_mask);
  return o;
}

// The argument checks both launchers share: non-null inputs and outputs, sizes
// within int32 (token ids are int32), 1 <= valid_vocab <= vocab, and pointers
// aligned for their element types (the workspace to `workspace_alignment`).
// kOk or kInvalidArgument; the workspace size is each launcher's own check.
KernelStatus CheckSampleArgs(const FusedSampleArgs& args, size_t workspace_alignment);

// One row's sampling setup, resolved once per thread, and the per-token step
// every stage-1 kernel shares: l' = TransformLogit(dot), score = l' + noise
// (greedy rows: l'), folded into the thread's summary with AddToken.
//
// Draft rows (FusedSampleArgs::draft_tokens): the one thread that scores the
// row's draft token x stores l'_x into draft_logits[row] (stage 2 turns it
// into l'_x - log Z), and for a sampled row gives x the score NaN, which
// AddToken never lets win while its logit still enters the log-sum-exp: the
// sample is the Gumbel-max over the other tokens, log Z is over all of them.
//
// Tokens are passed as rows of the launch's W; token_offset (the global id of
// W's row 0: non-zero for a vocabulary shard, FusedSampleArgs::token_offset)
// turns them into global ids, which key the noise and are what the summaries
// record, so a shard scores its tokens exactly as the whole head would.
struct RowSampler {
  RowParams params{};
  float scale = 1.0f;
  bool sampled = false;
  int32_t draft = -1;             // never equal to a token when there is no draft
  float* draft_logit = nullptr;   // &draft_logits[row] when draft >= 0
  int64_t token_offset = 0;

  // An inactive lane (row beyond the batch) gets the neutral setup and must
  // not call Add. draft_tokens / draft_logits: null, or device [batch].
  __device__ __forceinline__ static RowSampler Load(const RowParams* all, int64_t row, bool active,
                                                    const int32_t* draft_tokens,
                                                    float* draft_logits, int64_t token_offset) {
    RowSampler r;
    r.token_offset = token_offset;
    if (active) {
      r.params = all[row];
      r.scale = DeviceLogitScale(r.params.temperature);
      r.sampled = r.params.temperature > 0.0f;
      if (draft_tokens != nullptr) {
        r.draft = draft_tokens[row];
        r.draft_logit = draft_logits + row;
      }
    }
    return r;
  }

  // The score a token competes with: NaN (never wins) for a sampled row's draft.
  __device__ __forceinline__ float DraftScore(int32_t token, float logit, float score) const {
    if (token != draft) return score;
    *draft_logit = logit;
    return sampled ? __int_as_float(0x7fffffff) : score;
  }

  __device__ __forceinline__ void Add(SampleSummary& s, int64_t local_token, float dot,
                                      bool want_lse) const {
    const int64_t token = local_token + token_offset;
    const float logit = TransformLogit(dot, scale);
    const float score =
        sampled ? __fadd_rn(logit, DeviceGumbelNoise(params, static_cast<uint32_t>(token))) : logit;
    AddToken(s, static_cast<int32_t>(token), logit,
             DraftScore(static_cast<int32_t>(token), logit, score), want_lse);
  }

  // Add for the four tokens local_token0 .. local_token0 + 3 (local_token0 % 4
  // == 0, and token_offset % 4 == 0) in order, those below valid_vocab (a
  // local bound): one Philox block gives all four noise words (the same words
  // DeviceGumbelNoise picks one at a time).
  __device__ __forceinline__ void AddFour(SampleSummary& s, int64_t local_token0, const float4& dots,
                                          int64_t valid_vocab, bool want_lse) const {
    const int64_t token0 = local_token0 + token_offset;
    r123::Philox4x32::ctr_type block = {{0u, 0u, 0u, 0u}};
    if (sampled) {
      block = PhiloxNoiseBlock(params.seed, params.offset, params.stream,
                               static_cast<uint32_t>(token0) >> 2);
    }
    const float dot[4] = {dots.x, dots.y, dots.z, dots.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (local_token0 + i >= valid_vocab) break;
      const float logit = TransformLogit(dot[i], scale);
      const float score = sampled ? __fadd_rn(logit, GumbelFromBits(block.v[i])) : logit;
      AddToken(s, static_cast<int32_t>(token0 + i), logit,
               DraftScore(static_cast<int32_t>(token0 + i), logit, score), want_lse);
    }
  }
};

// Programmatic dependent launch (sm_90). A kernel launched with
// DependentLaunch's attribute may start while the previous kernel in the
// stream still runs; GridDependencyWait blocks until that kernel has completed
// and its writes are visible (a no-op after an ordinary launch), and
// AllowDependentLaunch lets the next such kernel be scheduled early.
__device__ __forceinline__ void GridDependencyWait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void AllowDependentLaunch() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// A launch configuration with programmatic stream serialization allowed;
// `attribute` must outlive the cudaLaunchKernelEx call.
inline cudaLaunchConfig_t DependentLaunch(dim3 grid, dim3 block, size_t smem_bytes,
                                          cudaStream_t stream, cudaLaunchAttribute* attribute) {
  *attribute = cudaLaunchAttribute{};
  attribute->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute->val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  return config;
}

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) on the
// current device, once per thread for each (kernel, device): the attribute
// stays with the device's context (which nothing here resets: a reset would
// drop it), and setting it before every launch cost a driver call (and its
// lock) each time. Each caller's kernel has one size (its configuration's),
// so `bytes` is not part of the key. Any thread may call it.
inline cudaError_t OptInDynamicSharedMemory(const void* kernel, int bytes) {
  struct Done {
    const void* kernel;
    int device;
  };
  // (kernel, device) pairs a thread keeps; past them, the call is made each
  // time (still correct). 1 KB of every thread's TLS.
  constexpr int kRemembered = 64;
  thread_local Done done[kRemembered];
  thread_local int count = 0;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  for (int i = 0; i < count; ++i) {
    if (done[i].kernel == kernel && done[i].device == device) return cudaSuccess;
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess && count < kRemembered) done[count++] = Done{kernel, device};
  return err;
}

// KernelStatus of a CUDA runtime result.
inline KernelStatus StatusFromCuda(cudaError_t err) {
  return err == cudaSuccess ? KernelStatus::kOk : KernelStatus::kDeviceError;
}

// Stage 1 must fold the log-sum-exp when any of these is wanted.
inline bool WantsLogSumExp(const FusedSampleArgs& args) {
  return args.logz != nullptr || args.logprobs != nullptr || args.draft_logprobs != nullptr;
}

// Stage 2, shared by both samplers. tile_summaries is [args.batch, num_tiles]
// row-major (a row's tiles are contiguous, in vocabulary order). For every row
// it merges the tiles in a fixed order (sample_reduce.cu) and writes
//   token_ids[row] = best_index   (when token_ids != nullptr; -1 only if every
//                                  score of the row was NaN),
//   logz[row]      = SummaryLogZ  (when logz != nullptr),
//   logprobs[row]  = best_logit - logz (when logprobs != nullptr),
//   draft_logprobs[row] = (l'_x stored there by stage 1) - logz for a row with
//                    a draft x in [0, valid_vocab), else NaN (when draft_tokens),
//   row_summaries[row] = the merged summary (when row_summaries != nullptr),
// and the token, log Z and logprob of each row inside one of
// args.output_spans again at its place there (OutputSpan).
// The log-sum-exp parts (and the summaries' max_logit / sum_exp) are
// meaningful only if stage 1 ran with WantsLogSumExp(args). Enqueues one
// kernel on `stream`; returns the launch error, if any.
cudaError_t LaunchMergeTileSummaries(const SampleSummary* tile_summaries, int64_t num_tiles,
                                     const FusedSampleArgs& args, cudaStream_t stream);

}  // namespace flashsampler::kernels::cuda_internal
