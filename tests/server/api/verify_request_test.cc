// Tests of server/api/verify_request.h: Verify's validation, row layout and
// response assembly (the finalizer itself: verify_chain_test.cc).
#include "server/api/verify_request.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kHidden = 4;

ModelShape Shape() {
  ModelShape s;
  s.vocab_size = 100;
  s.valid_vocab = 90;
  s.hidden_size = kHidden;
  return s;
}

v1::VerifySequence* AddSequence(v1::VerifyRequest* r, std::vector<int32_t> drafts, float t = 1.0f,
                                int64_t rows = -1) {
  if (rows < 0) rows = static_cast<int64_t>(drafts.size()) + 1;
  v1::VerifySequence* s = r->add_sequences();
  v1::Tensor* h = s->mutable_hidden_states();
  h->set_dtype(v1::DTYPE_FP32);
  h->add_shape(rows);
  h->add_shape(kHidden);
  std::vector<float> values(static_cast<size_t>(rows * kHidden));
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * static_cast<float>(i);
  h->mutable_data()->assign(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  for (int32_t x : drafts) s->add_draft_token_ids(x);
  s->mutable_params()->set_temperature(t);
  return s;
}

absl::StatusOr<ParsedVerifyRequest> Parse(const v1::VerifyRequest& r, int64_t max_rows = 16) {
  uint64_t next_seed = 500;
  return ParseVerifyRequest(r, Shape(), RequestLimits{max_rows}, [&] { return next_seed++; });
}

void ExpectInvalid(const v1::VerifyRequest& r, const std::string& fragment) {
  absl::StatusOr<ParsedVerifyRequest> p = Parse(r);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  EXPECT_THAT(std::string(p.status().message()), HasSubstr(fragment));
}

TEST(VerifyRequest, LayoutOfSequencesWithDifferentGamma) {
  v1::VerifyRequest r;
  v1::VerifySequence* a = AddSequence(&r, {7, 8, 9}, 0.5f);
  a->mutable_params()->set_seed(42);
  a->mutable_params()->set_offset(10);
  AddSequence(&r, {}, 0.0f);  // gamma = 0, seed drawn
  AddSequence(&r, {3});
  r.set_return_logz(true);
  r.set_request_id("v1");
  absl::StatusOr<ParsedVerifyRequest> p = Parse(r);
  ASSERT_TRUE(p.ok()) << p.status();
  const SampleBatch& b = p->batch;
  EXPECT_EQ(b.rows, 4 + 1 + 2);
  EXPECT_EQ(b.hidden.size(), static_cast<size_t>(7 * kHidden));
  EXPECT_EQ(b.draft_tokens, (std::vector<int32_t>{7, 8, 9, -1, -1, 3, -1}));
  EXPECT_TRUE(b.controls.empty());
  EXPECT_TRUE(b.want_logz);
  EXPECT_FALSE(b.want_logprobs);
  ASSERT_EQ(p->sequences.size(), 3u);
  EXPECT_EQ(p->sequences[1].first_row, 4);
  EXPECT_EQ(p->sequences[2].num_drafts, 1);
  EXPECT_EQ(p->seeds, (std::vector<uint64_t>{42, 500, 501}));
  for (int j = 0; j < 4; ++j) {  // offset + j, stream 0
    EXPECT_EQ(b.params[j].seed, 42u);
    EXPECT_EQ(b.params[j].offset, 10u + j);
    EXPECT_EQ(b.params[j].stream, 0u);
    EXPECT_EQ(b.params[j].temperature, 0.5f);
  }
  EXPECT_EQ(b.params[4].temperature, 0.0f);
  EXPECT_EQ(p->request_id, "v1");
}

// gamma = 0 everywhere: plain rows (no draft_tokens), the same row a Sample
// request with its own params entry makes.
TEST(VerifyRequest, GammaZeroOnlyIsPlainRows) {
  v1::VerifyRequest r;
  AddSequence(&r, {})->mutable_params()->set_seed(3);
  absl::StatusOr<ParsedVerifyRequest> p = Parse(r);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->batch.draft_tokens.empty());
  EXPECT_EQ(p->batch.params[0].seed, 3u);
  EXPECT_EQ(p->batch.params[0].stream, 0u);
}

