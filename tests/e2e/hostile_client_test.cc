// Hostile clients against the real flashsampler-server binary (CPU backend,
// small demo head): random bytes on the gRPC port, a message just over the
// size limit, 10k tiny requests on one stream, streams that are never read,
// clients that vanish mid-request, shape claims whose byte count overflows.
// After each case the server must still be running, answer health SERVING,
// sample correctly, and its resident memory must not have grown by more than
// kMaxRssGrowthKb (a generous bound: a leak of a few hundred bytes per request
// of the 10k case would still be far below it, but a per-connection or
// per-stream buffer that is never freed would not).
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/raw_connection.h"
#include "tests/e2e/server_process.h"

namespace flashsampler {
namespace {

using ::testing::AnyOf;
using ::testing::Eq;
using ::testing::HasSubstr;
using testing::RawConnection;
using testing::ServerProcess;

constexpr int64_t kVocab = 2000;
constexpr int64_t kHidden = 64;
constexpr int64_t kMaxRows = 64;
// The server's receive limit, as main.cc computes it from --max_request_rows
// and the model: per row its fp32 hidden state, a params entry and room for
// its sampling controls (a ceil(V/32)-word bitmask and 64 KiB of token lists),
// plus 1 MiB for everything else.
constexpr int64_t kMaxMessageBytes =
    kMaxRows * (kHidden * 4 + 32 + (kVocab + 31) / 32 * 4 + (64 << 10)) + (1 << 20);
constexpr int64_t kMaxRssGrowthKb = 100 * 1024;
constexpr char kSamplePath[] = "/flashsampler.v1.Sampler/Sample";
constexpr char kStreamPath[] = "/flashsampler.v1.Sampler/SampleStream";

v1::SampleRequest Request(int64_t rows, uint64_t seed) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<size_t>(rows * kHidden));
  for (float& x : values) x = normal(gen);
  v1::SampleRequest r;
  *r.mutable_hidden_states() = MakeHiddenStates(values, rows, kHidden, v1::DTYPE_FP32);
  v1::SamplingParams* p = r.add_params();
  p->set_temperature(1.0f);
  p->set_seed(seed);
  return r;
}

// VmRSS of `pid` in kB, or -1.
int64_t ResidentKb(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

class HostileClients : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--backend=cpu", absl::StrCat("--demo_vocab=", kVocab),
                                 absl::StrCat("--demo_hidden=", kHidden),
                                 absl::StrCat("--max_request_rows=", kMaxRows),
                                 absl::StrCat("--max_batch_rows=", kMaxRows), "--threads=2",
                                 "--tile_rows=256"});
    const absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
    client_ = new SamplerClient(server_->address());
    // Warm-up, so allocator pools and gRPC's per-thread state exist before
    // the first memory reading.
    for (int i = 0; i < 50; ++i) ASSERT_TRUE(client_->Sample(Request(1 + i % kMaxRows, i)).ok());
  }
  static void TearDownTestSuite() {
    delete client_;
    absl::StatusOr<int> exit_code = server_->Stop(SIGTERM, absl::Seconds(60));
    EXPECT_TRUE(exit_code.ok()) << exit_code.status();
    if (exit_code.ok()) {
      EXPECT_EQ(*exit_code, 0);
    }
    delete server_;
  }

  void SetUp() override {
    ASSERT_TRUE(server_->running());
    rss_before_kb_ = ResidentKb(server_->pid());
    ASSERT_GT(rss_before_kb_, 0);
  }

  // The server is up, healthy, samples a known request reproducibly, and
  // kept its memory.
  void TearDown() override {
    ASSERT_TRUE(server_->running()) << "the server died";
    SamplerClient fresh(server_->address());
    auto health = fresh.CheckHealth();
    ASSERT_TRUE(health.ok()) << health.status();
    EXPECT_EQ(*health, grpc::health::v1::HealthCheckResponse::SERVING);
    auto a = fresh.Sample(Request(4, 99));
    auto b = fresh.Sample(Request(4, 99));
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(std::vector<int32_t>(a->token_ids().begin(), a->token_ids().end()),
              std::vector<int32_t>(b->token_ids().begin(), b->token_ids().end()));
    const int64_t after_kb = ResidentKb(server_->pid());
    RecordProperty("vmrss_before_kb", static_cast<int>(rss_before_kb_));
    RecordProperty("vmrss_after_kb", static_cast<int>(after_kb));
    EXPECT_LT(after_kb - rss_before_kb_, kMaxRssGrowthKb)
        << "VmRSS grew from " << rss_before_kb_ << " kB to " << after_kb << " kB";
  }

  static ServerProcess* server_;
  static SamplerClient* client_;
  int64_t rss_before_kb_ = 0;
};

