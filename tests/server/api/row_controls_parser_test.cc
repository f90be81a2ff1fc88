// Tests of server/api/row_controls_parser.h: every control's valid range (the
// INVALID_ARGUMENT cases of issue 3), the all-masked FAILED_PRECONDITION, the
// xgrammar bitmask layout, and what a parsed RowControls holds.
#include "server/api/row_controls_parser.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;

ModelShape Shape() {
  ModelShape s;
  s.vocab_size = 100;  // ceil(100 / 32) = 4 words
  s.valid_vocab = 70;  // ceil(70 / 32) = 3 words
  s.hidden_size = 4;
  return s;
}

absl::StatusOr<RowControls> Parse(const v1::SamplingParams& p) {
  return ParseRowControls(p, "params[2]", Shape(), 5);
}

void ExpectInvalid(const v1::SamplingParams& p, const std::string& fragment) {
  absl::StatusOr<RowControls> c = Parse(p);
  ASSERT_FALSE(c.ok()) << fragment;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(fragment));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("params[2]"));
}

std::string Words(const std::vector<uint32_t>& words) {
  std::string bytes;
  for (uint32_t w : words) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((w >> (8 * i)) & 0xFF));
  }
  return bytes;
}

TEST(RowControlsParser, DefaultsAreNoControls) {
  v1::SamplingParams p;
  p.set_temperature(0.7f);
  p.set_seed(3);
  EXPECT_FALSE(HasControls(p));
  absl::StatusOr<RowControls> c = Parse(p);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(HasAnyControl(*c));
  EXPECT_EQ(c->top_p, 1.0f);
  EXPECT_EQ(c->repetition_penalty, 1.0f);
  EXPECT_EQ(c->num_samples, 1);
  // Setting the neutral values explicitly is a control field, not a control.
  p.set_top_p(1.0f);
  p.set_min_p(0.0f);
  p.set_repetition_penalty(1.0f);
  EXPECT_TRUE(HasControls(p));
  c = Parse(p);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(HasAnyControl(*c));
}

TEST(RowControlsParser, EveryFieldIsCarriedOver) {
  v1::SamplingParams p;
  p.set_top_k(7);
  p.set_top_p(0.5f);
  p.set_min_p(0.25f);
  (*p.mutable_logit_bias())[9] = -3.5f;
  (*p.mutable_logit_bias())[4] = 100.0f;
  p.add_banned_token_ids(99);
  p.set_allowed_token_bitmask(Words({0xFFFFFFFFu, 0x80000001u, 1u, 0u}));
  p.set_repetition_penalty(1.3f);
  p.set_presence_penalty(-2.0f);
  p.set_frequency_penalty(2.0f);
  p.add_output_token_ids(5);
  p.add_prompt_token_ids(0);
  p.set_top_logprobs(20);
  p.set_logprobs_mode(v1::LOGPROBS_MODE_RAW);
  p.set_num_samples(64);
  absl::StatusOr<RowControls> c = Parse(p);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->top_k, 7);
  EXPECT_EQ(c->top_p, 0.5f);
  EXPECT_EQ(c->min_p, 0.25f);
  EXPECT_EQ(c->logit_bias, (std::vector<std::pair<int32_t, float>>{{4, 100.0f}, {9, -3.5f}}));
  EXPECT_EQ(c->banned_token_ids, std::vector<int32_t>{99});
  EXPECT_EQ(c->allowed_bitmask, (std::vector<uint32_t>{0xFFFFFFFFu, 0x80000001u, 1u, 0u}));
  EXPECT_EQ(c->repetition_penalty, 1.3f);
  EXPECT_EQ(c->presence_penalty, -2.0f);
  EXPECT_EQ(c->frequency_penalty, 2.0f);
  EXPECT_EQ(c->output_token_ids, std::vector<int32_t>{5});
  EXPECT_EQ(c->prompt_token_ids, std::vector<int32_t>{0});
  EXPECT_EQ(c->top_logprobs, 20);
  EXPECT_EQ(c->logprobs_mode, LogprobsMode::kRaw);
  EXPECT_EQ(c->num_samples, 64);
  EXPECT_EQ(c->sample_stream_stride, 5u);
}

