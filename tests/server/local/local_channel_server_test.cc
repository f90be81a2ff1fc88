// LocalChannelServer in one process (no gRPC server: this test also runs
// under TSan): a SamplerService over a DynamicBatcher with the CPU engine,
// the local channel on a temporary socket, LocalSamplerClient and raw
// sockets as clients. Concurrent connections get the answers each request
// gets alone; a client that stops reading holds up its own connection only;
// clients that vanish with a request in flight take nothing down, and one
// that hangs up while its request is queued has it dropped uncomputed; a
// connection thread that spins for its answer (idle_poll) or sleeps gets
// the same answers; the drain and Stop end every connection.
#include "server/local/local_channel_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/local_frame.h"
#include "client/local_sampler_client.h"
#include "client/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/model/lm_head.h"
#include "tests/common/scoped_temp_dir.h"

namespace flashsampler {
namespace {

using ::testing::ElementsAreArray;
using testing::ScopedTempDir;

constexpr int64_t kVocab = 512;
constexpr int64_t kHidden = 64;

v1::SampleRequest Request(int64_t rows, uint64_t seed, int top_logprobs = 0) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  std::vector<float> values(rows * kHidden);
  for (float& x : values) x = normal(gen);
  v1::SampleRequest r;
  *r.mutable_hidden_states() = MakeHiddenStates(values, rows, kHidden, v1::DTYPE_BF16);
  v1::SamplingParams* p = r.add_params();
  p->set_temperature(1.0f);
  p->set_seed(seed);
  p->set_top_logprobs(top_logprobs);
  r.set_return_logz(true);
  return r;
}

int ConnectRaw(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  return fd;
}

std::unique_ptr<Engine> CpuEngine() {
  EngineOptions engine_options;
  engine_options.cpu.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      MakeEngine("cpu", LmHead::Demo(kVocab, kHidden, 5), engine_options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

// The CPU engine, with its first launch held until Release() and the rows of
// every launch recorded.
class HeldCpuEngine final : public Engine {
 public:
  HeldCpuEngine() : cpu_(CpuEngine()) {}
  absl::StatusOr<SampleResult> Sample(const SampleBatch& batch) override {
    bool first;
    {
      absl::MutexLock lock(&mu_);
      launches_.push_back(batch.rows);
      first = launches_.size() == 1;
    }
    if (first) {
      started_.Notify();
      release_.WaitForNotification();
    }
    return cpu_->Sample(batch);
  }
  const ModelShape& shape() const override { return cpu_->shape(); }
  std::string backend_name() const override { return "held cpu"; }
  bool serves_draft_rows(bool with_controls) const override { return cpu_->serves_draft_rows(with_controls); }

  void WaitForFirstLaunch() { started_.WaitForNotification(); }
  void Release() { release_.Notify(); }
  std::vector<int64_t> launches() const {
    absl::MutexLock lock(&mu_);
    return launches_;
  }

 private:
  const std::unique_ptr<Engine> cpu_;
  absl::Notification started_, release_;
  mutable absl::Mutex mu_;
  std::vector<int64_t> launches_ ABSL_GUARDED_BY(mu_);
};

class LocalChannelServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartWith(CpuEngine()); }

  void StartWith(std::unique_ptr<Engine> engine, absl::Duration idle_poll = absl::ZeroDuration()) {
    BatcherOptions options;
    options.max_batch_rows = 256;
    batcher_ = std::make_unique<DynamicBatcher>(options);
    ASSERT_NE(engine, nullptr);
    batcher_->SetEngine(std::move(engine));
    service_ = std::make_unique<SamplerService>(batcher_.get(), RequestLimits{1024}, nullptr);
    LocalChannelOptions local;
    local.path = dir_.Path("s.sock");
    local.max_connections = 16;
    local.idle_poll = idle_poll;
    absl::StatusOr<std::unique_ptr<LocalChannelServer>> started =
        LocalChannelServer::Start(local, service_.get());
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
  }
  void TearDown() override { Shutdown(); }

  // The server's own order: drain, let the batcher finish, stop.
  void Shutdown() {
    if (server_ == nullptr) return;
    service_->BeginDrain();
    server_->BeginDrain();
    batcher_->Stop();
    server_->Stop();
    server_.reset();
  }

  std::unique_ptr<LocalSamplerClient> Connect() {
    absl::StatusOr<std::unique_ptr<LocalSamplerClient>> c = LocalSamplerClient::Connect(dir_.Path("s.sock"));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // Each of `requests` answered alone on `first`; then `connections`
  // clients at once, each sending `per_connection` of them in its own order
  // (the batcher joins their rows into shared launches): every answer must
  // be the one the request got alone.
  void ExpectEveryAnswerAsAlone(LocalSamplerClient* first,
                                const std::vector<v1::SampleRequest>& requests, int connections,
                                int per_connection) {
    std::vector<v1::SampleResponse> alone;
    for (const v1::SampleRequest& request : requests) {
      absl::StatusOr<v1::SampleResponse> r = first->Sample(request);
      ASSERT_TRUE(r.ok()) << r.status();
      alone.push_back(*r);
    }
    std::vector<std::thread> threads;
    std::atomic<int> mismatches{0}, failures{0};
    const int n = static_cast<int>(requests.size());
    for (int t = 0; t < connections; ++t) {
      threads.emplace_back([&, t] {
        std::unique_ptr<LocalSamplerClient> c = Connect();
        if (c == nullptr) {
          ++failures;
          return;
        }
        for (int k = 0; k < per_connection; ++k) {
          const int i = (k * 7 + t * 3) % n;
          absl::StatusOr<v1::SampleResponse> r = c->Sample(requests[i]);
          if (!r.ok()) {
            ++failures;
          } else if (r->SerializeAsString() != alone[i].SerializeAsString()) {
            ++mismatches;
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(mismatches.load(), 0);
  }

  ScopedTempDir dir_{"local_channel_server"};
  std::unique_ptr<DynamicBatcher> batcher_;
  std::unique_ptr<SamplerService> service_;
  std::unique_ptr<LocalChannelServer> server_;
};

TEST_F(LocalChannelServerTest, ConcurrentConnectionsGetTheAnswersOfEachRequestAlone) {
  std::vector<v1::SampleRequest> requests;
  for (int i = 0; i < 12; ++i) requests.push_back(Request(1 + i % 5, 100 + i));
  std::unique_ptr<LocalSamplerClient> first = Connect();
  ASSERT_NE(first, nullptr);
  // Eight connections at once, in various orders: every answer is still
  // the request's own.
  ExpectEveryAnswerAsAlone(first.get(), requests, /*connections=*/8, /*per_connection=*/40);
}

TEST_F(LocalChannelServerTest, AClientThatStopsReadingHoldsUpOnlyItsOwnConnection) {
  // A connection sends requests with large answers (top logprobs of 64
  // rows) and never reads: its answers fill the socket, and its thread waits
  // to send the rest, while the batcher's threads go on.
  const int stalled = ConnectRaw(dir_.Path("s.sock"));
  std::string frame;
  local::FrameHeader h;
  ASSERT_TRUE(Request(64, 7, /*top_logprobs=*/20).SerializeToString(&frame));
  std::string stream;
  for (int i = 0; i < 200; ++i) {
    h.call_id = i + 1;
    local::AppendFrame(h, frame, &stream);
  }
  std::thread writer([&] {
    size_t sent = 0;
    // Blocks once the server stops reading; ends when the socket is shut down.
    (void)local::SendBytes(stalled, stream, &sent, /*block=*/true);
  });
  // Meanwhile another connection is served, request after request.
  std::unique_ptr<LocalSamplerClient> other = Connect();
  ASSERT_NE(other, nullptr);
  for (int i = 0; i < 50; ++i) {
    absl::StatusOr<v1::SampleResponse> r = other->Sample(Request(2, 300 + i));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->token_ids_size(), 2);
  }
  shutdown(stalled, SHUT_RDWR);
  writer.join();
  close(stalled);
  // The stalled connection's thread is freed by the close; the server goes on.
  absl::StatusOr<v1::SampleResponse> after = other->Sample(Request(1, 9));
  EXPECT_TRUE(after.ok()) << after.status();
}

TEST_F(LocalChannelServerTest, ClientsThatVanishMidRequestTakeNothingDown) {
  for (int i = 0; i < 20; ++i) {
    const int fd = ConnectRaw(dir_.Path("s.sock"));
    std::string payload;
    ASSERT_TRUE(Request(128, 40 + i).SerializeToString(&payload));
    local::FrameHeader h;
    h.call_id = 1;
    // More connections than the limit: a refused one cannot even be written to.
    (void)local::WriteFrame(fd, h, payload);
    close(fd);  // before the answer
  }
  // The server frees a vanished client's connection once its request is
  // answered: until then a new one may be refused for the limit.
  absl::StatusOr<v1::SampleResponse> r;
  for (int attempt = 0; attempt < 10000; ++attempt) {
    std::unique_ptr<LocalSamplerClient> c = Connect();
    ASSERT_NE(c, nullptr);
    r = c->Sample(Request(3, 1));
    if (r.status().code() != absl::StatusCode::kResourceExhausted) break;
  }
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->token_ids_size(), 3);
}

class LocalChannelCancellationTest : public LocalChannelServerTest {
 protected:
  void SetUp() override {
    auto engine = std::make_unique<HeldCpuEngine>();
    engine_ = engine.get();
    StartWith(std::move(engine));
  }
  HeldCpuEngine* engine_ = nullptr;
};

// A queued request whose client has hung up is dropped before its launch
// (CANCELLED, never computed), as a gRPC call whose client went away; a
// client that is still there, or only stopped writing, keeps its request.
TEST_F(LocalChannelCancellationTest, AQueuedRequestOfAClientThatHungUpIsNeverComputed) {
  std::unique_ptr<LocalSamplerClient> first = Connect();
  ASSERT_NE(first, nullptr);
  absl::StatusOr<v1::SampleResponse> first_answer;
  std::thread first_call([&] { first_answer = first->Sample(Request(2, 1)); });
  engine_->WaitForFirstLaunch();  // the first request holds the engine

  std::string payload;
  ASSERT_TRUE(Request(5, 2).SerializeToString(&payload));
  local::FrameHeader h;
  h.call_id = 7;
  const int gone = ConnectRaw(dir_.Path("s.sock"));
  ASSERT_TRUE(local::WriteFrame(gone, h, payload).ok());
  ASSERT_TRUE(Request(3, 3).SerializeToString(&payload));
  const int half_closed = ConnectRaw(dir_.Path("s.sock"));
  ASSERT_TRUE(local::WriteFrame(half_closed, h, payload).ok());
  // Both are queued once the batcher holds their rows.
  while (batcher_->queued_rows() < 5 + 3) std::this_thread::yield();
  close(gone);                       // hung up: its request must not run
  shutdown(half_closed, SHUT_WR);    // still reading: its request runs
  engine_->Release();
  first_call.join();
  ASSERT_TRUE(first_answer.ok()) << first_answer.status();
  // The half-closed client gets its answer.
  std::string body;
  absl::StatusOr<local::FrameHeader> answer = local::ReadFrame(half_closed, 1 << 20, &body);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->kind, local::FrameKind::kSampleResponse);
  close(half_closed);
  batcher_->Stop();  // whatever was queued has been run or dropped
  EXPECT_THAT(engine_->launches(), ElementsAreArray({2, 3})) << "the hung-up client's 5 rows were computed";
}

// With idle_poll set, a connection's thread spins for its answer instead of
// sleeping (WaitForAnswer), up to idle_poll, then sleeps. Either way every
// client gets its own answers, also with a launch held far past a short
// spin, and the drain and Stop still end every connection.
class LocalChannelSpinTest : public LocalChannelServerTest,
                             public ::testing::WithParamInterface<absl::Duration> {
 protected:
  void SetUp() override {
    auto engine = std::make_unique<HeldCpuEngine>();
    engine_ = engine.get();
    StartWith(std::move(engine), GetParam());
  }
  HeldCpuEngine* engine_ = nullptr;
};

TEST_P(LocalChannelSpinTest, EveryConnectionGetsItsOwnAnswersWhetherItsThreadSpinsOrSleeps) {
  // The first request's launch is held until the test has seen it start,
  // so its connection's thread waits for it, spinning or asleep.
  std::unique_ptr<LocalSamplerClient> first = Connect();
  ASSERT_NE(first, nullptr);
  const v1::SampleRequest held = Request(2, 1);
  absl::StatusOr<v1::SampleResponse> held_answer;
  std::thread held_call([&] { held_answer = first->Sample(held); });
  engine_->WaitForFirstLaunch();
  engine_->Release();
  held_call.join();
  ASSERT_TRUE(held_answer.ok()) << held_answer.status();
  EXPECT_EQ(held_answer->token_ids_size(), 2);

  std::vector<v1::SampleRequest> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(Request(1 + i % 3, 500 + i));
  // Four connections at once: one spins for its answers, the others sleep.
  ExpectEveryAnswerAsAlone(first.get(), requests, /*connections=*/4, /*per_connection=*/30);
  // The same request again on the first connection: the same answer.
  absl::StatusOr<v1::SampleResponse> again = first->Sample(held);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), held_answer->SerializeAsString());
  Shutdown();
}

// A nanosecond: the thread sleeps on the condition variable unless the
// answer is already there. A minute: the spinning thread sees every answer
// (the other connections' threads sleep). Which path each wait takes is
// not asserted (it is timing); the answers and the shutdown are.
INSTANTIATE_TEST_SUITE_P(IdlePoll, LocalChannelSpinTest,
                         ::testing::Values(absl::Nanoseconds(1), absl::Minutes(1)));

TEST_F(LocalChannelServerTest, TheDrainEndsIdleConnectionsWithAGoodbyeAndStopJoinsEverything) {
  std::vector<std::unique_ptr<LocalSamplerClient>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(Connect());
    ASSERT_NE(clients.back(), nullptr);
    ASSERT_TRUE(clients.back()->Sample(Request(1, 60 + i)).ok());
  }
  service_->BeginDrain();
  server_->BeginDrain();
  for (auto& c : clients) {
    absl::StatusOr<v1::SampleResponse> r = c->Sample(Request(1, 70));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  }
  // New connections are refused: nobody listens any more.
  EXPECT_FALSE(LocalSamplerClient::Connect(dir_.Path("s.sock")).ok());
  Shutdown();
}

// A server started on the path while the old one drains (its listener is
// shut, so the file looks stale) keeps its socket file when the old one stops.
TEST_F(LocalChannelServerTest, StoppingLeavesTheSocketFileOfANewerServerOnThePath) {
  service_->BeginDrain();
  server_->BeginDrain();
  DynamicBatcher batcher(BatcherOptions{});
  batcher.SetEngine(CpuEngine());
  SamplerService service(&batcher, RequestLimits{1024}, nullptr);
  LocalChannelOptions options;
  options.path = dir_.Path("s.sock");
  absl::StatusOr<std::unique_ptr<LocalChannelServer>> newer = LocalChannelServer::Start(options, &service);
  ASSERT_TRUE(newer.ok()) << newer.status();
  Shutdown();  // the old server stops
  std::unique_ptr<LocalSamplerClient> client = Connect();
  ASSERT_NE(client, nullptr) << "the newer server's socket file is gone";
  EXPECT_TRUE(client->Sample(Request(1, 80)).ok());
  client.reset();
  service.BeginDrain();
  (*newer)->BeginDrain();
  batcher.Stop();
  (*newer)->Stop();
  struct stat st {};
  EXPECT_NE(lstat(options.path.c_str(), &st), 0) << "a server removes its own socket file";
}

}  // namespace
}  // namespace flashsampler