ServerProcess* HostileClients::server_ = nullptr;
SamplerClient* HostileClients::client_ = nullptr;

TEST_F(HostileClients, RandomBytesOnTheGrpcPort) {
  std::mt19937_64 gen(10);
  auto random_bytes = [&gen](size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(gen());
    return s;
  };
  // Not HTTP/2 at all: the server must hang up.
  for (int i = 0; i < 20; ++i) {
    RawConnection c;
    ASSERT_TRUE(c.Connect(server_->address()));
    c.Send(random_bytes(1 + gen() % 65536));
    EXPECT_TRUE(c.DrainUntilClosed(absl::Seconds(30))) << "connection " << i << " left open";
  }
  {
    RawConnection c;
    ASSERT_TRUE(c.Connect(server_->address()));
    c.Send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_TRUE(c.DrainUntilClosed(absl::Seconds(30)));
  }
  // A valid preface followed by random frames, and random frames inside an
  // open call: protocol errors, handled per connection.
  for (int i = 0; i < 20; ++i) {
    RawConnection c;
    ASSERT_TRUE(c.Connect(server_->address()));
    std::string bytes = testing::Http2ClientPreface();
    if (i % 2 == 1) bytes += testing::GrpcCallHeaders(1, kSamplePath);
    bytes += random_bytes(1 + gen() % 4096);
    c.Send(bytes);
    c.DrainUntilClosed(absl::Milliseconds(300));
  }
  // A syntactically valid gRPC message of random bytes: whatever it parses
  // to, the answer is a status, never a crash.
  for (int i = 0; i < 20; ++i) {
    RawConnection c;
    ASSERT_TRUE(c.Connect(server_->address()));
    const std::string body = random_bytes(1 + gen() % 2048);
    c.Send(testing::Http2ClientPreface() + testing::GrpcCallHeaders(1, kSamplePath) +
           testing::Http2Frame(testing::kHttp2Data, testing::kHttp2FlagEndStream, 1,
                               testing::GrpcMessagePrefix(static_cast<uint32_t>(body.size())) + body));
    c.DrainUntilClosed(absl::Milliseconds(300));
  }
}

// A request of exactly `size` serialized bytes (its data length is adjusted;
// the shape stays [1, D], so the parser would reject it).
v1::SampleRequest RequestOfSize(int64_t size) {
  v1::SampleRequest r = Request(1, 1);
  std::string* data = r.mutable_hidden_states()->mutable_data();
  for (int i = 0; i < 8 && static_cast<int64_t>(r.ByteSizeLong()) != size; ++i) {
    const int64_t overhead = static_cast<int64_t>(r.ByteSizeLong()) - static_cast<int64_t>(data->size());
    data->resize(static_cast<size_t>(size - overhead), 'x');
  }
  return r;
}

