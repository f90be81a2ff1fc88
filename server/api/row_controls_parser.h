// Validation of one SamplingParams entry's sampling controls (top_k, top_p,
// min_p, logit_bias, banned_token_ids, allowed_token_bitmask, penalties,
// top_logprobs, logprobs_mode, num_samples) into a RowControls.
//
// Ranges (INVALID_ARGUMENT outside them, with the field and entry named):
// top_k >= 0; top_p in (0, 1]; min_p in [0, 1); logit_bias ids in
// [0, vocab_size) with finite values in [-100, 100]; banned, output and prompt
// ids in [0, vocab_size); the bitmask exactly ceil(vocab_size / 32) or
// ceil(valid_vocab / 32) little-endian int32 words; repetition_penalty in
// [1e-6, 1e6] (kernels/common/row_controls.h says why); presence and
// frequency penalties in [-2, 2] (vLLM's ranges);
// top_logprobs in [0, kMaxTopLogprobs]; logprobs_mode a known value;
// num_samples in [1, kMaxNumSamples].
// A row that leaves no token of [0, valid_vocab) allowed (bitmask and bans) is
// FAILED_PRECONDITION: the request is well formed but cannot be sampled.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "flashsampler/v1/sampler.pb.h"
#include "kernels/common/row_controls.h"
#include "server/engine/engine.h"

namespace flashsampler {

// Largest total of control elements (token ids, bias entries, bitmask words)
// one request may carry once its shared entries are expanded to their rows:
// a shared entry is copied into every row's RowControls, so this bounds that
// copy (128 MiB). Past it the request is INVALID_ARGUMENT (send per-row entries).
inline constexpr int64_t kMaxExpandedControlElements = int64_t{1} << 25;

// The number of elements RowControls holds in its lists.
int64_t ControlElements(const RowControls& c);

// True when `p` sets any control (a field other than temperature, seed, offset).
bool HasControls(const v1::SamplingParams& p);

// The validated controls of one params entry, named `entry` in error
// messages ("params[3]", "sequences[1].params"); `stream_stride` is the
// number of rows sharing the entry (num_samples' stream spacing).
absl::StatusOr<RowControls> ParseRowControls(const v1::SamplingParams& p, const std::string& entry,
                                             const ModelShape& shape, uint32_t stream_stride);

}  // namespace flashsampler
