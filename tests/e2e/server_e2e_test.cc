// End to end: the real flashsampler-server binary on a loopback port, driven by
// the real client library and flashsampler-cli.
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "client/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/http_get.h"
#include "tests/common/metrics_text.h"
#include "tests/common/scoped_temp_dir.h"
#include "tests/e2e/server_process.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;
using testing::SeriesValue;
using testing::ServerProcess;

constexpr int64_t kVocab = 2000;
constexpr int64_t kHidden = 64;
constexpr int64_t kMaxRows = 64;

std::vector<float> RandomValues(int64_t n, uint64_t seed) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

v1::SampleRequest Request(int64_t rows, uint64_t data_seed, v1::DType dtype = v1::DTYPE_FP32) {
  v1::SampleRequest r;
  *r.mutable_hidden_states() = MakeHiddenStates(RandomValues(rows * kHidden, data_seed), rows, kHidden, dtype);
  r.add_params()->set_temperature(1.0f);
  return r;
}

// One server for the whole suite: small demo head, valid_vocab below V.
class ServerE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The CPU backend explicitly: this suite tests the service, and on a GPU
    // machine `auto` would pick CUDA (covered by the gpu-labelled tests).
    server_ = new ServerProcess({"--backend=cpu", "--demo_vocab=2000", "--demo_hidden=64", "--valid_vocab=1990",
                                 "--max_request_rows=64", "--threads=2", "--tile_rows=256"});
    const absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
    client_ = new SamplerClient(server_->address());
  }
  static void TearDownTestSuite() {
    delete client_;
    // After everything the suite threw at it, the server still drains and
    // exits cleanly on SIGTERM.
    absl::StatusOr<int> exit_code = server_->Stop(SIGTERM, absl::Seconds(30));
    EXPECT_TRUE(exit_code.ok()) << exit_code.status();
    if (exit_code.ok()) {
      EXPECT_EQ(*exit_code, 0);
    }
    delete server_;
  }

  void ExpectInvalid(const v1::SampleRequest& request, const std::string& fragment) {
    absl::StatusOr<v1::SampleResponse> r = client_->Sample(request);
    ASSERT_FALSE(r.ok()) << "accepted a bad request expected to mention: " << fragment;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(fragment));
  }

  static ServerProcess* server_;
  static SamplerClient* client_;
};
ServerProcess* ServerE2E::server_ = nullptr;
SamplerClient* ServerE2E::client_ = nullptr;

TEST_F(ServerE2E, ModelInfo) {
  absl::StatusOr<v1::ModelInfo> info = client_->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->vocab_size(), kVocab);
  EXPECT_EQ(info->valid_vocab_size(), 1990);
  EXPECT_EQ(info->hidden_size(), kHidden);
  EXPECT_EQ(info->weight_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(info->backend(), "cpu");
  EXPECT_EQ(info->max_request_rows(), kMaxRows);
}

TEST_F(ServerE2E, HealthIsServingForServerAndService) {
  auto overall = client_->CheckHealth("");
  ASSERT_TRUE(overall.ok()) << overall.status();
  EXPECT_EQ(*overall, grpc::health::v1::HealthCheckResponse::SERVING);
  auto service = client_->CheckHealth("flashsampler.v1.Sampler");
  ASSERT_TRUE(service.ok()) << service.status();
  EXPECT_EQ(*service, grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(ServerE2E, UnaryRoundTripIsReproducible) {
  v1::SampleRequest request = Request(16, 1);
  request.set_return_logz(true);
  request.set_return_logprobs(true);
  request.set_request_id("round-trip");
  absl::StatusOr<v1::SampleResponse> first = client_->Sample(request);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->token_ids_size(), 16);
  ASSERT_EQ(first->logz_size(), 16);
  ASSERT_EQ(first->logprobs_size(), 16);
  ASSERT_EQ(first->seeds_size(), 16);
  EXPECT_EQ(first->request_id(), "round-trip");
  for (int i = 0; i < 16; ++i) {
    EXPECT_GE(first->token_ids(i), 0);
    EXPECT_LT(first->token_ids(i), 1990);  // valid_vocab masks the padding
    EXPECT_TRUE(std::isfinite(first->logz(i)));
    EXPECT_LE(first->logprobs(i), 0.0f);
    EXPECT_EQ(first->seeds(i), first->seeds(0));  // one shared params entry
  }
  // Replaying with the reported seed gives the same tokens, bit for bit.
  request.mutable_params(0)->set_seed(first->seeds(0));
  absl::StatusOr<v1::SampleResponse> replay = client_->Sample(request);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_THAT(replay->token_ids(), ::testing::ElementsAreArray(first->token_ids()));
  EXPECT_THAT(replay->logz(), ::testing::ElementsAreArray(first->logz()));
}

TEST_F(ServerE2E, RowsAreIndependentOfTheirBatch) {
  // With one params entry per row every row uses stream 0 of its own seed, so
  // a row sent alone must get the token it got inside the batch.
  v1::SampleRequest big = Request(8, 2);
  big.clear_params();
  for (int r = 0; r < 8; ++r) {
    v1::SamplingParams* p = big.add_params();
    p->set_temperature(0.8f);
    p->set_seed(100 + r);
    p->set_offset(3);
  }
  absl::StatusOr<v1::SampleResponse> together = client_->Sample(big);
  ASSERT_TRUE(together.ok()) << together.status();
  const std::vector<float> values = RandomValues(8 * kHidden, 2);
  for (int r = 0; r < 8; ++r) {
    v1::SampleRequest single;
    std::vector<float> row(values.begin() + r * kHidden, values.begin() + (r + 1) * kHidden);
    *single.mutable_hidden_states() = MakeHiddenStates(row, 1, kHidden, v1::DTYPE_FP32);
    *single.add_params() = big.params(r);
    absl::StatusOr<v1::SampleResponse> alone = client_->Sample(single);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(alone->token_ids(0), together->token_ids(r)) << "row " << r;
  }
}

TEST_F(ServerE2E, AllWireDTypesAreAccepted) {
  for (v1::DType dtype : {v1::DTYPE_FP32, v1::DTYPE_FP16, v1::DTYPE_BF16}) {
    v1::SampleRequest request = Request(4, 3, dtype);
    request.mutable_params(0)->set_temperature(0.0f);
    absl::StatusOr<v1::SampleResponse> r = client_->Sample(request);
    ASSERT_TRUE(r.ok()) << v1::DType_Name(dtype) << ": " << r.status();
    EXPECT_EQ(r->token_ids_size(), 4);
  }
}

TEST_F(ServerE2E, StreamAnswersInOrderAndMatchesUnary) {
  std::vector<v1::SampleRequest> requests;
  for (int i = 0; i < 12; ++i) {
    v1::SampleRequest r = Request(1 + i % 5, 10 + i);
    r.mutable_params(0)->set_seed(500 + i);
    r.set_request_id(absl::StrCat("s", i));
    requests.push_back(r);
  }
  absl::StatusOr<std::vector<v1::SampleResponse>> responses = client_->SampleStream(requests);
  ASSERT_TRUE(responses.ok()) << responses.status();
  ASSERT_EQ(responses->size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ((*responses)[i].request_id(), requests[i].request_id());
    absl::StatusOr<v1::SampleResponse> unary = client_->Sample(requests[i]);
    ASSERT_TRUE(unary.ok());
    EXPECT_THAT((*responses)[i].token_ids(), ::testing::ElementsAreArray(unary->token_ids()));
  }
}

TEST_F(ServerE2E, BadStreamRequestEndsTheStreamWithItsError) {
  std::vector<v1::SampleRequest> bad_temperature = {Request(2, 1), Request(2, 2)};
  bad_temperature[1].mutable_params(0)->set_temperature(-1.0f);
  std::vector<v1::SampleRequest> bad_shape = {Request(2, 1), Request(2, 2)};
  bad_shape[1].mutable_hidden_states()->set_shape(1, kHidden * 2);
  std::vector<v1::SampleRequest> bad_bytes = {Request(2, 1)};
  bad_bytes[0].mutable_hidden_states()->mutable_data()->resize(5);
  for (const auto& [requests, fragment] :
       {std::pair{bad_temperature, "temperature"}, std::pair{bad_shape, "hidden size"},
        std::pair{bad_bytes, "bytes"}}) {
    absl::StatusOr<std::vector<v1::SampleResponse>> r = client_->SampleStream(requests);
    ASSERT_FALSE(r.ok()) << fragment;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(fragment));
  }
  EXPECT_TRUE(client_->Sample(Request(1, 1)).ok());
}

