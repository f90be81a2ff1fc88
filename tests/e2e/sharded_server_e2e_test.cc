// End to end on two GPUs (ctest labels `gpu`, `multi_gpu`): the real
// flashsampler-server with --devices=0,1 (vocabulary sharded over both GPUs,
// NCCL summary exchange) answers exactly like the same server on one GPU: same
// seeds, same tokens; logz and logprobs to fp32 rounding; requests with
// sampling controls and Verify are served (the gathered-logits path) with the
// one-GPU results; /metrics reports shards="2". Skipped with fewer than 2 GPUs; fails with none (like every GPU
// test). Built only with NCCL.
#include <cuda_runtime_api.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "client/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/http_get.h"
#include "tests/e2e/server_process.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;
using testing::ServerProcess;

constexpr int64_t kHidden = 512;

std::vector<std::string> Flags(const std::string& devices) {
  return {"--backend=cuda", "--devices=" + devices, "--demo_vocab=50000",
          "--demo_hidden=512", "--valid_vocab=49990", "--max_request_rows=64",
          "--max_batch_rows=64", "--metrics_address=127.0.0.1:0"};
}

v1::SampleRequest Request(int64_t rows, uint64_t seed) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  std::vector<float> values(rows * kHidden);
  for (float& v : values) v = normal(gen);
  v1::SampleRequest r;
  *r.mutable_hidden_states() = MakeHiddenStates(values, rows, kHidden, v1::DTYPE_FP32);
  for (int64_t i = 0; i < rows; ++i) {
    v1::SamplingParams* p = r.add_params();
    p->set_temperature(i % 4 == 0 ? 0.0f : 0.7f);
    p->set_seed(seed * 100 + i);
    p->set_offset(i);
  }
  r.set_return_logz(true);
  r.set_return_logprobs(true);
  return r;
}

TEST(ShardedServerE2E, TwoGpusAnswerLikeOne) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess) << "this GPU test needs a CUDA device";
  if (count < 2) GTEST_SKIP() << "needs 2 GPUs (ctest label multi_gpu), found " << count;

  ServerProcess one(Flags("0"));
  ServerProcess two(Flags("0,1"));
  ASSERT_TRUE(one.Start().ok());
  ASSERT_TRUE(two.Start().ok());
  SamplerClient one_client(one.address());
  SamplerClient two_client(two.address());

  for (int64_t rows : {1, 7, 64}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      const v1::SampleRequest request = Request(rows, seed + 10 * rows);
      absl::StatusOr<v1::SampleResponse> a = one_client.Sample(request);
      absl::StatusOr<v1::SampleResponse> b = two_client.Sample(request);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      ASSERT_EQ(a->token_ids_size(), rows);
      ASSERT_EQ(b->token_ids_size(), rows);
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(b->token_ids(r), a->token_ids(r)) << "rows " << rows << " row " << r;
        EXPECT_NEAR(b->logz(r), a->logz(r), 2e-5f * std::max(1.0f, std::abs(a->logz(r))));
        EXPECT_NEAR(b->logprobs(r), a->logprobs(r), 2e-5f * std::max(1.0f, std::abs(a->logz(r))));
      }
    }
  }
  // Sampling controls and Verify across the shards (the gathered-logits
  // path): answered, with the one-GPU server's results. The logits come from
  // cuBLAS on another GEMM shape, so a near-tie may flip: the tokens must
  // agree on all but a handful of the 128 rows, the acceptance counts on
  // every sequence but one.
  v1::SampleRequest controlled = Request(64, 99);
  for (int i = 0; i < controlled.params_size(); ++i) {
    v1::SamplingParams* p = controlled.mutable_params(i);
    if (i % 2 == 0) p->set_top_k(20);
    if (i % 3 == 0) p->set_top_p(0.8f);
    p->set_top_logprobs(i % 4 == 0 ? 3 : 0);
  }
  int differing = 0;
  for (int rep = 0; rep < 2; ++rep) {
    controlled.mutable_params(0)->set_seed(1000 + rep);
    absl::StatusOr<v1::SampleResponse> a = one_client.Sample(controlled);
    absl::StatusOr<v1::SampleResponse> b = two_client.Sample(controlled);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(b->token_ids_size(), 64);
    for (int r = 0; r < 64; ++r) differing += b->token_ids(r) != a->token_ids(r) ? 1 : 0;
  }
  EXPECT_LE(differing, 2);

  v1::VerifyRequest verify;
  verify.set_return_acceptance_probs(true);
  for (int s = 0; s < 8; ++s) {
    const v1::SampleRequest rows = Request(4, 500 + s);
    v1::VerifySequence* seq = verify.add_sequences();
    *seq->mutable_hidden_states() = rows.hidden_states();
    for (int j = 0; j < 3; ++j) seq->add_draft_token_ids((s * 977 + j * 131) % 49990);
    seq->mutable_params()->set_temperature(0.8f);
    seq->mutable_params()->set_seed(70 + s);
    if (s % 2 == 1) seq->mutable_params()->set_top_k(50);
  }
  absl::StatusOr<v1::VerifyResponse> va = one_client.Verify(verify);
  absl::StatusOr<v1::VerifyResponse> vb = two_client.Verify(verify);
  ASSERT_TRUE(va.ok()) << va.status();
  ASSERT_TRUE(vb.ok()) << vb.status();
  ASSERT_EQ(vb->sequences_size(), 8);
  int verify_differing = 0;
  for (int s = 0; s < 8; ++s) {
    ASSERT_EQ(vb->sequences(s).acceptance_probs_size(), 3);
    if (vb->sequences(s).num_accepted() != va->sequences(s).num_accepted() ||
        vb->sequences(s).token_ids(vb->sequences(s).token_ids_size() - 1) !=
            va->sequences(s).token_ids(va->sequences(s).token_ids_size() - 1)) {
      ++verify_differing;
    }
  }
  EXPECT_LE(verify_differing, 1);

  absl::StatusOr<std::string> metrics = testing::HttpGet(two.metrics_address(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("shards=\"2\""));
  EXPECT_THAT(*metrics, HasSubstr("path=\"sharded_controlled\""));

  for (ServerProcess* server : {&one, &two}) {
    absl::StatusOr<int> exit_code = server->Stop(SIGTERM, absl::Seconds(30));
    ASSERT_TRUE(exit_code.ok()) << exit_code.status();
    EXPECT_EQ(*exit_code, 0);
  }
}

}  // namespace
}  // namespace flashsampler
