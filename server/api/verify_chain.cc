#include "server/api/verify_chain.h"

#include <cmath>

#include "kernels/common/gumbel_noise.h"

namespace flashsampler {

bool AcceptDraftToken(const RowParams& params, int32_t draft_token, int32_t row_token,
                      float draft_logprob) {
  if (params.temperature == 0.0f) return row_token == draft_token;
  // exp in double of the fp32 log-probability: p = 1 (log p = 0) stays 1 and
  // p = 0 (-inf, x filtered out) stays 0, so those accept always / never.
  const double p = std::exp(static_cast<double>(draft_logprob));
  return VerifyAcceptUniform(params.seed, params.offset, params.stream) < p;
}

VerifyChainOutcome WalkVerifyChain(int32_t num_drafts, const int32_t* draft_tokens,
                                   const RowParams* params, const int32_t* row_tokens,
                                   const float* draft_logprobs) {
  VerifyChainOutcome out;
  out.token_ids.reserve(static_cast<size_t>(num_drafts) + 1);
  for (int32_t j = 0; j < num_drafts; ++j) {
    if (!AcceptDraftToken(params[j], draft_tokens[j], row_tokens[j], draft_logprobs[j])) {
      out.token_ids.push_back(row_tokens[j]);
      return out;
    }
    out.token_ids.push_back(draft_tokens[j]);
    ++out.num_accepted;
  }
  out.token_ids.push_back(row_tokens[num_drafts]);
  return out;
}

}  // namespace flashsampler