TEST_F(ServerE2E, EveryBadInputIsInvalidArgumentAndTheServerStaysUp) {
  v1::SampleRequest r = Request(2, 1);
  r.mutable_hidden_states()->set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectInvalid(r, "dtype");

  r = Request(2, 1);
  r.mutable_hidden_states()->set_dtype(static_cast<v1::DType>(42));
  ExpectInvalid(r, "got 42");

  r = Request(2, 1);
  r.mutable_hidden_states()->add_shape(1);
  ExpectInvalid(r, "[B, D]");

  r = Request(2, 1);
  r.mutable_hidden_states()->set_shape(1, kHidden + 1);
  ExpectInvalid(r, "hidden size 64");

  r = Request(2, 1);
  r.mutable_hidden_states()->mutable_data()->resize(2 * kHidden * 4 - 3);
  ExpectInvalid(r, "bytes");

  std::vector<float> values = RandomValues(2 * kHidden, 1);
  values[70] = std::numeric_limits<float>::quiet_NaN();
  r = Request(2, 1);
  *r.mutable_hidden_states() = MakeHiddenStates(values, 2, kHidden, v1::DTYPE_FP32);
  ExpectInvalid(r, "NaN");
  values[70] = std::numeric_limits<float>::infinity();
  *r.mutable_hidden_states() = MakeHiddenStates(values, 2, kHidden, v1::DTYPE_BF16);
  ExpectInvalid(r, "infinite");

  r = Request(2, 1);
  r.mutable_params(0)->set_temperature(-0.1f);
  ExpectInvalid(r, "temperature");
  r.mutable_params(0)->set_temperature(1e-30f);  // 1/T would overflow
  ExpectInvalid(r, "smallest supported");
  r.mutable_params(0)->set_temperature(std::numeric_limits<float>::quiet_NaN());
  ExpectInvalid(r, "temperature");

  r = Request(3, 1);
  r.add_params();
  ExpectInvalid(r, "params must have 1 entry");
  r.clear_params();
  ExpectInvalid(r, "params must have 1 entry");

  r = Request(1, 1);
  r.mutable_hidden_states()->set_shape(0, 0);
  r.mutable_hidden_states()->clear_data();
  ExpectInvalid(r, ">= 1, got 0");

  ExpectInvalid(Request(kMaxRows + 1, 1), "limit of 64");

  // Shape claims whose byte count would overflow B x D x size.
  r = Request(1, 1);
  r.mutable_hidden_states()->set_shape(0, int64_t{1} << 61);
  ExpectInvalid(r, "limit");

  r = v1::SampleRequest();
  ExpectInvalid(r, "hidden_states is missing");

  // Still healthy and still sampling.
  auto health = client_->CheckHealth();
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(*health, grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_TRUE(client_->Sample(Request(2, 1)).ok());
  EXPECT_TRUE(server_->running());
}

// Sampling controls through the real server and client: top_k = 1 is greedy,
// bans and the bitmask hold, multiple samples and top logprobs come back in
// `rows` and replay with their seed, bad controls are INVALID_ARGUMENT and an
// all-masked row is FAILED_PRECONDITION, after which the server still serves.
TEST_F(ServerE2E, SamplingControlsEndToEnd) {
  v1::SampleRequest greedy = Request(4, 31);
  greedy.mutable_params(0)->set_temperature(0.0f);
  absl::StatusOr<v1::SampleResponse> want = client_->Sample(greedy);
  ASSERT_TRUE(want.ok()) << want.status();

  v1::SampleRequest top1 = Request(4, 31);
  top1.mutable_params(0)->set_top_k(1);
  top1.mutable_params(0)->set_temperature(1.5f);
  absl::StatusOr<v1::SampleResponse> got = client_->Sample(top1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->token_ids(), ::testing::ElementsAreArray(want->token_ids()));
  EXPECT_EQ(got->rows_size(), 0);  // no per-row outputs were asked for

  // Banning each row's greedy token moves greedy elsewhere (per-row entries).
  v1::SampleRequest banned = Request(4, 31);
  banned.clear_params();
  for (int b = 0; b < 4; ++b) {
    v1::SamplingParams* p = banned.add_params();
    p->set_temperature(0.0f);
    p->add_banned_token_ids(want->token_ids(b));
  }
  got = client_->Sample(banned);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int b = 0; b < 4; ++b) EXPECT_NE(got->token_ids(b), want->token_ids(b));

  // A bitmask allowing tokens 7 and 40 only (63 words = ceil(2000 / 32)).
  std::string mask(63 * 4, '\0');
  mask[0] = static_cast<char>(1 << 7);
  mask[4 + 1] = static_cast<char>(1 << 0);  // token 40 = word 1, bit 8
  v1::SampleRequest masked = Request(8, 5);
  masked.mutable_params(0)->set_allowed_token_bitmask(mask);
  masked.mutable_params(0)->set_temperature(5.0f);
  got = client_->Sample(masked);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int32_t t : got->token_ids()) EXPECT_TRUE(t == 7 || t == 40) << t;

  // Samples and top logprobs, replayed with the same seed.
  v1::SampleRequest rich = Request(3, 8);
  v1::SamplingParams* p = rich.mutable_params(0);
  p->set_seed(77);
  p->set_top_k(5);
  p->set_top_p(0.9f);
  p->set_top_logprobs(3);
  p->set_num_samples(4);
  rich.set_return_logprobs(true);
  absl::StatusOr<v1::SampleResponse> first = client_->Sample(rich);
  absl::StatusOr<v1::SampleResponse> again = client_->Sample(rich);
  ASSERT_TRUE(first.ok() && again.ok()) << first.status();
  ASSERT_EQ(first->rows_size(), 3);
  for (int b = 0; b < 3; ++b) {
    const v1::RowOutput& row = first->rows(b);
    ASSERT_EQ(row.sample_token_ids_size(), 4);
    EXPECT_EQ(row.sample_token_ids(0), first->token_ids(b));
    EXPECT_EQ(row.sample_logprobs(0), first->logprobs(b));
    EXPECT_EQ(row.sample_ranks_size(), 4);
    ASSERT_GE(row.top_logprobs_size(), 1);
    EXPECT_LE(row.top_logprobs_size(), 3);
    for (int i = 1; i < row.top_logprobs_size(); ++i) {
      EXPECT_GE(row.top_logprobs(i - 1).logprob(), row.top_logprobs(i).logprob());
    }
    EXPECT_THAT(again->rows(b).sample_token_ids(), ::testing::ElementsAreArray(row.sample_token_ids()));
  }

  // Bad controls.
  auto with = [](auto set) {
    v1::SampleRequest r = Request(2, 1);
    set(r.mutable_params(0));
    return r;
  };
  ExpectInvalid(with([](v1::SamplingParams* q) { q->set_top_p(0.0f); }), "top_p");
  ExpectInvalid(with([](v1::SamplingParams* q) { q->set_top_p(1.5f); }), "top_p");
  ExpectInvalid(with([](v1::SamplingParams* q) { q->set_min_p(1.0f); }), "min_p");
  ExpectInvalid(with([](v1::SamplingParams* q) { q->set_top_k(-3); }), "top_k");
  ExpectInvalid(with([](v1::SamplingParams* q) { q->set_num_samples(0); }), "num_samples");
  ExpectInvalid(with([](v1::SamplingParams* q) { q->set_top_logprobs(21); }), "top_logprobs");
  ExpectInvalid(with([](v1::SamplingParams* q) { q->add_banned_token_ids(2000); }), "banned_token_ids");
  ExpectInvalid(with([](v1::SamplingParams* q) { q->set_allowed_token_bitmask(std::string(12, '\xff')); }),
                "allowed_token_bitmask");
  ExpectInvalid(with([](v1::SamplingParams* q) { q->set_presence_penalty(3.0f); }), "presence_penalty");

  // Every sampleable token masked: FAILED_PRECONDITION for this request only.
  absl::StatusOr<v1::SampleResponse> none =
      client_->Sample(with([](v1::SamplingParams* q) { q->set_allowed_token_bitmask(std::string(63 * 4, '\0')); }));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition) << none.status();
  EXPECT_TRUE(client_->Sample(Request(2, 1)).ok());
  EXPECT_TRUE(server_->running());
}