TEST(VerifyRequest, BadInputsAreInvalidArgument) {
  {
    v1::VerifyRequest r;
    ExpectInvalid(r, "sequences is empty");
  }
  {
    v1::VerifyRequest r;
    AddSequence(&r, {1, 90});
    ExpectInvalid(r, "sequences[0].draft_token_ids[1] is 90, outside the valid vocabulary [0, 90)");
  }
  {
    v1::VerifyRequest r;
    AddSequence(&r, {-1});
    ExpectInvalid(r, "draft_token_ids[0] is -1");
  }
  {
    v1::VerifyRequest r;
    AddSequence(&r, {});
    AddSequence(&r, {1, 2}, 1.0f, 2);  // 2 drafts need 3 rows
    ExpectInvalid(r, "sequences[1].hidden_states has 2 rows, but 2 draft tokens need gamma + 1 = 3");
  }
  {
    v1::VerifyRequest r;
    AddSequence(&r, {1})->mutable_hidden_states()->set_shape(1, kHidden + 1);
    ExpectInvalid(r, "sequences[0].hidden_states.shape[1] must be the model's hidden size 4");
  }
  {
    v1::VerifyRequest r;
    AddSequence(&r, {1})->mutable_hidden_states()->set_dtype(v1::DTYPE_UNSPECIFIED);
    ExpectInvalid(r, "sequences[0].hidden_states.dtype");
  }
  {
    v1::VerifyRequest r;
    AddSequence(&r, {1})->mutable_hidden_states()->mutable_data()->push_back('x');
    ExpectInvalid(r, "bytes, but shape");
  }
  {
    v1::VerifyRequest r;
    AddSequence(&r, {1})->clear_hidden_states();
    ExpectInvalid(r, "sequences[0].hidden_states is missing");
  }
  {
    v1::VerifyRequest r;
    AddSequence(&r, std::vector<int32_t>(10, 1));
    AddSequence(&r, std::vector<int32_t>(6, 1));  // 11 + 7 = 18 > 16
    ExpectInvalid(r, "18 positions in total");
  }
  {
    v1::VerifyRequest r;
    AddSequence(&r, {1}, -1.0f);
    ExpectInvalid(r, "sequences[0].params.temperature");
  }
  {
    v1::VerifyRequest r;
    AddSequence(&r, {1})->mutable_params()->set_allowed_token_bitmask(std::string(16, '\xff'));
    ExpectInvalid(r, "allowed_token_bitmask is not supported by Verify");
  }
  {
    v1::VerifyRequest r;
    AddSequence(&r, {1})->mutable_params()->set_top_logprobs(2);
    ExpectInvalid(r, "top_logprobs is not supported by Verify");
  }
  {
    v1::VerifyRequest r;
    AddSequence(&r, {1})->mutable_params()->set_num_samples(2);
    ExpectInvalid(r, "num_samples must be 1");
  }
  {
    v1::VerifyRequest r;
    AddSequence(&r, {1})->mutable_params()->set_top_k(-1);
    ExpectInvalid(r, "top_k");
  }
  {
    // A bad control names the sequence's params entry, not a Sample request's.
    v1::VerifyRequest r;
    AddSequence(&r, {1});
    AddSequence(&r, {2})->mutable_params()->set_top_p(1.5f);
    ExpectInvalid(r, "sequences[1].params.top_p must lie in (0, 1]");
  }
  {
    v1::VerifyRequest r;
    std::vector<float> nan(2 * kHidden, NAN);
    AddSequence(&r, {1})->mutable_hidden_states()->mutable_data()->assign(
        reinterpret_cast<const char*>(nan.data()), nan.size() * 4);
    ExpectInvalid(r, "sequences[0].hidden_states[0][0] is NaN");
  }
}

// Controls apply to every position; with penalties position j counts
// x_0 .. x_{j-1} as output.
TEST(VerifyRequest, ControlsPerPositionAndPenaltiesSeeTheDraftPrefix) {
  v1::VerifyRequest r;
  v1::SamplingParams* p = AddSequence(&r, {5, 6})->mutable_params();
  p->set_top_k(3);
  p->set_presence_penalty(0.5f);
  p->add_output_token_ids(1);
  AddSequence(&r, {2});  // plain sequence: default controls
  absl::StatusOr<ParsedVerifyRequest> parsed = Parse(r);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const std::vector<RowControls>& c = parsed->batch.controls;
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c[0].top_k, 3);
  EXPECT_EQ(c[0].output_token_ids, (std::vector<int32_t>{1}));
  EXPECT_EQ(c[1].output_token_ids, (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(c[2].output_token_ids, (std::vector<int32_t>{1, 5, 6}));
  EXPECT_FALSE(HasAnyControl(c[3]));
  EXPECT_FALSE(HasAnyControl(c[4]));
}

TEST(VerifyRequest, ControlsThatChangeNothingAreDropped) {
  v1::VerifyRequest r;
  AddSequence(&r, {5, 6})->mutable_params()->set_top_p(1.0f);
  v1::SamplingParams* p = AddSequence(&r, {2})->mutable_params();
  p->set_repetition_penalty(1.0f);
  p->add_output_token_ids(4);
  absl::StatusOr<ParsedVerifyRequest> parsed = Parse(r);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->batch.controls.empty());
  EXPECT_EQ(parsed->batch.draft_tokens, (std::vector<int32_t>{5, 6, -1, 2, -1}));
  // A penalty that only the draft prefix activates is kept: position 1 sees
  // draft 7 as output.
  v1::VerifyRequest penalised;
  v1::SamplingParams* q = AddSequence(&penalised, {7})->mutable_params();
  q->set_repetition_penalty(1.5f);
  parsed = Parse(penalised);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->batch.controls.size(), 2u);
  EXPECT_FALSE(HasAnyControl(parsed->batch.controls[0]));
  EXPECT_EQ(parsed->batch.controls[1].output_token_ids, (std::vector<int32_t>{7}));
}