TEST_F(HostileClients, MessageJustOverTheSizeLimitIsResourceExhausted) {
  const v1::SampleRequest over = RequestOfSize(kMaxMessageBytes + 1);
  ASSERT_EQ(static_cast<int64_t>(over.ByteSizeLong()), kMaxMessageBytes + 1);
  auto r = client_->Sample(over);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();

  // At the limit the transport takes it and validation rejects the shape:
  // the boundary is where main.cc says it is.
  const v1::SampleRequest at = RequestOfSize(kMaxMessageBytes);
  ASSERT_EQ(static_cast<int64_t>(at.ByteSizeLong()), kMaxMessageBytes);
  r = client_->Sample(at);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();

  // The same on a stream: the oversized message ends that stream only.
  auto s = client_->SampleStream({Request(1, 2), over, Request(1, 3)});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted) << s.status();
}

TEST_F(HostileClients, TenThousandTinyRequestsOnOneStream) {
  constexpr int kRequests = 10000;
  std::vector<v1::SampleRequest> requests;
  requests.reserve(kRequests);
  for (int i = 0; i < kRequests; ++i) requests.push_back(Request(1, 1000 + i % 100));
  auto responses = client_->SampleStream(requests, absl::Minutes(10));
  ASSERT_TRUE(responses.ok()) << responses.status();
  ASSERT_EQ(responses->size(), static_cast<size_t>(kRequests));
  // Same request, same seed: same token, on every lap of the 100 requests.
  for (int i = 100; i < kRequests; ++i) {
    ASSERT_EQ((*responses)[i].token_ids_size(), 1);
    ASSERT_EQ((*responses)[i].token_ids(0), (*responses)[i % 100].token_ids(0)) << "request " << i;
  }
}

TEST_F(HostileClients, StreamsThatAreNeverReadDoNotBlockOthers) {
  constexpr int kStreams = 8;
  constexpr int kWritesPerStream = 100;
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Sampler::NewStub(channel);
  struct Hog {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::SampleRequest, v1::SampleResponse>> stream;
    std::thread writer;
  };
  std::vector<std::unique_ptr<Hog>> hogs;
  absl::Mutex writes_mu;
  int writes ABSL_GUARDED_BY(writes_mu) = 0;
  for (int i = 0; i < kStreams; ++i) {
    auto hog = std::make_unique<Hog>();
    hog->stream = stub->SampleStream(&hog->context);
    // Half write requests and never read the answers; half open the stream
    // and send nothing.
    if (i % 2 == 0) {
      Hog* h = hog.get();
      hog->writer = std::thread([h, i, &writes, &writes_mu] {
        v1::SampleRequest r = Request(16, i);
        r.set_return_logz(true);
        r.set_return_logprobs(true);
        for (int w = 0; w < kWritesPerStream && h->stream->Write(r); ++w) {
          absl::MutexLock lock(&writes_mu);
          ++writes;
        }
      });
    }
    hogs.push_back(std::move(hog));
  }
  // The writing hogs are at it before the others are served (their threads
  // may start late on a busy machine; a first write is on the wire).
  {
    absl::MutexLock lock(&writes_mu);
    auto hogs_writing = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(writes_mu) { return writes >= kStreams / 2; };
    EXPECT_TRUE(writes_mu.AwaitWithTimeout(absl::Condition(&hogs_writing), absl::Seconds(60)))
        << "the hogs wrote " << writes << " requests in 60 s";
  }
  // While they hang, other clients are served (each hog has at most one
  // request in the executor at a time).
  for (int i = 0; i < 20; ++i) {
    auto r = client_->Sample(Request(2, i), absl::Seconds(60));
    ASSERT_TRUE(r.ok()) << r.status();
  }
  auto info = client_->GetModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  // The clients go away without reading or half-closing.
  for (auto& hog : hogs) hog->context.TryCancel();
  for (auto& hog : hogs) {
    if (hog->writer.joinable()) hog->writer.join();
    EXPECT_THAT(hog->stream->Finish().error_code(), Eq(grpc::StatusCode::CANCELLED));
  }
}

