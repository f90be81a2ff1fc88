// The finalizer of speculative verification: walks one sequence's
// accept/reject chain over the engine's per-position results.
//
// A sequence with γ >= 0 greedy draft tokens x_0..x_{γ-1} is verified as γ + 1
// engine rows (SampleBatch::draft_tokens, server/engine/engine.h): row j < γ carries
// draft x_j, row γ (the bonus position) none; row j uses RowParams
// {T, seed, offset + j, stream}, so γ = 0 is exactly a plain Sample. For each
// j in order:
//  - greedy (T = 0): x_j is accepted iff the row's token (the argmax) == x_j;
//  - T > 0: x_j is accepted iff u_j < p(x_j) = exp(draft_logprob_j), with
//    u_j = VerifyAcceptUniform(seed, offset + j, stream) (kernels/common/
//    gumbel_noise.h: a Philox stream disjoint from all Gumbel noise);
//  - on the first rejection the row's token (greedy: the argmax; T > 0: the
//    residual sample, drawn with x_j excluded) is output and the walk stops.
// If every draft is accepted, the bonus row's token is output. So the output
// is num_accepted accepted drafts plus one more token.
//
// Exactness (T > 0): a position outputs x with probability p(x) and otherwise
// a sample of p(. | != x), i.e. p(x) δ_x + (1 - p(x)) p(. | != x) = p: each
// emitted token has the target distribution given the prefix before it (the
// standard speculative-sampling argument for a deterministic draft q = δ_x,
// for which min(1, p/q) = p(x)). The uniform is independent of the residual's
// noise (disjoint Philox counters), and positions use distinct offsets.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/row_params.h"

namespace flashsampler {

struct VerifyChainOutcome {
  int32_t num_accepted = 0;        // in [0, γ]
  std::vector<int32_t> token_ids;  // [num_accepted + 1]: accepted drafts, then one token
};

// Whether position j's draft x is accepted, given that row's params (offset
// already offset + j), its token and its draft_logprob.
bool AcceptDraftToken(const RowParams& params, int32_t draft_token, int32_t row_token,
                      float draft_logprob);

// One sequence: `num_drafts` = γ; draft_tokens [γ]; params, row_tokens [γ + 1];
// draft_logprobs [γ] (only read for T > 0 rows).
VerifyChainOutcome WalkVerifyChain(int32_t num_drafts, const int32_t* draft_tokens,
                                   const RowParams* params, const int32_t* row_tokens,
                                   const float* draft_logprobs);

}  // namespace flashsampler
