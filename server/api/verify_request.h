// Verify request validation and response assembly: turns an untrusted
// VerifyRequest into one SampleBatch of verification rows (server/engine/engine.h's
// draft_tokens contract) plus the layout of its sequences, and turns the
// engine's result into a VerifyResponse through the accept/reject finalizer
// (server/api/verify_chain.h).
//
// Layout: sequence i with γ_i drafts owns γ_i + 1 consecutive rows; row j of
// it has draft_tokens = x_j (j < γ_i) or -1 (the bonus row j = γ_i) and
// RowParams {T, seed, offset + j, stream 0}, so γ = 0 is a Sample row with its
// own params entry. batch.draft_tokens stays empty when no sequence has a
// draft (a Verify of γ = 0 only is plain rows).
//
// Checks (InvalidArgument, naming the field): at least one sequence; the total
// of positions sum(γ_i + 1) <= max_batch_rows; each hidden_states a valid
// [γ_i + 1, D] tensor (request_parser.h's DecodeHiddenTensor) whose row count
// is γ_i + 1; draft ids in [0, valid_vocab); the temperature; the controls
// (row_controls_parser.h; FAILED_PRECONDITION for an entry that allows no
// token), of which allowed_token_bitmask, top_logprobs and num_samples > 1 are
// refused in Verify. With penalties, position j's output_token_ids gain
// x_0 .. x_{j-1} (the tokens it is conditioned on).
//
// Thread safety: ParseVerifyRequest is reentrant as long as `draw_seed` is;
// FillVerifyResponse is a pure function.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "flashsampler/v1/sampler.pb.h"
#include "server/engine/engine.h"
#include "server/api/request_parser.h"

namespace flashsampler {

struct VerifySpan {
  int64_t first_row = 0;   // the sequence's first row in the batch
  int32_t num_drafts = 0;  // γ; the sequence owns rows [first_row, first_row + γ]
};

struct ParsedVerifyRequest {
  SampleBatch batch;                 // every sequence's rows, in request order
  std::vector<VerifySpan> sequences;
  std::vector<int32_t> draft_tokens; // [rows] x_j or -1, also when batch.draft_tokens is empty
  std::vector<uint64_t> seeds;       // [sequences]
  bool want_acceptance_probs = false;
  std::string request_id;
};

absl::StatusOr<ParsedVerifyRequest> ParseVerifyRequest(const v1::VerifyRequest& request,
                                                       const ModelShape& shape,
                                                       const RequestLimits& limits,
                                                       const std::function<uint64_t()>& draw_seed);

// Walks every sequence's chain over `result` (the engine's result for
// parsed.batch) and fills the response.
void FillVerifyResponse(const ParsedVerifyRequest& parsed, const SampleResult& result,
                        v1::VerifyResponse* response);

}  // namespace flashsampler