TEST_F(HostileClients, ClientsThatDisconnectMidRequest) {
  // Raw HTTP/2: a call whose message prefix promises 1 MB, of which part is
  // sent before the connection is closed, reset, or left after the headers.
  for (int i = 0; i < 60; ++i) {
    RawConnection c;
    ASSERT_TRUE(c.Connect(server_->address()));
    std::string bytes = testing::Http2ClientPreface() +
                        testing::GrpcCallHeaders(1, i % 3 == 2 ? kStreamPath : kSamplePath);
    if (i % 4 != 3) {
      bytes += testing::Http2Frame(testing::kHttp2Data, 0, 1,
                                   testing::GrpcMessagePrefix(1 << 20) + std::string(4096, 'h'));
    }
    if (i % 5 == 4) {
      bytes += testing::Http2Frame(testing::kHttp2RstStream, 0, 1, std::string("\0\0\0\x8", 4));
    }
    ASSERT_TRUE(c.Send(bytes));
    c.Close();
  }
  // gRPC clients that cancel right after sending a full request, while it is
  // queued or being sampled.
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Sampler::NewStub(channel);
  const v1::SampleRequest big = Request(kMaxRows, 5);
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::microseconds(100 * (i % 20)));
    v1::SampleResponse response;
    const grpc::Status status = stub->Sample(&context, big, &response);
    EXPECT_THAT(status.error_code(), AnyOf(Eq(grpc::StatusCode::OK), Eq(grpc::StatusCode::DEADLINE_EXCEEDED),
                                           Eq(grpc::StatusCode::CANCELLED)))
        << status.error_message();
  }
  // A stream cancelled with a request in flight.
  for (int i = 0; i < 20; ++i) {
    grpc::ClientContext context;
    auto stream = stub->SampleStream(&context);
    ASSERT_TRUE(stream->Write(big));
    context.TryCancel();
    stream->Finish();
  }
}

TEST_F(HostileClients, ShapeClaimsThatOverflowAreInvalidArgument) {
  struct Claim {
    std::vector<int64_t> shape;
    int64_t data_bytes;
  };
  const int64_t two63_minus_1 = std::numeric_limits<int64_t>::max();
  const std::vector<Claim> claims = {
      // B * D * 4 wraps to exactly the bytes sent (2^56 + 1 rows of D = 64 fp32).
      {{(int64_t{1} << 56) + 1, kHidden}, kHidden * 4},
      {{int64_t{1} << 61, kHidden}, kHidden * 4},
      {{two63_minus_1, kHidden}, 0},
      {{1, two63_minus_1}, kHidden * 4},
      {{-(int64_t{1} << 62), kHidden}, 0},
      {{int64_t{1} << 32, int64_t{1} << 32}, 0},
      {{int64_t{1} << 20, int64_t{1} << 20, kHidden}, kHidden * 4},
  };
  for (const Claim& claim : claims) {
    v1::SampleRequest r = Request(1, 1);
    v1::Tensor* t = r.mutable_hidden_states();
    t->clear_shape();
    for (int64_t d : claim.shape) t->add_shape(d);
    t->mutable_data()->resize(static_cast<size_t>(claim.data_bytes));
    auto response = client_->Sample(r);
    ASSERT_FALSE(response.ok()) << "accepted shape claim " << ::testing::PrintToString(claim.shape);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << response.status();
    // On a stream too: the error ends the stream.
    auto s = client_->SampleStream({r});
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  }
  // Half precision: B * D * 2 wrapping to the bytes sent.
  v1::SampleRequest half = Request(1, 1);
  *half.mutable_hidden_states() = MakeHiddenStates(std::vector<float>(kHidden, 0.5f), 1, kHidden, v1::DTYPE_BF16);
  half.mutable_hidden_states()->set_shape(0, (int64_t{1} << 57) + 1);
  auto r = client_->Sample(half);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("limit"));
}

}  // namespace
}  // namespace flashsampler