// Runs flashsampler-cli and returns (exit status, stdout).
std::pair<int, std::string> RunCli(const std::string& args) {
  const std::string command = testing::CliBinary() + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// ---- Verify (speculative decoding) against the real binary ----

v1::VerifySequence* AddVerifySequence(v1::VerifyRequest* r, const std::vector<float>& hidden,
                                      const std::vector<int32_t>& drafts, float temperature,
                                      uint64_t seed, uint64_t offset) {
  v1::VerifySequence* s = r->add_sequences();
  const int64_t rows = static_cast<int64_t>(hidden.size()) / kHidden;
  *s->mutable_hidden_states() = MakeHiddenStates(hidden, rows, kHidden, v1::DTYPE_FP32);
  for (int32_t x : drafts) s->add_draft_token_ids(x);
  s->mutable_params()->set_temperature(temperature);
  s->mutable_params()->set_seed(seed);
  s->mutable_params()->set_offset(offset);
  return s;
}

// gamma = 0 is exactly a Sample row with its own params entry.
TEST_F(ServerE2E, VerifyWithoutDraftsEqualsSample) {
  for (const float t : {0.0f, 0.7f, 1.0f}) {
    for (uint64_t seed = 1; seed <= 8; ++seed) {
      const std::vector<float> h = RandomValues(kHidden, 100 + seed);
      v1::SampleRequest sample;
      *sample.mutable_hidden_states() = MakeHiddenStates(h, 1, kHidden, v1::DTYPE_FP32);
      v1::SamplingParams* p = sample.add_params();
      p->set_temperature(t);
      p->set_seed(seed);
      p->set_offset(5);
      absl::StatusOr<v1::SampleResponse> sampled = client_->Sample(sample);
      ASSERT_TRUE(sampled.ok()) << sampled.status();
      v1::VerifyRequest verify;
      AddVerifySequence(&verify, h, {}, t, seed, 5);
      absl::StatusOr<v1::VerifyResponse> verified = client_->Verify(verify);
      ASSERT_TRUE(verified.ok()) << verified.status();
      ASSERT_EQ(verified->sequences_size(), 1);
      EXPECT_EQ(verified->sequences(0).num_accepted(), 0);
      ASSERT_EQ(verified->sequences(0).token_ids_size(), 1);
      EXPECT_EQ(verified->sequences(0).token_ids(0), sampled->token_ids(0)) << t << " " << seed;
      EXPECT_EQ(verified->sequences(0).seed(), seed);
    }
  }
}

// A greedy draft equal to the argmax chain is accepted whole and gets the
// bonus token; a wrong draft stops at the argmax. Mixed gamma in one request,
// T > 0 sequences reproducible, every output field sized as documented.
TEST_F(ServerE2E, VerifyAcceptsTheArgmaxChainAndIsReproducible) {
  const std::vector<float> h = RandomValues(4 * kHidden, 77);
  v1::SampleRequest greedy;
  *greedy.mutable_hidden_states() = MakeHiddenStates(h, 4, kHidden, v1::DTYPE_FP32);
  greedy.add_params()->set_temperature(0.0f);
  absl::StatusOr<v1::SampleResponse> argmax = client_->Sample(greedy);
  ASSERT_TRUE(argmax.ok()) << argmax.status();
  const std::vector<int32_t> chain(argmax->token_ids().begin(), argmax->token_ids().end());

  v1::VerifyRequest r;
  AddVerifySequence(&r, h, {chain[0], chain[1], chain[2]}, 0.0f, 1, 0);
  const int32_t wrong = (chain[1] + 1) % 1990;
  AddVerifySequence(&r, h, {chain[0], wrong, chain[2]}, 0.0f, 1, 0);
  AddVerifySequence(&r, std::vector<float>(h.begin(), h.begin() + 3 * kHidden), {3, 4}, 1.0f, 9, 0);
  v1::VerifySequence* drawn = AddVerifySequence(&r, std::vector<float>(h.begin(), h.begin() + kHidden),
                                                {}, 1.0f, 0, 0);
  drawn->mutable_params()->clear_seed();
  r.set_return_acceptance_probs(true);
  r.set_return_logz(true);
  r.set_request_id("verify-1");
  absl::StatusOr<v1::VerifyResponse> first = client_->Verify(r);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->request_id(), "verify-1");
  ASSERT_EQ(first->sequences_size(), 4);
  const v1::VerifyResult& all = first->sequences(0);
  EXPECT_EQ(all.num_accepted(), 3);
  EXPECT_THAT(all.token_ids(), ::testing::ElementsAre(chain[0], chain[1], chain[2], chain[3]));
  EXPECT_EQ(all.acceptance_probs_size(), 3);
  EXPECT_EQ(all.logz_size(), 4);
  const v1::VerifyResult& stop = first->sequences(1);
  EXPECT_EQ(stop.num_accepted(), 1);
  EXPECT_THAT(stop.token_ids(), ::testing::ElementsAre(chain[0], chain[1]));
  const v1::VerifyResult& sampled = first->sequences(2);
  EXPECT_EQ(sampled.token_ids_size(), sampled.num_accepted() + 1);
  ASSERT_EQ(sampled.acceptance_probs_size(), 2);
  for (float p : sampled.acceptance_probs()) {
    EXPECT_GE(p, 0.0f);
    EXPECT_LE(p, 1.0f);
  }
  EXPECT_EQ(sampled.logz_size(), 3);
  EXPECT_EQ(sampled.seed(), 9u);
  EXPECT_EQ(first->sequences(3).token_ids_size(), 1);

  // The same request (the drawn seed pinned) gives the same response.
  r.mutable_sequences(3)->mutable_params()->set_seed(first->sequences(3).seed());
  absl::StatusOr<v1::VerifyResponse> second = client_->Verify(r);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->SerializeAsString(), first->SerializeAsString());
}

