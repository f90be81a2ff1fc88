#include "server/api/verify_request.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/api/row_controls_parser.h"
#include "server/api/verify_chain.h"

namespace flashsampler {
namespace {

// Controls that have no meaning per verified position.
absl::Status CheckVerifyControls(const v1::SamplingParams& p, const std::string& field) {
  if (!p.allowed_token_bitmask().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".allowed_token_bitmask is not supported by Verify (a grammar mask changes from "
        "position to position); verify without it or use Sample"));
  }
  if (p.top_logprobs() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".top_logprobs is not supported by Verify; use return_acceptance_probs"));
  }
  if (p.has_num_samples() && p.num_samples() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".num_samples must be 1 (or absent) in Verify, got ", p.num_samples()));
  }
  return absl::OkStatus();
}

bool HasPenalties(const RowControls& c) {
  return c.repetition_penalty != 1.0f || c.presence_penalty != 0.0f || c.frequency_penalty != 0.0f;
}

}  // namespace

absl::StatusOr<ParsedVerifyRequest> ParseVerifyRequest(const v1::VerifyRequest& request,
                                                       const ModelShape& shape,
                                                       const RequestLimits& limits,
                                                       const std::function<uint64_t()>& draw_seed) {
  const int num_sequences = request.sequences_size();
  if (num_sequences == 0) return absl::InvalidArgumentError("sequences is empty");
  // The row budget first, from the draft counts alone (nothing decoded yet).
  int64_t total_rows = 0;
  for (const v1::VerifySequence& s : request.sequences()) total_rows += s.draft_token_ids_size() + 1;
  if (total_rows > limits.max_request_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the sequences hold ", total_rows, " positions in total (sum of gamma + 1), over this "
        "server's limit of ", limits.max_request_rows, " rows per request"));
  }

  ParsedVerifyRequest parsed;
  SampleBatch& batch = parsed.batch;
  batch.rows = total_rows;
  batch.hidden_in_weight_dtype = true;  // DecodeHiddenTensor rounds each sequence's rows
  batch.want_logz = request.return_logz();
  parsed.want_acceptance_probs = request.return_acceptance_probs();
  parsed.request_id = request.request_id();
  batch.hidden.reserve(static_cast<size_t>(total_rows * shape.hidden_size));
  batch.params.reserve(static_cast<size_t>(total_rows));
  parsed.draft_tokens.reserve(static_cast<size_t>(total_rows));
  parsed.sequences.reserve(static_cast<size_t>(num_sequences));
  parsed.seeds.reserve(static_cast<size_t>(num_sequences));
  std::vector<RowControls> controls;  // [rows] once a sequence has controls
  bool any_draft = false;
  int64_t control_elements = 0;
  for (int i = 0; i < num_sequences; ++i) {
    const v1::VerifySequence& s = request.sequences(i);
    const std::string field = absl::StrCat("sequences[", i, "]");
    const int32_t gamma = s.draft_token_ids_size();
    for (int32_t j = 0; j < gamma; ++j) {
      const int32_t x = s.draft_token_ids(j);
      if (x < 0 || x >= shape.valid_vocab) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".draft_token_ids[", j, "] is ", x, ", outside the valid vocabulary [0, ",
            shape.valid_vocab, ")"));
      }
    }
    if (!s.has_hidden_states()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".hidden_states is missing"));
    }
    const absl::StatusOr<int64_t> rows = DecodeHiddenTensor(
        s.hidden_states(), field + ".hidden_states", shape.hidden_size, limits.max_request_rows,
        shape.weight_dtype, &batch.hidden);
    if (!rows.ok()) return rows.status();
    if (*rows != gamma + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".hidden_states has ", *rows, " rows, but ", gamma,
          " draft tokens need gamma + 1 = ", gamma + 1,
          " (one per draft token plus the bonus position)"));
    }
    const v1::SamplingParams& p = s.params();
    if (absl::Status st = CheckTemperature(p.temperature(), field + ".params"); !st.ok()) return st;
    RowControls entry;
    const bool has_controls = HasControls(p);
    if (has_controls) {
      if (absl::Status st = CheckVerifyControls(p, field + ".params"); !st.ok()) return st;
      absl::StatusOr<RowControls> c = ParseRowControls(p, field + ".params", shape, 1);
      if (!c.ok()) return c.status();
      entry = *std::move(c);
      if (controls.empty()) controls.resize(static_cast<size_t>(total_rows));
    }
    if (has_controls) {
      // The budget is checked before any copy: every position gets the
      // entry's ids, and with penalties position j also the j drafts before it.
      const int64_t positions = static_cast<int64_t>(gamma) + 1;
      control_elements += ControlElements(entry) * positions +
                          (HasPenalties(entry) ? positions * gamma / 2 : 0);
      if (control_elements > kMaxExpandedControlElements) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the sampling controls hold ", control_elements, " token ids once applied to every "
            "position (up to ", field, "), over the limit of ", kMaxExpandedControlElements));
      }
    }
    const uint64_t seed = p.has_seed() ? p.seed() : draw_seed();
    parsed.seeds.push_back(seed);
    const int64_t first_row = static_cast<int64_t>(batch.params.size());
    parsed.sequences.push_back(VerifySpan{first_row, gamma});
    for (int32_t j = 0; j <= gamma; ++j) {
      batch.params.push_back(RowParams{p.temperature(), seed, p.offset() + static_cast<uint64_t>(j), 0});
      parsed.draft_tokens.push_back(j < gamma ? s.draft_token_ids(j) : -1);
      if (!has_controls) continue;
      RowControls& row = controls[static_cast<size_t>(first_row + j)];
      row = entry;
      // Position j is conditioned on x_0 .. x_{j-1}: they count as output.
      if (HasPenalties(entry)) {
        row.output_token_ids.insert(row.output_token_ids.end(), s.draft_token_ids().begin(),
                                    s.draft_token_ids().begin() + j);
      }
    }
    any_draft = any_draft || gamma > 0;
  }
  // Controls that change nothing at any position (e.g. top_p = 1 alone) are
  // dropped: the rows are then plain verification rows, which every backend
  // that verifies serves (the CUDA engine verifies only without controls).
  if (std::any_of(controls.begin(), controls.end(), [](const RowControls& c) { return HasAnyControl(c); })) {
    batch.controls = std::move(controls);
  }
  if (any_draft) batch.draft_tokens = parsed.draft_tokens;
  return parsed;
}

