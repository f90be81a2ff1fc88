// End to end, serving under load: the real flashsampler-server with the
// dynamic batcher, admission control, /metrics and SIGTERM.
//   - many concurrent clients (unary and streams) get exactly the tokens of
//     unbatched runs, and the batch-size histogram shows coalescing;
//   - a burst beyond the queue is refused with RESOURCE_EXHAUSTED only, the
//     metrics count it, and the server recovers;
//   - a request whose deadline passes while queued is answered
//     DEADLINE_EXCEEDED and never launched;
//   - SIGTERM under load: every call gets its answer or UNAVAILABLE, exit 0.
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/model/safetensors_writer.h"
#include "tests/common/http_get.h"
#include "tests/common/scoped_temp_dir.h"
#include "tests/common/metrics_text.h"
#include "tests/e2e/server_process.h"

namespace flashsampler {
namespace {

using testing::SeriesValue;
using testing::ServerProcess;

std::string Scrape(const ServerProcess& server) {
  absl::StatusOr<std::string> body = testing::HttpGet(server.metrics_address(), "/metrics");
  EXPECT_TRUE(body.ok()) << body.status();
  return body.ok() ? *body : std::string();
}

// ---------------------------------------------------------------------------
// Coalescing: an LM head and hidden states of small integers make every logit
// exact in fp32 whatever BLAS blocking a launch size gets, so "the same
// tokens as unbatched" is an exact statement here (server/README-dev.md,
// "Batch invariance").
constexpr int64_t kVocab = 4096, kHidden = 32;

std::string WriteIntegerHead(const testing::ScopedTempDir& dir) {
  std::mt19937 gen(11);
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<float> w(kVocab * kHidden);
  for (float& x : w) x = static_cast<float>(small(gen));
  const std::string path = dir.Path("integer_head.safetensors");
  const absl::Status s = WriteSafetensors(
      path, {{"lm_head.weight", "F32", {kVocab, kHidden}, w.data(), w.size() * sizeof(float)}});
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

// Request i: 1..8 rows, integer hidden states, explicit seeds; every third
// has one params entry per row, some ask for logz / logprobs.
v1::SampleRequest IntegerRequest(int i) {
  std::mt19937 gen(static_cast<uint32_t>(1000 + i));
  std::uniform_int_distribution<int> small(-3, 3);
  const int64_t rows = 1 + i % 8;
  std::vector<float> h(rows * kHidden);
  for (float& x : h) x = static_cast<float>(small(gen));
  v1::SampleRequest r;
  *r.mutable_hidden_states() = MakeHiddenStates(h, rows, kHidden, v1::DTYPE_FP32);
  const int entries = i % 3 == 0 ? static_cast<int>(rows) : 1;
  for (int e = 0; e < entries; ++e) {
    v1::SamplingParams* p = r.add_params();
    p->set_temperature(i % 5 == 0 ? 0.0f : 0.6f + 0.1f * (i % 4));
    p->set_seed(500 + 7 * i + e);
    p->set_offset(i % 2);
  }
  r.set_return_logz(i % 2 == 0);
  r.set_return_logprobs(i % 4 == 1);
  r.set_request_id(absl::StrCat("req-", i));
  return r;
}

void ExpectSameAnswer(const v1::SampleResponse& got, const v1::SampleResponse& want, int i) {
  EXPECT_THAT(got.token_ids(), ::testing::ElementsAreArray(want.token_ids())) << "request " << i;
  EXPECT_THAT(got.logz(), ::testing::ElementsAreArray(want.logz())) << "request " << i;
  EXPECT_THAT(got.logprobs(), ::testing::ElementsAreArray(want.logprobs())) << "request " << i;
  EXPECT_EQ(got.request_id(), want.request_id());
}

TEST(ServingE2E, ConcurrentClientsGetTheUnbatchedTokensAndLaunchesAreCoalesced) {
  testing::ScopedTempDir dir("serving_e2e");
  ServerProcess server({"--backend=cpu", "--weights=" + WriteIntegerHead(dir), "--threads=2",
                        "--max_request_rows=16", "--max_batch_rows=64", "--max_queue_delay_us=5000",
                        "--metrics_address=127.0.0.1:0"});
  ASSERT_TRUE(server.Start().ok());
  ASSERT_FALSE(server.metrics_address().empty());
  SamplerClient client(server.address());

  // Unbatched reference: one call at a time, so each launch holds one request
  // (checked on the launch counter).
  constexpr int kRequests = 64;
  std::vector<v1::SampleRequest> requests;
  std::vector<v1::SampleResponse> reference;
  int64_t total_rows = 0;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(IntegerRequest(i));
    total_rows += requests.back().hidden_states().shape(0);
    absl::StatusOr<v1::SampleResponse> r = client.Sample(requests.back());
    ASSERT_TRUE(r.ok()) << r.status();
    reference.push_back(*r);
  }
  const std::string before = Scrape(server);
  ASSERT_EQ(SeriesValue(before, "flashsampler_batch_rows_count"), kRequests);
  ASSERT_EQ(SeriesValue(before, "flashsampler_batch_rows_sum"), total_rows);

  // The same requests from 16 concurrent clients: 8 unary callers and 8
  // streams, 4 requests each.
  constexpr int kCallers = 16, kPerCaller = kRequests / kCallers;
  std::vector<std::vector<absl::StatusOr<v1::SampleResponse>>> got(
      kCallers, std::vector<absl::StatusOr<v1::SampleResponse>>(kPerCaller, absl::UnknownError("")));
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      if (c % 2 == 0) {
        for (int k = 0; k < kPerCaller; ++k) got[c][k] = client.Sample(requests[c + kCallers * k]);
        return;
      }
      std::vector<v1::SampleRequest> mine;
      for (int k = 0; k < kPerCaller; ++k) mine.push_back(requests[c + kCallers * k]);
      absl::StatusOr<std::vector<v1::SampleResponse>> answers = client.SampleStream(mine);
      for (int k = 0; k < kPerCaller; ++k) {
        got[c][k] = answers.ok() ? absl::StatusOr<v1::SampleResponse>((*answers)[k])
                                 : absl::StatusOr<v1::SampleResponse>(answers.status());
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    for (int k = 0; k < kPerCaller; ++k) {
      const int i = c + kCallers * k;
      ASSERT_TRUE(got[c][k].ok()) << "request " << i << ": " << got[c][k].status();
      ExpectSameAnswer(*got[c][k], reference[i], i);
    }
  }

  const std::string after = Scrape(server);
  const double launches = SeriesValue(after, "flashsampler_batch_rows_count") - kRequests;
  EXPECT_EQ(SeriesValue(after, "flashsampler_batch_rows_sum"), 2 * total_rows);
  EXPECT_LT(launches, kRequests) << "concurrent requests were never coalesced into one launch";
  // Every launch of the CPU backend is labelled with its path.
  EXPECT_EQ(SeriesValue(after, "flashsampler_launches_total{path=\"cpu\"}"),
            SeriesValue(after, "flashsampler_batch_rows_count"));
  EXPECT_EQ(SeriesValue(after, "flashsampler_requests_total{code=\"OK\",method=\"Sample\"}"),
            kRequests + kRequests / 2);
  EXPECT_EQ(SeriesValue(after, "flashsampler_requests_total{code=\"OK\",method=\"SampleStream\"}"),
            kRequests / 2);
  EXPECT_EQ(SeriesValue(after, "flashsampler_rows_total{method=\"Sample\"}") +
                SeriesValue(after, "flashsampler_rows_total{method=\"SampleStream\"}"),
            2 * total_rows);
  EXPECT_EQ(SeriesValue(after, "flashsampler_queue_rows"), 0);
  EXPECT_EQ(SeriesValue(after, "flashsampler_serving"), 1);
  EXPECT_EQ(SeriesValue(after, "flashsampler_inflight_requests"), 0);
  EXPECT_EQ(SeriesValue(after, "flashsampler_request_duration_seconds_count{method=\"Sample\"}"),
            kRequests + kRequests / 2);
  EXPECT_EQ(SeriesValue(after, "flashsampler_queue_duration_seconds_count"), 2 * kRequests);
  EXPECT_EQ(SeriesValue(after, "flashsampler_model_info{backend=\"cpu\",dtype=\"F32\",hidden_size=\"32\","
                               "shards=\"1\",valid_vocab=\"4096\",vocab_size=\"4096\"}"),
            1);
  EXPECT_THAT(after, ::testing::HasSubstr("flashsampler_compute_duration_seconds_bucket{le=\"5e-05\"}"));
  EXPECT_THAT(after, ::testing::Not(::testing::HasSubstr("flashsampler_device_memory")));
}

// ---------------------------------------------------------------------------
std::vector<float> NormalValues(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

v1::SampleRequest DemoRequest(int64_t rows, int64_t hidden, uint32_t seed) {
  v1::SampleRequest r;
  *r.mutable_hidden_states() = MakeHiddenStates(NormalValues(rows * hidden, seed), rows, hidden,
                                                v1::DTYPE_BF16);
  r.add_params()->set_temperature(1.0f);
  return r;
}

TEST(ServingE2E, BurstBeyondTheQueueIsRefusedWithResourceExhaustedAndTheServerRecovers) {
  // A slow engine (default demo head, one thread) and a queue that holds one
  // 8-row request: of a burst of 48 such calls, the third to arrive while one
  // launch computes is refused, so refusals need only three calls to overlap
  // one launch (tens of milliseconds), not a fast client.
  ServerProcess server({"--backend=cpu", "--threads=1", "--max_request_rows=8", "--max_batch_rows=8",
                        "--max_queue_rows=8", "--max_queue_delay_us=0",
                        "--metrics_address=127.0.0.1:0"});
  ASSERT_TRUE(server.Start().ok());
  auto client = std::make_unique<SamplerClient>(server.address());
  const v1::SampleRequest request = DemoRequest(8, 1024, 3);
  constexpr int kBurst = 48;
  std::vector<absl::StatusOr<v1::SampleResponse>> answers(kBurst, absl::UnknownError(""));
  absl::Notification go;
  std::vector<std::thread> callers;
  for (int i = 0; i < kBurst; ++i) {
    callers.emplace_back([&, i] {
      go.WaitForNotification();
      answers[i] = client->Sample(request, absl::Seconds(120));
    });
  }
  go.Notify();
  for (std::thread& t : callers) t.join();
  int ok = 0, refused = 0;
  for (const auto& a : answers) {
    if (a.ok()) {
      ++ok;
      EXPECT_EQ(a->token_ids_size(), 8);
    } else {
      EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted) << a.status();
      refused += a.status().code() == absl::StatusCode::kResourceExhausted;
    }
  }
  EXPECT_GT(refused, 0) << "the burst never filled the queue";
  EXPECT_GT(ok, 0);
  // Recovered: calls one at a time are all served.
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::SampleResponse> r = client->Sample(request);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  const std::string metrics = Scrape(server);
  EXPECT_EQ(SeriesValue(metrics, "flashsampler_requests_total{code=\"RESOURCE_EXHAUSTED\",method=\"Sample\"}"),
            refused);
  EXPECT_EQ(SeriesValue(metrics, "flashsampler_requests_total{code=\"OK\",method=\"Sample\"}"), ok + 3);
  EXPECT_EQ(SeriesValue(metrics, "flashsampler_rows_total{method=\"Sample\"}"), 8 * (ok + 3));
  EXPECT_EQ(SeriesValue(metrics, "flashsampler_queue_rows"), 0);
  EXPECT_EQ(SeriesValue(metrics, "flashsampler_inflight_requests"), 0);
  // No launch is larger than --max_batch_rows.
  EXPECT_EQ(SeriesValue(metrics, "flashsampler_batch_rows_bucket{le=\"8\"}"),
            SeriesValue(metrics, "flashsampler_batch_rows_count"));
  client.reset();  // an idle connection would hold gRPC's shutdown for seconds
  absl::StatusOr<int> exit_code = server.Stop(SIGTERM, absl::Seconds(60));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
}

TEST(ServingE2E, ARequestWhoseDeadlinePassesInTheQueueIsNeverComputed) {
  // The request (deadline 1 s) is queued behind two blockers of 512 rows on
  // the default demo head, launched one row at a time on one thread: every
  // launch streams the whole fp32 head (128 MiB), so the >= 512 rows ahead of
  // it take seconds on any CPU. The deadline is generous for the request to
  // reach the server (it must, to be counted there), and far shorter than
  // the queue ahead.
  ServerProcess server({"--backend=cpu", "--threads=1", "--max_request_rows=512", "--max_batch_rows=1",
                        "--max_queue_delay_us=0", "--metrics_address=127.0.0.1:0"});
  ASSERT_TRUE(server.Start().ok());
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Sampler::NewStub(channel);
  const v1::SampleRequest blocker = DemoRequest(512, 1024, 5);
  constexpr int kBlockers = 2;
  struct Blocker {
    grpc::ClientContext context;
    v1::SampleResponse response;
    grpc::Status status;
    absl::Notification done;
  };
  std::vector<std::unique_ptr<Blocker>> blockers;
  for (int i = 0; i < kBlockers; ++i) {
    blockers.push_back(std::make_unique<Blocker>());
    Blocker* b = blockers.back().get();
    stub->async()->Sample(&b->context, &blocker, &b->response, [b](grpc::Status status) {
      b->status = std::move(status);
      b->done.Notify();
    });
  }
  // Both blockers admitted: neither is done (the first alone takes 512
  // launches), so at least 512 rows are queued ahead of what comes next.
  absl::Status admitted = testing::WaitForMetrics(server.metrics_address(), [&](const std::string& m) {
    return SeriesValue(m, "flashsampler_inflight_requests") == kBlockers;
  });
  EXPECT_TRUE(admitted.ok()) << admitted;
  if (admitted.ok()) {
    SamplerClient client(server.address());
    absl::StatusOr<v1::SampleResponse> late = client.Sample(DemoRequest(1, 1024, 6), absl::Seconds(1));
    EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
    // The server answers it DEADLINE_EXCEEDED when it sweeps the queue before
    // a launch: only a request dropped unlaunched is answered so (one that ran
    // is answered OK, whether or not its caller still waits).
    const absl::Status expired = testing::WaitForMetrics(server.metrics_address(), [](const std::string& m) {
      return SeriesValue(m, "flashsampler_requests_total{code=\"DEADLINE_EXCEEDED\",method=\"Sample\"}") == 1;
    });
    EXPECT_TRUE(expired.ok()) << expired;
  }
  // The blockers need not finish: cancelled, their queued rows are dropped too.
  for (auto& b : blockers) b->context.TryCancel();
  for (auto& b : blockers) {
    b->done.WaitForNotification();
    EXPECT_TRUE(b->status.ok() || b->status.error_code() == grpc::StatusCode::CANCELLED)
        << b->status.error_message();
  }
  const absl::Status idle = testing::WaitForMetrics(server.metrics_address(), [](const std::string& m) {
    return SeriesValue(m, "flashsampler_inflight_requests") == 0;
  });
  ASSERT_TRUE(idle.ok()) << idle;
  // Every launch was one blocker row, and no request but the late one expired.
  const std::string metrics = Scrape(server);
  EXPECT_EQ(SeriesValue(metrics, "flashsampler_batch_rows_sum"),
            SeriesValue(metrics, "flashsampler_batch_rows_count"));
  EXPECT_LE(SeriesValue(metrics, "flashsampler_batch_rows_sum"), kBlockers * 512);
  EXPECT_EQ(SeriesValue(metrics, "flashsampler_requests_total{code=\"DEADLINE_EXCEEDED\",method=\"Sample\"}"), 1);
  absl::StatusOr<int> exit_code = server.Stop(SIGTERM, absl::Seconds(60));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
}

TEST(ServingE2E, SigtermUnderLoadAnswersEveryCallOrSaysUnavailable) {
  // A lame-duck pause of 5 s: once the calls in flight are answered, each
  // caller's next call must still get the clear UNAVAILABLE (not gRPC's own
  // CANCELLED of a call that lands in Shutdown). 5 s covers a caller that a
  // busy machine schedules late.
  ServerProcess server({"--backend=cpu", "--threads=2", "--demo_vocab=16000", "--demo_hidden=256",
                        "--max_batch_rows=32", "--grace_period_s=120", "--lame_duck_ms=5000"});
  ASSERT_TRUE(server.Start().ok());
  auto client = std::make_unique<SamplerClient>(server.address());
  constexpr int kUnary = 8, kStreams = 4;
  std::atomic<int> answered{0};
  std::atomic<bool> signalled{false};
  std::atomic<int> answered_after_signal{0};
  absl::Mutex mu;
  std::map<absl::StatusCode, int> failures;  // guarded by mu
  std::vector<std::thread> callers;
  auto record_failure = [&](const absl::Status& s, const char* kind) {
    absl::MutexLock lock(&mu);
    ++failures[s.code()];
    if (s.code() != absl::StatusCode::kUnavailable) ADD_FAILURE() << "unclear failure: " << s << " " << kind;
  };
  for (int c = 0; c < kUnary + kStreams; ++c) {
    callers.emplace_back([&, c] {
      const v1::SampleRequest request = DemoRequest(1 + c % 4, 256, static_cast<uint32_t>(c));
      // Each caller goes on until its first failure (the server going away).
      for (;;) {
        if (c < kUnary) {
          absl::StatusOr<v1::SampleResponse> r = client->Sample(request, absl::Seconds(120));
          if (!r.ok()) return record_failure(r.status(), "unary");
          EXPECT_EQ(r->token_ids_size(), 1 + c % 4);
        } else {
          absl::StatusOr<std::vector<v1::SampleResponse>> r =
              client->SampleStream(std::vector<v1::SampleRequest>(5, request), absl::Seconds(120));
          if (!r.ok()) return record_failure(r.status(), "stream");
          EXPECT_EQ(r->size(), 5u);
        }
        answered.fetch_add(1);
        if (signalled.load()) answered_after_signal.fetch_add(1);
      }
    });
  }
  // Under load: the callers have had answers and keep sending. (A poll of the
  // callers' own count, bounded: a caller that fails early stops counting.)
  const absl::Time warm_deadline = absl::Now() + absl::Seconds(120);
  while (answered.load() < 4 * (kUnary + kStreams) && absl::Now() < warm_deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GE(answered.load(), 4 * (kUnary + kStreams)) << "the callers got no answers in 120 s";
  signalled = true;
  server.SendSignal(SIGTERM);
  // The callers stop at their first failure, within the drain. Closing their
  // idle connection then spares the wait gRPC's shutdown gives it.
  for (std::thread& t : callers) t.join();
  client.reset();
  absl::StatusOr<int> exit_code = server.WaitForExit(absl::Seconds(120));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(failures[absl::StatusCode::kUnavailable], kUnary + kStreams);
  // Calls in flight at the signal were answered, not dropped.
  EXPECT_GT(answered_after_signal.load(), 0) << "nothing was in flight at SIGTERM: the drain was not exercised";
}

}  // namespace
}  // namespace flashsampler