TEST_F(ServerE2E, VerifyBadInputsAreInvalidArgument) {
  const std::vector<float> h2 = RandomValues(2 * kHidden, 3);
  auto expect_invalid = [&](const v1::VerifyRequest& r, const std::string& fragment) {
    absl::StatusOr<v1::VerifyResponse> response = client_->Verify(r);
    ASSERT_FALSE(response.ok()) << "accepted a bad request expected to mention: " << fragment;
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << response.status();
    EXPECT_THAT(std::string(response.status().message()), HasSubstr(fragment));
  };
  v1::VerifyRequest r;
  expect_invalid(r, "sequences is empty");
  r.Clear();
  AddVerifySequence(&r, h2, {1990}, 1.0f, 1, 0);  // >= valid_vocab
  expect_invalid(r, "draft_token_ids[0] is 1990");
  r.Clear();
  AddVerifySequence(&r, h2, {-3}, 1.0f, 1, 0);
  expect_invalid(r, "draft_token_ids[0] is -3");
  r.Clear();
  AddVerifySequence(&r, h2, {1, 2}, 1.0f, 1, 0);  // 2 drafts, 2 rows
  expect_invalid(r, "gamma + 1 = 3");
  r.Clear();
  AddVerifySequence(&r, h2, {}, 1.0f, 1, 0);  // 0 drafts, 2 rows
  expect_invalid(r, "gamma + 1 = 1");
  r.Clear();
  AddVerifySequence(&r, h2, {1}, 1.0f, 1, 0)->mutable_hidden_states()->set_shape(1, kHidden + 1);
  expect_invalid(r, "hidden size 64");
  r.Clear();
  AddVerifySequence(&r, h2, {1}, 1.0f, 1, 0)->mutable_hidden_states()->set_dtype(v1::DTYPE_UNSPECIFIED);
  expect_invalid(r, "dtype");
  r.Clear();
  AddVerifySequence(&r, RandomValues(40 * kHidden, 4), std::vector<int32_t>(39, 1), 1.0f, 1, 0);
  AddVerifySequence(&r, RandomValues(30 * kHidden, 5), std::vector<int32_t>(29, 1), 1.0f, 1, 0);
  expect_invalid(r, "over this server's limit of 64");
  r.Clear();
  AddVerifySequence(&r, h2, {1}, -1.0f, 1, 0);
  expect_invalid(r, "temperature");
  r.Clear();
  AddVerifySequence(&r, h2, {1}, 1.0f, 1, 0)->mutable_params()->set_top_logprobs(1);
  expect_invalid(r, "top_logprobs");
  // Still serving.
  r.Clear();
  AddVerifySequence(&r, h2, {1}, 1.0f, 1, 0);
  EXPECT_TRUE(client_->Verify(r).ok());
}

