// RowControls: the per-row sampling controls (top-k / top-p / min-p, logit
// bias, bans, allowed-token bitmask, penalties, top-n logprobs, multiple
// samples), already validated by the server, and RowSampleDetail, the per-row
// extra output they produce. Plain values: no absl, no protobuf, so every
// backend (CPU now, CUDA later) consumes the same structs.
//
// Semantics (vLLM v1's order; the proto comment in sampler.proto is the
// public statement of the same rules). For token i of raw logit x:
//   1. not allowed by `allowed_bitmask`, or listed in `banned_token_ids`: -inf
//   2. x += bias (logit_bias)
//   3. repetition: if i occurs in prompt or output, x = x > 0 ? x / r : x * r;
//      x -= frequency * count_in_output(i); x -= presence * (count > 0)
//   4. l' = x * LogitScale(params)   (fp32 multiply by 1/T; T = 1 for greedy)
//   5. min_p: keep i when exp(l'_i - max l') >= min_p          (float64)
//   6. top_k: keep the k best by (l' descending, token id ascending)
//   7. top_p: over the kept tokens in that order, keep token j when the
//      float64 mass strictly before it is < top_p * total mass
//   8. sample j of the row: argmax over kept i of l'_i + GumbelNoise(seed,
//      offset, stream + j * sample_stream_stride, i); greedy rows: argmax l'_i
//      (ties: lower id). Sample 0 therefore uses the row's own stream.
// Steps 5 and 6 commute (both keep a prefix of the same total order), which is
// what lets a fused path take a global top-k first and apply min_p after.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace flashsampler {

// Largest top_logprobs a request may ask for (vLLM / OpenAI: 20).
inline constexpr int32_t kMaxTopLogprobs = 20;
// Largest num_samples per row.
inline constexpr int32_t kMaxNumSamples = 64;

enum class LogprobsMode : int32_t {
  kSampled = 0,  // under the distribution actually sampled (after every control)
  kRaw = 1,      // the model's log_softmax(raw logits), before every control
};

// The range of RowControls::repetition_penalty r. A repeated token's logit l
// becomes l / r (l > 0) or l * r, and the samplers treat a logit of +-inf as
// a disallowed token: inside [1e-6, 1e6] neither product overflows for any
// |l| < 3.4e32, far past what an LM head computes, so the penalty only ever
// makes a token more or less likely, never removes it (r = 1e-38 made the
// boosted argmax of a greedy row +inf, and the row took another token).
inline constexpr float kMinRepetitionPenalty = 1e-6f;
inline constexpr float kMaxRepetitionPenalty = 1e6f;

struct RowControls {
  int32_t top_k = 0;          // 0: off
  float top_p = 1.0f;         // 1: off
  float min_p = 0.0f;         // 0: off
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // distinct token ids
  std::vector<int32_t> banned_token_ids;
  // Empty: all allowed; else ceil(n / 32) words covering tokens [0, n) with
  // n >= the valid vocabulary; bit (i & 31) of word (i >> 5) set = allowed.
  std::vector<uint32_t> allowed_bitmask;
  std::vector<int32_t> output_token_ids;
  std::vector<int32_t> prompt_token_ids;
  int32_t top_logprobs = 0;   // 0: no top list, no per-sample logprob / rank
  LogprobsMode logprobs_mode = LogprobsMode::kSampled;
  int32_t num_samples = 1;
  uint32_t sample_stream_stride = 1;  // rows sharing the params entry
};

// True when the row's logits are processed at all (steps 1-3).
inline bool HasLogitProcessing(const RowControls& c) {
  return !c.logit_bias.empty() || !c.banned_token_ids.empty() || !c.allowed_bitmask.empty() ||
         (c.repetition_penalty != 1.0f &&
          !(c.output_token_ids.empty() && c.prompt_token_ids.empty())) ||
         ((c.presence_penalty != 0.0f || c.frequency_penalty != 0.0f) &&
          !c.output_token_ids.empty());
}

// True when the row asks for any filter (steps 5-7).
inline bool HasFilters(const RowControls& c) {
  return c.top_k > 0 || c.top_p < 1.0f || c.min_p > 0.0f;
}

// True when the row differs in any way from a plain row (which the plain fast
// path serves): processing, filters or extra outputs.
inline bool HasAnyControl(const RowControls& c) {
  return HasLogitProcessing(c) || HasFilters(c) || c.top_logprobs > 0 || c.num_samples > 1;
}

// The checks the server's parser already made, repeated by every backend
// because its kernels index memory by these values: ids in [0, vocab), finite
// biases and penalties, parameter ranges, a bitmask covering valid_vocab.
inline bool ValidRowControls(const RowControls& c, int64_t vocab, int64_t valid_vocab) {
  const auto ids_in = [vocab](const std::vector<int32_t>& ids) {
    return std::all_of(ids.begin(), ids.end(), [vocab](int32_t id) { return id >= 0 && id < vocab; });
  };
  for (const auto& [id, bias] : c.logit_bias) {
    if (id < 0 || id >= vocab || !std::isfinite(bias)) return false;
  }
  return c.top_k >= 0 && c.top_p > 0.0f && c.top_p <= 1.0f && c.min_p >= 0.0f && c.min_p < 1.0f &&
         c.repetition_penalty >= kMinRepetitionPenalty && c.repetition_penalty <= kMaxRepetitionPenalty &&
         std::isfinite(c.presence_penalty) && std::isfinite(c.frequency_penalty) &&
         ids_in(c.banned_token_ids) && ids_in(c.output_token_ids) && ids_in(c.prompt_token_ids) &&
         (c.allowed_bitmask.empty() ||
          static_cast<int64_t>(c.allowed_bitmask.size()) * 32 >= valid_vocab) &&
         c.top_logprobs >= 0 && c.top_logprobs <= kMaxTopLogprobs && c.num_samples >= 1 &&
         c.num_samples <= kMaxNumSamples;
}

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

// Extra output of one row. token_ids always holds the row's num_samples
// samples (token_ids[0] is the row's SampleResult token). logprobs, ranks and
// top are filled only when top_logprobs > 0, in the row's logprobs_mode; rank
// is vLLM's: the number of tokens whose log-probability is >= the sample's.
struct RowSampleDetail {
  std::vector<int32_t> token_ids;   // [num_samples]
  std::vector<float> logprobs;      // [num_samples] or empty
  std::vector<int32_t> ranks;       // [num_samples] or empty
  std::vector<TokenLogprob> top;    // [<= top_logprobs], most likely first, ties lower id
};

}  // namespace flashsampler
