#include "server/api/row_controls_parser.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flashsampler {
namespace {

// vLLM's ranges for the additive penalties and OpenAI's for logit_bias.
constexpr float kMaxAbsPenalty = 2.0f;
constexpr float kMaxAbsLogitBias = 100.0f;

absl::Status Invalid(const std::string& entry, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(entry, ".", what));
}

absl::Status CheckTokenIds(const google::protobuf::RepeatedField<int32_t>& ids, const std::string& entry,
                           const char* field, int64_t vocab) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return Invalid(entry, absl::StrCat(field, "[", i, "] = ", ids[i], " is outside [0, ", vocab,
                                         ") (the vocabulary)"));
    }
  }
  return absl::OkStatus();
}

// Number of sampleable tokens ([0, valid_vocab)) that the bitmask and the bans
// leave allowed, counted up to 1 (only emptiness matters).
bool AnyTokenAllowed(const RowControls& c, int64_t valid_vocab) {
  std::vector<int32_t> banned = c.banned_token_ids;
  std::sort(banned.begin(), banned.end());
  for (int64_t i = 0; i < valid_vocab; ++i) {
    if (!c.allowed_bitmask.empty() && ((c.allowed_bitmask[i >> 5] >> (i & 31)) & 1u) == 0) {
      // Skip whole empty words quickly.
      if ((i & 31) == 0 && c.allowed_bitmask[i >> 5] == 0) i += 31;
      continue;
    }
    if (!std::binary_search(banned.begin(), banned.end(), static_cast<int32_t>(i))) return true;
  }
  return false;
}

}  // namespace

int64_t ControlElements(const RowControls& c) {
  return static_cast<int64_t>(c.logit_bias.size() + c.banned_token_ids.size() +
                              c.allowed_bitmask.size() + c.output_token_ids.size() +
                              c.prompt_token_ids.size());
}

bool HasControls(const v1::SamplingParams& p) {
  return p.top_k() != 0 || p.has_top_p() || p.min_p() != 0.0f || !p.logit_bias().empty() ||
         !p.banned_token_ids().empty() || !p.allowed_token_bitmask().empty() ||
         p.has_repetition_penalty() || p.presence_penalty() != 0.0f ||
         p.frequency_penalty() != 0.0f || !p.output_token_ids().empty() ||
         !p.prompt_token_ids().empty() || p.top_logprobs() != 0 || p.logprobs_mode() != 0 ||
         p.has_num_samples();
}