TEST_F(ServerE2E, CliSampleInfoHealth) {
  const std::string address = "--address=" + server_->address();
  auto [info_rc, info] = RunCli(address + " info");
  EXPECT_EQ(info_rc, 0) << info;
  EXPECT_THAT(info, HasSubstr("vocab_size: 2000"));
  EXPECT_THAT(info, HasSubstr("hidden_size: 64"));

  auto [health_rc, health] = RunCli(address + " health");
  EXPECT_EQ(health_rc, 0) << health;
  EXPECT_THAT(health, HasSubstr("SERVING"));

  auto [sample_rc, sample] =
      RunCli(address + " sample --rows=3 --seed=9 --temperature=0.7 --logz --logprobs --repeat=3");
  EXPECT_EQ(sample_rc, 0) << sample;
  EXPECT_THAT(sample, HasSubstr("token_ids: ["));
  EXPECT_THAT(sample, HasSubstr("logz: ["));
  EXPECT_THAT(sample, HasSubstr("seeds: [9, 9, 9]"));
  EXPECT_THAT(sample, HasSubstr("latency: "));

  auto [stream_rc, stream] = RunCli(address + " sample --rows=2 --stream --repeat=4");
  EXPECT_EQ(stream_rc, 0) << stream;
  EXPECT_THAT(stream, HasSubstr("token_ids: ["));

  auto [controls_rc, controls] =
      RunCli(address + " sample --rows=2 --seed=3 --top_k=4 --top_p=0.9 --min_p=0.01 --top_logprobs=2");
  EXPECT_EQ(controls_rc, 0) << controls;
  EXPECT_THAT(controls, HasSubstr("row 1: samples ["));
  EXPECT_THAT(controls, HasSubstr(" top ["));

  auto [verify_rc, verify] =
      RunCli(address + " verify --drafts=12,7,99 --temperature=0.8 --seed=4 --logz");
  EXPECT_EQ(verify_rc, 0) << verify;
  EXPECT_THAT(verify, HasSubstr("num_accepted: "));
  EXPECT_THAT(verify, HasSubstr("acceptance_probs: ["));
  EXPECT_THAT(verify, HasSubstr("seed: 4"));
  auto [bad_verify_rc, bad_verify] = RunCli(address + " verify --drafts=5000");
  EXPECT_EQ(bad_verify_rc, 1) << bad_verify;
  EXPECT_THAT(bad_verify, HasSubstr("INVALID_ARGUMENT"));

  auto [bad_top_p_rc, bad_top_p] = RunCli(address + " sample --top_p=0");
  EXPECT_EQ(bad_top_p_rc, 1) << bad_top_p;
  EXPECT_THAT(bad_top_p, HasSubstr("top_p"));

  auto [bad_rc, bad] = RunCli(address + " sample --temperature=-1");
  EXPECT_EQ(bad_rc, 1) << bad;
  EXPECT_THAT(bad, HasSubstr("INVALID_ARGUMENT"));
}