void FillVerifyResponse(const ParsedVerifyRequest& parsed, const SampleResult& result,
                        v1::VerifyResponse* response) {
  response->Clear();
  response->set_request_id(parsed.request_id);
  const bool drafts = !result.draft_logprobs.empty();
  for (size_t i = 0; i < parsed.sequences.size(); ++i) {
    const VerifySpan& span = parsed.sequences[i];
    const int64_t r0 = span.first_row;
    const VerifyChainOutcome chain = WalkVerifyChain(
        span.num_drafts, parsed.draft_tokens.data() + r0, parsed.batch.params.data() + r0,
        result.token_ids.data() + r0, drafts ? result.draft_logprobs.data() + r0 : nullptr);
    v1::VerifyResult* out = response->add_sequences();
    out->set_num_accepted(chain.num_accepted);
    out->mutable_token_ids()->Add(chain.token_ids.begin(), chain.token_ids.end());
    if (parsed.want_acceptance_probs) {
      for (int32_t j = 0; j < span.num_drafts; ++j) {
        out->add_acceptance_probs(static_cast<float>(std::exp(result.draft_logprobs[r0 + j])));
      }
    }
    if (parsed.batch.want_logz) {
      out->mutable_logz()->Add(result.logz.begin() + r0, result.logz.begin() + r0 + span.num_drafts + 1);
    }
    out->set_seed(parsed.seeds[i]);
  }
}

}  // namespace flashsampler