absl::StatusOr<RowControls> ParseRowControls(const v1::SamplingParams& p, const std::string& entry,
                                             const ModelShape& shape, uint32_t stream_stride) {
  RowControls c;
  const int64_t vocab = shape.vocab_size;
  if (p.top_k() < 0) return Invalid(entry, absl::StrCat("top_k must be >= 0 (0 = off), got ", p.top_k()));
  c.top_k = p.top_k();
  if (p.has_top_p()) {
    // !(x > 0 && x <= 1) also rejects NaN.
    if (!(p.top_p() > 0.0f && p.top_p() <= 1.0f)) {
      return Invalid(entry, absl::StrCat("top_p must lie in (0, 1] (1 = off), got ", p.top_p()));
    }
    c.top_p = p.top_p();
  }
  if (!(p.min_p() >= 0.0f && p.min_p() < 1.0f)) {
    return Invalid(entry, absl::StrCat("min_p must lie in [0, 1) (0 = off), got ", p.min_p()));
  }
  c.min_p = p.min_p();
  for (const auto& [token, bias] : p.logit_bias()) {
    if (token < 0 || token >= vocab) {
      return Invalid(entry, absl::StrCat("logit_bias token id ", token, " is outside [0, ", vocab, ")"));
    }
    if (!(std::abs(bias) <= kMaxAbsLogitBias)) {
      return Invalid(entry, absl::StrCat("logit_bias[", token, "] = ", bias, " must be finite and in [-",
                                         kMaxAbsLogitBias, ", ", kMaxAbsLogitBias, "]"));
    }
    c.logit_bias.emplace_back(token, bias);
  }
  // Map iteration order is unspecified; keep the engine's input deterministic.
  std::sort(c.logit_bias.begin(), c.logit_bias.end());
  if (absl::Status s = CheckTokenIds(p.banned_token_ids(), entry, "banned_token_ids", vocab); !s.ok()) {
    return s;
  }
  c.banned_token_ids.assign(p.banned_token_ids().begin(), p.banned_token_ids().end());
  if (!p.allowed_token_bitmask().empty()) {
    const std::string& bytes = p.allowed_token_bitmask();
    const int64_t full_words = (vocab + 31) / 32;
    const int64_t valid_words = (shape.valid_vocab + 31) / 32;
    const int64_t words = static_cast<int64_t>(bytes.size()) / 4;
    if (bytes.size() % 4 != 0 || (words != full_words && words != valid_words)) {
      return Invalid(entry, absl::StrCat("allowed_token_bitmask has ", bytes.size(),
                                         " bytes; it must hold ceil(V / 32) int32 words: ",
                                         full_words * 4, " bytes (V = vocab_size ", vocab, ") or ",
                                         valid_words * 4, " bytes (V = valid_vocab_size ",
                                         shape.valid_vocab, ")"));
    }
    c.allowed_bitmask.resize(static_cast<size_t>(words));
    for (int64_t w = 0; w < words; ++w) {
      const auto* b = reinterpret_cast<const unsigned char*>(bytes.data()) + 4 * w;
      c.allowed_bitmask[w] = uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 |
                             uint32_t{b[3]} << 24;
    }
  }
  if (p.has_repetition_penalty()) {
    if (!(p.repetition_penalty() >= kMinRepetitionPenalty &&
          p.repetition_penalty() <= kMaxRepetitionPenalty)) {
      return Invalid(entry, absl::StrCat("repetition_penalty must lie in [1e-6, 1e6] (1 = off), got ",
                                         p.repetition_penalty()));
    }
    c.repetition_penalty = p.repetition_penalty();
  }
  if (!(std::abs(p.presence_penalty()) <= kMaxAbsPenalty)) {
    return Invalid(entry, absl::StrCat("presence_penalty must lie in [-2, 2], got ", p.presence_penalty()));
  }
  c.presence_penalty = p.presence_penalty();
  if (!(std::abs(p.frequency_penalty()) <= kMaxAbsPenalty)) {
    return Invalid(entry, absl::StrCat("frequency_penalty must lie in [-2, 2], got ", p.frequency_penalty()));
  }
  c.frequency_penalty = p.frequency_penalty();
  if (absl::Status s = CheckTokenIds(p.output_token_ids(), entry, "output_token_ids", vocab); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTokenIds(p.prompt_token_ids(), entry, "prompt_token_ids", vocab); !s.ok()) {
    return s;
  }
  c.output_token_ids.assign(p.output_token_ids().begin(), p.output_token_ids().end());
  c.prompt_token_ids.assign(p.prompt_token_ids().begin(), p.prompt_token_ids().end());
  if (p.top_logprobs() < 0 || p.top_logprobs() > kMaxTopLogprobs) {
    return Invalid(entry, absl::StrCat("top_logprobs must lie in [0, ", kMaxTopLogprobs, "], got ",
                                       p.top_logprobs()));
  }
  c.top_logprobs = p.top_logprobs();
  if (!v1::LogprobsMode_IsValid(p.logprobs_mode())) {
    return Invalid(entry, absl::StrCat("logprobs_mode ", p.logprobs_mode(), " is not a known mode"));
  }
  c.logprobs_mode = p.logprobs_mode() == v1::LOGPROBS_MODE_RAW ? LogprobsMode::kRaw
                                                               : LogprobsMode::kSampled;
  if (p.has_num_samples()) {
    if (p.num_samples() < 1 || p.num_samples() > kMaxNumSamples) {
      return Invalid(entry, absl::StrCat("num_samples must lie in [1, ", kMaxNumSamples, "], got ",
                                         p.num_samples()));
    }
    c.num_samples = p.num_samples();
  }
  c.sample_stream_stride = stream_stride;
  if ((!c.allowed_bitmask.empty() || !c.banned_token_ids.empty()) &&
      !AnyTokenAllowed(c, shape.valid_vocab)) {
    return absl::FailedPreconditionError(absl::StrCat(
        entry, " allows no token: allowed_token_bitmask and banned_token_ids exclude all ",
        shape.valid_vocab, " sampleable tokens"));
  }
  return c;
}

}  // namespace flashsampler