TEST(ServerLifecycle, SigtermDrainsInFlightRequestsAndExitsZero) {
  // Four big batches on the default-size demo head: they run one after the
  // other, so most of them are still queued or computing when SIGTERM arrives.
  // Every admitted call must still be answered, and the last answer must come
  // after the signal (otherwise nothing was drained and the test proves nothing).
  // The CPU backend with two threads keeps each batch busy for a while on any
  // machine (on a GPU the four batches would be done before the signal).
  ServerProcess server({"--backend=cpu", "--demo_vocab=32000", "--demo_hidden=1024",
                        "--max_request_rows=1024", "--threads=2", "--grace_period_s=120",
                        "--metrics_address=127.0.0.1:0"});
  ASSERT_TRUE(server.Start().ok());
  ASSERT_FALSE(server.metrics_address().empty());
  SamplerClient client(server.address());
  v1::SampleRequest request;
  *request.mutable_hidden_states() =
      MakeHiddenStates(RandomValues(1024 * 1024, 5), 1024, 1024, v1::DTYPE_BF16);
  request.add_params()->set_temperature(1.0f);
  constexpr int kCalls = 4;
  std::vector<absl::StatusOr<v1::SampleResponse>> responses(kCalls);
  std::vector<absl::Time> answered(kCalls);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCalls; ++i) {
    callers.emplace_back([&, i] {
      responses[i] = client.Sample(request, absl::Seconds(300));
      answered[i] = absl::Now();
    });
  }
  // A call is admitted once the server has read it whole and counted it in
  // flight (or, if it was already answered, in requests_total). HTTP/2
  // streams are independent, so nothing but the server's own count says that
  // all four 2 MiB calls have arrived; a call that arrives after the drain
  // begins is refused with UNAVAILABLE, as documented.
  auto all_admitted = [&](const std::string& m) {
    return SeriesValue(m, "flashsampler_inflight_requests") +
               SeriesValue(m, "flashsampler_requests_total{code=\"OK\",method=\"Sample\"}") >=
           kCalls;
  };
  const absl::Status admitted = testing::WaitForMetrics(server.metrics_address(), all_admitted);
  ASSERT_TRUE(admitted.ok()) << admitted;
  const absl::Time signalled = absl::Now();
  absl::StatusOr<int> exit_code = server.Stop(SIGTERM, absl::Seconds(240));
  for (std::thread& t : callers) t.join();
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(responses[i].ok()) << "call " << i << " lost on SIGTERM: " << responses[i].status();
    EXPECT_EQ(responses[i]->token_ids_size(), 1024);
  }
  EXPECT_GT(*std::max_element(answered.begin(), answered.end()), signalled)
      << "every call finished before SIGTERM: the drain was not exercised";
}

// Threads that libraries start before main (OpenBLAS's pool did) do not
// block SIGTERM. A SIGTERM the kernel hands to one of them must still drain
// the server, not kill it: sent straight to such a thread (tgkill), the
// process exits 0 after the drain. (With the default action it died by the
// signal, once, in a CI run under load.) The server links no such library
// now, so the test preloads one (tests/e2e/early_thread_preload.cc).
// Starts `server` with a thread that exists before main and does not block
// SIGINT/SIGTERM (the preloaded library, as OpenBLAS's pool), and returns that
// thread's id, or -1.
pid_t StartWithAnEarlyThread(ServerProcess& server) {
  // The child inherits this environment at Start; ASan builds accept a
  // preload ahead of their runtime only with verify_asan_link_order=0.
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string asan_options =
      absl::StrCat(asan != nullptr ? asan : "", asan != nullptr ? ":" : "", "verify_asan_link_order=0");
  EXPECT_EQ(setenv("LD_PRELOAD", FLASHSAMPLER_EARLY_THREAD_PRELOAD, 1), 0);
  EXPECT_EQ(setenv("ASAN_OPTIONS", asan_options.c_str(), 1), 0);
  const absl::Status started = server.Start();
  unsetenv("LD_PRELOAD");
  if (asan != nullptr) {
    setenv("ASAN_OPTIONS", asan, 1);
  } else {
    unsetenv("ASAN_OPTIONS");
  }
  EXPECT_TRUE(started.ok()) << started;
  if (!started.ok()) return -1;
  // A thread other than main whose mask does not block SIGTERM (bit 15).
  const std::string tasks = absl::StrCat("/proc/", server.pid(), "/task");
  for (const auto& entry : std::filesystem::directory_iterator(tasks)) {
    const pid_t tid = static_cast<pid_t>(std::stol(entry.path().filename().string()));
    if (tid == server.pid()) continue;
    std::ifstream status(entry.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("SigBlk:", 0) != 0) continue;
      const unsigned long long blocked = std::stoull(line.substr(7), nullptr, 16);
      if ((blocked & (1ull << (SIGTERM - 1))) == 0) return tid;
    }
  }
  return -1;
}

TEST(ServerLifecycle, SigtermThatLandsOnALibraryThreadStillDrains) {
  ServerProcess server({"--backend=cpu", "--demo_vocab=100", "--demo_hidden=8"});
  const pid_t target = StartWithAnEarlyThread(server);
  ASSERT_GT(target, 0) << "the preloaded thread is missing";
  ASSERT_EQ(syscall(SYS_tgkill, server.pid(), target, SIGTERM), 0);
  absl::StatusOr<int> exit_code = server.WaitForExit(absl::Seconds(60));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
}