TEST(RowControlsParser, OutOfRangeValuesAreInvalidArgument) {
  v1::SamplingParams p;
  p.set_top_k(-1);
  ExpectInvalid(p, "top_k must be >= 0");
  for (float bad : {0.0f, -0.1f, 1.0001f, NAN}) {
    p = {};
    p.set_top_p(bad);
    ExpectInvalid(p, "top_p must lie in (0, 1]");
  }
  for (float bad : {1.0f, -0.01f, NAN}) {
    p = {};
    p.set_min_p(bad);
    ExpectInvalid(p, "min_p must lie in [0, 1)");
  }
  for (int bad : {0, -5}) {
    p = {};
    p.set_num_samples(bad);
    ExpectInvalid(p, "num_samples must lie in [1, 64]");
  }
  p = {};
  p.set_num_samples(65);
  ExpectInvalid(p, "num_samples");
  p = {};
  p.set_top_logprobs(21);
  ExpectInvalid(p, "top_logprobs must lie in [0, 20]");
  p = {};
  p.set_top_logprobs(-1);
  ExpectInvalid(p, "top_logprobs");
  p = {};
  p.set_logprobs_mode(static_cast<v1::LogprobsMode>(7));
  ExpectInvalid(p, "logprobs_mode 7");
  // Below 1e-6 or above 1e6 a penalised logit can overflow to +-inf, which
  // the samplers read as a disallowed token (row_controls.h).
  for (float bad : {0.0f, -1.0f, INFINITY, NAN, 1e-38f, 1e-45f, 9.9e-7f, 1.01e6f}) {
    p = {};
    p.set_repetition_penalty(bad);
    ExpectInvalid(p, "repetition_penalty must lie in [1e-6, 1e6]");
  }
  for (float good : {kMinRepetitionPenalty, kMaxRepetitionPenalty}) {
    p = {};
    p.set_repetition_penalty(good);
    p.add_prompt_token_ids(3);
    absl::StatusOr<RowControls> c = Parse(p);
    ASSERT_TRUE(c.ok()) << good << ": " << c.status();
    EXPECT_EQ(c->repetition_penalty, good);
  }
  for (float bad : {2.01f, -2.5f, NAN}) {
    p = {};
    p.set_presence_penalty(bad);
    ExpectInvalid(p, "presence_penalty must lie in [-2, 2]");
    p = {};
    p.set_frequency_penalty(bad);
    ExpectInvalid(p, "frequency_penalty must lie in [-2, 2]");
  }
}

TEST(RowControlsParser, TokenIdsOutsideTheVocabularyAreInvalidArgument) {
  v1::SamplingParams p;
  p.add_banned_token_ids(100);
  ExpectInvalid(p, "banned_token_ids[0] = 100 is outside [0, 100)");
  p = {};
  p.add_banned_token_ids(-1);
  ExpectInvalid(p, "banned_token_ids[0] = -1");
  p = {};
  p.add_output_token_ids(3);
  p.add_output_token_ids(100);
  ExpectInvalid(p, "output_token_ids[1] = 100");
  p = {};
  p.add_prompt_token_ids(-7);
  ExpectInvalid(p, "prompt_token_ids[0] = -7");
  p = {};
  (*p.mutable_logit_bias())[100] = 1.0f;
  ExpectInvalid(p, "logit_bias token id 100");
  p = {};
  (*p.mutable_logit_bias())[-1] = 1.0f;
  ExpectInvalid(p, "logit_bias token id -1");
  for (float bad : {NAN, INFINITY, 100.5f, -101.0f}) {
    p = {};
    (*p.mutable_logit_bias())[3] = bad;
    ExpectInvalid(p, "logit_bias[3]");
  }
}

TEST(RowControlsParser, BitmaskMustHaveCeilVOver32Words) {
  v1::SamplingParams p;
  p.set_allowed_token_bitmask(Words({1, 1, 1}));  // ceil(70 / 32): valid vocabulary
  EXPECT_TRUE(Parse(p).ok());
  p.set_allowed_token_bitmask(Words({1, 1, 1, 1}));  // ceil(100 / 32): whole vocabulary
  EXPECT_TRUE(Parse(p).ok());
  p.set_allowed_token_bitmask(Words({1, 1}));
  ExpectInvalid(p, "allowed_token_bitmask has 8 bytes");
  p.set_allowed_token_bitmask(Words({1, 1, 1, 1, 1}));
  ExpectInvalid(p, "allowed_token_bitmask has 20 bytes");
  p.set_allowed_token_bitmask(std::string(13, '\xff'));
  ExpectInvalid(p, "allowed_token_bitmask has 13 bytes");
}

TEST(RowControlsParser, NoAllowedTokenIsFailedPrecondition) {
  v1::SamplingParams p;
  p.set_allowed_token_bitmask(Words({0, 0, 0}));
  absl::StatusOr<RowControls> c = Parse(p);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("params[2] allows no token"));
  // Only token 69 allowed (word 2, bit 5), and then banned.
  p.set_allowed_token_bitmask(Words({0, 0, 1u << 5}));
  EXPECT_TRUE(Parse(p).ok());
  p.add_banned_token_ids(69);
  EXPECT_EQ(Parse(p).status().code(), absl::StatusCode::kFailedPrecondition);
  // Tokens >= valid_vocab do not count: only token 70 allowed is no token.
  p = {};
  p.set_allowed_token_bitmask(Words({0, 0, 1u << 6, 0}));
  EXPECT_EQ(Parse(p).status().code(), absl::StatusCode::kFailedPrecondition);
  // Bans alone can exclude everything too.
  p = {};
  for (int i = 0; i < 70; ++i) p.add_banned_token_ids(i);
  EXPECT_EQ(Parse(p).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace flashsampler
