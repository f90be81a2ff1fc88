// CpuControlledSampler: exact sampling of rows with sampling controls
// (kernels/common/row_controls.h) on the CPU, by one of two paths that a
// planner picks per batch:
//
//  - kFused: the vocabulary is walked in logit tiles as in CpuTiledSampler;
//    each tile's transformed logits l' go into the worker's running top-k of
//    the row (k = top_k <= kCpuFusedMaxTopK); the workers' lists are merged
//    into the global top-k and min_p / top_p / the samples are taken within
//    it. The [B, V] logits are never stored. Serves batches in which every row
//    has 1 <= top_k <= kCpuFusedMaxTopK and no raw-mode top_logprobs.
//  - kMaterialized: the full logits row (blocks of ControlledRowsPerBlock()
//    rows at a time) is computed, transformed, filtered and sampled. Serves
//    every batch.
//
// Both paths compute each logit with the same sgemm call (same tile, same row
// block), transform it with RowLogitProcessor and finish it with
// SampleFromCandidates, so where both apply they return the same tokens, logz
// and details bit for bit. Samples use the RNG contract's noise of the row's
// (seed, offset, stream + j * sample_stream_stride, token).
//
// Thread safety: Sample() may not be called concurrently on one object.
// Outcomes: kOk; kInvalidArgument for null pointers, bad sizes, a temperature
// outside the RowParams contract, kFused asked for a batch it cannot serve;
// kFailedPrecondition when a row has no token with a finite logit left (no
// output is written); kOutOfMemory when scratch cannot be allocated.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/common/kernel_status.h"
#include "kernels/common/row_controls.h"
#include "kernels/common/row_params.h"
#include "kernels/cpu/fixed_order_logits.h"
#include "kernels/cpu/tiled_sampler.h"

namespace flashsampler::kernels {

inline constexpr int32_t kCpuFusedMaxTopK = 64;

// Rows per block: as many full logits rows as fit 2^22 floats (16 MiB),
// within [16, 1024]. Depends on the vocabulary only, so both paths cut a batch
// into the same blocks (and make the same sgemm calls).
int64_t ControlledRowsPerBlock(int64_t valid_vocab);

enum class CpuControlledPath { kFused, kMaterialized };

// The planner: kFused when it can serve every row of the batch, else kMaterialized.
CpuControlledPath PlanCpuControlledPath(const RowControls* controls, int64_t batch);

struct CpuControlledOutputs {
  int32_t* token_ids = nullptr;        // [batch], required
  float* logz = nullptr;               // [batch], optional
  float* logprobs = nullptr;           // [batch], optional
  RowSampleDetail* details = nullptr;  // [batch], required
  // [batch], required when draft tokens are given: log p(x) under the
  // distribution left after every control (-inf when a control removed x),
  // NaN for rows without a draft.
  float* draft_logprobs = nullptr;
};

class CpuControlledSampler {
 public:
  // weight_panels: W [vocab, hidden] in the token-panel layout of
  // fixed_order_logits.h (PackTokenPanels), fp32 or a 16-bit head's bits,
  // outliving the sampler.
  CpuControlledSampler(TokenPanels weight_panels, int64_t vocab, int64_t valid_vocab,
                       int64_t hidden, CpuSamplerConfig config);
  ~CpuControlledSampler();
  CpuControlledSampler(const CpuControlledSampler&) = delete;
  CpuControlledSampler& operator=(const CpuControlledSampler&) = delete;

  KernelStatus Sample(const float* hidden_states, int64_t batch, const RowParams* params,
                      const RowControls* controls, CpuControlledPath path,
                      CpuControlledOutputs outputs);
  // With draft rows (kernels/cpu/candidate_sampler.h): draft_tokens [batch]
  // (nullptr: none), each -1 or a token in [0, valid_vocab).
  KernelStatus Sample(const float* hidden_states, int64_t batch, const RowParams* params,
                      const RowControls* controls, const int32_t* draft_tokens,
                      CpuControlledPath path, CpuControlledOutputs outputs);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashsampler::kernels