// A second signal during the drain ends the process at once (exit 1), also
// when it lands on a library thread: here the drain's lame-duck pause would
// last a minute, and SIGTERM is sent to that thread until the process exits.
TEST(ServerLifecycle, ASecondSignalOnALibraryThreadEndsTheDrain) {
  ServerProcess server({"--backend=cpu", "--demo_vocab=100", "--demo_hidden=8", "--grace_period_s=120",
                        "--lame_duck_ms=60000"});
  const pid_t target = StartWithAnEarlyThread(server);
  ASSERT_GT(target, 0) << "the preloaded thread is missing";
  for (int i = 0; i < 300 && server.running(); ++i) {  // one signal every 100 ms, 30 s at most
    syscall(SYS_tgkill, server.pid(), target, SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  absl::StatusOr<int> exit_code = server.WaitForExit(absl::Seconds(5));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status() << " (the second signals were lost)";
  EXPECT_EQ(*exit_code, 1);
}

// One stop sent twice at once (timeout(1) signals the process and its group)
// is one stop: the server drains and exits 0. The repeat comes once the first
// was taken (health NOT_SERVING; two pending SIGTERMs would merge into one),
// well inside the second that tells a repeat from an operator's second signal.
TEST(ServerLifecycle, TheSameStopSentTwiceAtOnceStillDrains) {
  ServerProcess server({"--backend=cpu", "--demo_vocab=100", "--demo_hidden=8", "--lame_duck_ms=2000"});
  ASSERT_TRUE(server.Start().ok());
  SamplerClient client(server.address());
  ASSERT_TRUE(client.GetModelInfo().ok());  // the channel is up before the clock starts
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  for (;;) {
    absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> health =
        client.CheckHealth("", absl::Seconds(5));
    ASSERT_TRUE(health.ok()) << health.status();
    if (*health != grpc::health::v1::HealthCheckResponse::SERVING) break;
  }
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  absl::StatusOr<int> exit_code = server.WaitForExit(absl::Seconds(60));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
}

// A second server on the address of one that runs (the same TCP port, or the
// same unix: socket file) refuses to start and leaves the first one serving:
// gRPC would share the port (SO_REUSEPORT) or replace the socket file.
TEST(ServerLifecycle, AnAddressInUseIsRefusedAndTheFirstServerKeepsIt) {
  testing::ScopedTempDir dir("server_e2e_address");
  const std::string unix_address = "unix:" + dir.Path("s.sock");
  ServerProcess tcp({"--demo_vocab=100", "--demo_hidden=8"});
  ASSERT_TRUE(tcp.Start().ok());
  ServerProcess on_unix({"--demo_vocab=100", "--demo_hidden=8", "--address=" + unix_address});
  ASSERT_TRUE(on_unix.Start().ok());
  for (const std::string& taken : {tcp.address(), unix_address}) {
    SCOPED_TRACE(taken);
    ServerProcess second({"--demo_vocab=100", "--demo_hidden=8", "--address=" + taken});
    EXPECT_FALSE(second.Start().ok());
    absl::StatusOr<int> exit_code = second.WaitForExit(absl::Seconds(30));
    ASSERT_TRUE(exit_code.ok()) << exit_code.status();
    EXPECT_EQ(*exit_code, 1);
  }
  for (ServerProcess* first : {&tcp, &on_unix}) {
    SamplerClient client(first->address());
    EXPECT_TRUE(client.GetModelInfo().ok()) << first->address();
    absl::StatusOr<int> exit_code = first->Stop(SIGTERM, absl::Seconds(30));
    ASSERT_TRUE(exit_code.ok()) << exit_code.status();
    EXPECT_EQ(*exit_code, 0);
  }
}

TEST(ServerLifecycle, SigintOnAnIdleServerExitsZeroWithoutWaitingForTheGrace) {
  // With nothing in flight the drain must not wait out the (long) grace period:
  // Stop gives up after 30 s, well inside the 600 s grace.
  ServerProcess server({"--demo_vocab=100", "--demo_hidden=8", "--grace_period_s=600"});
  ASSERT_TRUE(server.Start().ok());
  absl::StatusOr<int> exit_code = server.Stop(SIGINT, absl::Seconds(30));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
}

TEST(ServerLifecycle, SigtermClosesAnIdleStreamAtOnce) {
  // A serving engine keeps its stream open between decode steps. On SIGTERM
  // the server must close it (UNAVAILABLE: reconnect elsewhere) instead of
  // waiting out the grace period (600 s here; Stop gives up after 30 s).
  ServerProcess server({"--backend=cpu", "--demo_vocab=100", "--demo_hidden=8",
                        "--grace_period_s=600"});
  ASSERT_TRUE(server.Start().ok());
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Sampler::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->SampleStream(&context);
  v1::SampleRequest request;
  *request.mutable_hidden_states() = MakeHiddenStates(RandomValues(8, 1), 1, 8, v1::DTYPE_FP32);
  request.add_params()->set_temperature(1.0f);
  ASSERT_TRUE(stream->Write(request));
  v1::SampleResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.token_ids_size(), 1);

  absl::StatusOr<int> exit_code = server.Stop(SIGTERM, absl::Seconds(30));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("shutting down"));
}

// The CPU backend is batch-invariant: 17 Verify sequences answered alone and
// then together in one request get the same bits: tokens, acceptance
// probabilities and log Z. (With the OpenBLAS logits it used before, whose
// summation order follows the batch's shape, the acceptance probabilities of
// most sequences moved in their last bits: an acceptance decision could flip
// with the neighbours.)
TEST(ServerBatchInvariance, VerifySequencesGetTheSameBitsAloneAndTogether) {
  ServerProcess server({"--backend=cpu", "--demo_vocab=1000", "--demo_hidden=64", "--threads=2"});
  ASSERT_TRUE(server.Start().ok());
  SamplerClient client(server.address());
  constexpr int kSequences = 17;
  v1::VerifyRequest together;
  together.set_return_acceptance_probs(true);
  together.set_return_logz(true);
  std::vector<v1::VerifyRequest> alone(kSequences, together);
  for (int i = 0; i < kSequences; ++i) {
    const int gamma = 1 + i % 5;
    std::vector<int32_t> drafts;
    for (int j = 0; j < gamma; ++j) drafts.push_back((37 * i + 11 * j) % 1000);
    const std::vector<float> h = RandomValues((gamma + 1) * kHidden, 900 + i);
    AddVerifySequence(&together, h, drafts, 0.5f + 0.1f * (i % 6), 70 + i, 3);
    AddVerifySequence(&alone[i], h, drafts, 0.5f + 0.1f * (i % 6), 70 + i, 3);
  }
  absl::StatusOr<v1::VerifyResponse> all = client.Verify(together);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->sequences_size(), kSequences);
  for (int i = 0; i < kSequences; ++i) {
    absl::StatusOr<v1::VerifyResponse> one = client.Verify(alone[i]);
    ASSERT_TRUE(one.ok()) << one.status();
    const v1::VerifyResult& a = one->sequences(0);
    const v1::VerifyResult& b = all->sequences(i);
    EXPECT_EQ(a.num_accepted(), b.num_accepted()) << "sequence " << i;
    EXPECT_THAT(a.token_ids(), ::testing::ElementsAreArray(b.token_ids())) << "sequence " << i;
    // EXPECT_THAT compares floats with ==: bit equality for finite values.
    EXPECT_THAT(a.acceptance_probs(), ::testing::ElementsAreArray(b.acceptance_probs())) << "sequence " << i;
    EXPECT_THAT(a.logz(), ::testing::ElementsAreArray(b.logz())) << "sequence " << i;
  }
  absl::StatusOr<int> exit_code = server.Stop(SIGTERM, absl::Seconds(60));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
}