// The expanded size of the controls (every position's copy, plus the draft
// prefix as output under penalties) is checked before anything is copied: a
// small request cannot make the parser allocate gigabytes.
TEST(VerifyRequest, ControlsOverTheExpandedLimitAreRejectedBeforeCopying) {
  constexpr int32_t kGamma = 600;
  constexpr int kPromptIds = 1 << 16;  // 65536 * 601 positions > 2^25
  v1::VerifyRequest r;
  v1::SamplingParams* p = AddSequence(&r, std::vector<int32_t>(kGamma, 3))->mutable_params();
  p->set_repetition_penalty(1.2f);
  for (int i = 0; i < kPromptIds; ++i) p->add_prompt_token_ids(i % 90);
  absl::StatusOr<ParsedVerifyRequest> parsed = Parse(r, kGamma + 1);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("over the limit"));
  // Just under the limit it is served: 55000 ids * 601 + 600 * 601 / 2 < 2^25.
  p->clear_prompt_token_ids();
  for (int i = 0; i < 55000; ++i) p->add_prompt_token_ids(i % 90);
  parsed = Parse(r, kGamma + 1);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->batch.controls.size(), static_cast<size_t>(kGamma + 1));
}

TEST(VerifyRequest, ResponseWalksEachChain) {
  v1::VerifyRequest r;
  AddSequence(&r, {4, 5}, 0.0f)->mutable_params()->set_seed(9);  // greedy
  AddSequence(&r, {}, 0.0f);
  AddSequence(&r, {6}, 1.0f);
  r.set_return_logz(true);
  r.set_return_acceptance_probs(true);
  r.set_request_id("id");
  absl::StatusOr<ParsedVerifyRequest> p = Parse(r);
  ASSERT_TRUE(p.ok()) << p.status();
  SampleResult result;
  result.token_ids = {4, 7, 8, 11, 12, 13};  // seq 0: x_0 accepted, x_1 = 5 rejected for 7
  result.logz = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  result.draft_logprobs = {std::log(0.5f), std::log(0.25f), NAN, NAN, -INFINITY, NAN};
  v1::VerifyResponse response;
  FillVerifyResponse(*p, result, &response);
  EXPECT_EQ(response.request_id(), "id");
  ASSERT_EQ(response.sequences_size(), 3);
  const v1::VerifyResult& s0 = response.sequences(0);
  EXPECT_EQ(s0.num_accepted(), 1);
  EXPECT_THAT(s0.token_ids(), ::testing::ElementsAre(4, 7));
  EXPECT_THAT(s0.acceptance_probs(), ::testing::ElementsAre(0.5f, 0.25f));
  EXPECT_THAT(s0.logz(), ::testing::ElementsAre(0.1f, 0.2f, 0.3f));
  EXPECT_EQ(s0.seed(), 9u);
  const v1::VerifyResult& s1 = response.sequences(1);
  EXPECT_EQ(s1.num_accepted(), 0);
  EXPECT_THAT(s1.token_ids(), ::testing::ElementsAre(11));
  EXPECT_TRUE(s1.acceptance_probs().empty());
  EXPECT_THAT(s1.logz(), ::testing::ElementsAre(0.4f));
  EXPECT_EQ(s1.seed(), 500u);
  const v1::VerifyResult& s2 = response.sequences(2);  // p(x) = 0: never accepted
  EXPECT_EQ(s2.num_accepted(), 0);
  EXPECT_THAT(s2.token_ids(), ::testing::ElementsAre(12));
  EXPECT_THAT(s2.acceptance_probs(), ::testing::ElementsAre(0.0f));
}

}  // namespace
}  // namespace flashsampler
