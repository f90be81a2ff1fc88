// CpuTiledSampler: exact fused LM-head sampling on the CPU (FlashSampling's
// algorithm with fixed-order logit tiles). The embedded default backend and the reference
// every GPU path is tested against.
//
// For each row b it returns token = argmax_i (s_b * (h_b . w_i) + g_b(i)) over
// i < valid_vocab, with s_b = LogitScale(params[b]) and g the Gumbel noise of the
// RNG contract (no noise for greedy rows), which is an exact sample of
// softmax(s_b * H W^T). The vocabulary is walked in tiles of `tile_rows` tokens:
// FixedOrderLogits computes the [B, tile] logits into a small per-thread
// buffer, then each row keeps the tile's SampleSummary. Threads take tiles;
// tile summaries are merged in tile order, so tokens, logz and logprobs are
// bit-identical for any thread count; and each logit is summed in one order
// whatever the batch (kernels/cpu/fixed_order_logits.h), so they are
// bit-identical in any batch too. log Z is summed per 64-token chunk and the
// chunks folded in token order, so its bits (and the logprobs') are also the
// same for every tile_rows that is a multiple of 64 or covers the
// vocabulary; another tile_rows sums it per tile (the same tokens, log Z to
// fp32 rounding). The [B, V] logits are never allocated.
//
// Draft rows (speculative verification, server/engine/engine.h's contract): with
// draft_tokens[b] = x >= 0, a sampled row (T > 0) takes its argmax over
// i != x (a sample of the residual softmax restricted to i != x), a greedy row
// its usual argmax, and draft_logprobs[b] = l'_x - log Z with log Z over every
// token (x included); logz / logprobs keep their meaning (the full target
// distribution, so logprobs is the residual sample's target log-probability).
// A vocabulary of x alone leaves no residual: the row then returns x (and
// p(x) = 1, so a verifier always accepts it).
//
// Pruning: tokens whose score cannot reach the best one seen so far are skipped
// before their noise is drawn (kernels/cpu/tiled_sampler.cc); this is exact.
//
// Thread safety: Sample() may not be called concurrently on one object (it owns
// the worker threads and the scratch buffers); distinct objects are independent.
// Outcomes: kOk with outputs written; kInvalidArgument (outputs untouched) for
// null pointers, sizes out of range (checked at construction, reported here),
// a temperature that is negative, non-finite or whose reciprocal overflows,
// non-finite hidden states, or a row whose logits are all NaN (non-finite
// weights); kOutOfMemory when scratch cannot be allocated.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/common/kernel_status.h"
#include "kernels/common/row_params.h"
#include "kernels/cpu/fixed_order_logits.h"

namespace flashsampler::kernels {

struct CpuSamplerConfig {
  int num_threads = 0;       // 0: std::thread::hardware_concurrency()
  // Tokens per tile; multiples of 64 avoid drawing a noise chunk twice at tile edges.
  int64_t tile_rows = 1024;
};

struct CpuSampleOutputs {
  int32_t* token_ids = nullptr;  // [batch], required
  float* logz = nullptr;         // [batch], optional
  float* logprobs = nullptr;     // [batch], optional
  // [batch], required when draft tokens are given: log p(x) per draft row,
  // NaN for rows without a draft.
  float* draft_logprobs = nullptr;
};

class CpuTiledSampler {
 public:
  // weight_panels: W [vocab, hidden] in the token-panel layout of
  // fixed_order_logits.h (PackTokenPanels), fp32 or a 16-bit head's bits; it
  // must outlive the sampler. Rows >= valid_vocab are never sampled (their
  // logits count as -inf).
  CpuTiledSampler(TokenPanels weight_panels, int64_t vocab, int64_t valid_vocab, int64_t hidden,
                  CpuSamplerConfig config);
  ~CpuTiledSampler();
  CpuTiledSampler(const CpuTiledSampler&) = delete;
  CpuTiledSampler& operator=(const CpuTiledSampler&) = delete;

  // hidden_states: [batch, hidden] fp32 row-major; params: [batch].
  KernelStatus Sample(const float* hidden_states, int64_t batch, const RowParams* params,
                      CpuSampleOutputs outputs);
  // The same with draft rows: draft_tokens [batch] (nullptr: none), each -1
  // (plain row) or a token in [0, valid_vocab) (else kInvalidArgument).
  KernelStatus Sample(const float* hidden_states, int64_t batch, const RowParams* params,
                      const int32_t* draft_tokens, CpuSampleOutputs outputs);

  int num_threads() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashsampler::kernels