// --address=unix:PATH serves on a Unix domain socket (a client on the same
// host): the same service, and the same tokens as over TCP for the same
// request (the demo head and the RNG contract fix them).
TEST(ServerTransport, UnixDomainSocketServesTheSameTokensAsTcp) {
  testing::ScopedTempDir dir("uds");
  const std::string socket_address = "unix:" + dir.Path("sampler.sock");
  const std::vector<std::string> flags = {"--backend=cpu", "--demo_vocab=2000", "--demo_hidden=64",
                                          "--threads=2"};
  std::vector<std::string> uds_flags = flags;
  uds_flags.push_back("--address=" + socket_address);  // the last --address wins
  ServerProcess tcp(flags);
  ServerProcess uds(uds_flags);
  ASSERT_TRUE(tcp.Start().ok());
  const absl::Status started = uds.Start();
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_EQ(uds.address(), socket_address);

  v1::SampleRequest request = Request(8, 7);
  request.mutable_params(0)->set_seed(1234);
  request.set_return_logz(true);
  SamplerClient over_tcp(tcp.address());
  SamplerClient over_uds(uds.address());
  absl::StatusOr<v1::SampleResponse> a = over_tcp.Sample(request);
  absl::StatusOr<v1::SampleResponse> b = over_uds.Sample(request);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->token_ids_size(), 8);
  EXPECT_EQ(std::vector<int32_t>(a->token_ids().begin(), a->token_ids().end()),
            std::vector<int32_t>(b->token_ids().begin(), b->token_ids().end()));
  EXPECT_EQ(std::vector<float>(a->logz().begin(), a->logz().end()),
            std::vector<float>(b->logz().begin(), b->logz().end()));
  for (ServerProcess* server : {&tcp, &uds}) {
    absl::StatusOr<int> exit_code = server->Stop(SIGTERM, absl::Seconds(30));
    ASSERT_TRUE(exit_code.ok()) << exit_code.status();
    EXPECT_EQ(*exit_code, 0);
  }
}

TEST(ServerLifecycle, BadFlagsExitTwoAndMissingWeightsExitOne) {
  ServerProcess bad_backend({"--backend=tpu"});
  EXPECT_FALSE(bad_backend.Start(absl::Seconds(10)).ok());
  absl::StatusOr<int> code = bad_backend.WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 2);

  // --shard_split must match --devices (checked with the flags; without
  // --devices main.cc checks it against the GPUs found at start), and means
  // nothing to the CPU backend; --shard_exchange is nccl or peer;
  // --idle_spin_us is -1 or in [0, 1000000].
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--backend=cuda", "--devices=0", "--shard_split=1,3"},
        std::vector<std::string>{"--backend=cpu", "--shard_split=1,3"},
        std::vector<std::string>{"--shard_exchange=allreduce"},
        std::vector<std::string>{"--idle_spin_us=-2"},
        std::vector<std::string>{"--idle_spin_us=2000000"}}) {
    ServerProcess bad_split(flags);
    EXPECT_FALSE(bad_split.Start(absl::Seconds(10)).ok());
    code = bad_split.WaitForExit(absl::Seconds(10));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 2) << flags.back();
  }

  ServerProcess missing({"--weights=/nonexistent/model.safetensors"});
  EXPECT_FALSE(missing.Start(absl::Seconds(10)).ok());
  code = missing.WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 1);
}

// Client-side load balancing: a client of a name that resolves to two
// servers (here "ipv4:A,B", as a headless Kubernetes service's DNS name does)
// reaches both. gRPC's default, pick_first, would send every call to A; the
// clients' service config (client/channel_security.h) asks for round_robin.
TEST(ClientLoadBalancing, CallsToANameOfTwoServersReachBoth) {
  std::vector<std::unique_ptr<ServerProcess>> servers;
  for (int i = 0; i < 2; ++i) {
    servers.push_back(std::make_unique<ServerProcess>(std::vector<std::string>{
        "--backend=cpu", "--demo_vocab=2000", "--demo_hidden=64", "--threads=1",
        "--metrics_address=127.0.0.1:0"}));
    ASSERT_TRUE(servers.back()->Start().ok());
  }
  auto client = std::make_unique<SamplerClient>(
      absl::StrCat("ipv4:", servers[0]->address(), ",", servers[1]->address()));
  v1::SampleRequest request = Request(2, 3);
  auto answered = [](ServerProcess& server) {
    absl::StatusOr<std::string> m = testing::HttpGet(server.metrics_address(), "/metrics");
    return m.ok() ? SeriesValue(*m, "flashsampler_requests_total{code=\"OK\",method=\"Sample\"}") : 0.0;
  };
  // round_robin spreads calls once both connections are up; until then the
  // first one up takes them. Bounded by calls, not time.
  double a = 0, b = 0;
  int calls = 0;
  for (int round = 0; round < 100 && (a == 0 || b == 0); ++round) {
    for (int i = 0; i < 10; ++i, ++calls) ASSERT_TRUE(client->Sample(request).ok());
    a = answered(*servers[0]);
    b = answered(*servers[1]);
  }
  EXPECT_GT(a, 0) << "after " << calls << " calls";
  EXPECT_GT(b, 0) << "after " << calls << " calls";
  EXPECT_EQ(a + b, calls);
  client.reset();  // an idle C++ client still connected holds a server's stop ~5 s (gRPC 1.51)
  for (auto& server : servers) {
    absl::StatusOr<int> exit_code = server->Stop(SIGTERM, absl::Seconds(30));
    ASSERT_TRUE(exit_code.ok());
    EXPECT_EQ(*exit_code, 0);
  }
}

}  // namespace
}  // namespace flashsampler
