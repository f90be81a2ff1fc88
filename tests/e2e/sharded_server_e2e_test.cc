// End to end on two GPUs (ctest labels `gpu`, `multi_gpu`): the real
// flashsampler-server with --devices=0,1 (vocabulary sharded over both GPUs,
// NCCL summary exchange) answers exactly like the same server on one GPU: same
// seeds, same tokens; logz and logprobs to fp32 rounding; /metrics reports
// shards="2". Skipped with fewer than 2 GPUs; fails with none (like every GPU
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
  absl::StatusOr<std::string> metrics = testing::HttpGet(two.metrics_address(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("shards=\"2\""));

  for (ServerProcess* server : {&one, &two}) {
    absl::StatusOr<int> exit_code = server->Stop(SIGTERM, absl::Seconds(30));
    ASSERT_TRUE(exit_code.ok()) << exit_code.status();
    EXPECT_EQ(*exit_code, 0);
  }
}

}  // namespace
}  // namespace flashsampler
