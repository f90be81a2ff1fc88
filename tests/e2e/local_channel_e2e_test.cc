// End to end: the local channel (--local_socket, server/local/) against the
// real server on the CPU backend. Its answers are those of the gRPC path,
// with the hidden states in the frame or in a registered shared-memory
// region; a request's error leaves the connection open; a frame that cannot
// be read ends it with a reason; the connection limit, the socket's mode,
// a stale socket file, a second server on the same path and the drain.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/local_frame.h"
#include "client/local_sampler_client.h"
#include "client/sampler_client.h"
#include "client/shared_memory_buffer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/http_get.h"
#include "tests/common/metrics_text.h"
#include "tests/common/scoped_temp_dir.h"
#include "tests/e2e/server_process.h"

namespace flashsampler {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing::ScopedTempDir;
using testing::ServerProcess;

constexpr int64_t kHidden = 64;

v1::SampleRequest BytesRequest(int64_t rows, uint64_t data_seed) {
  std::mt19937 gen(static_cast<uint32_t>(data_seed));
  std::normal_distribution<float> normal;
  std::vector<float> values(rows * kHidden);
  for (float& x : values) x = normal(gen);
  v1::SampleRequest r;
  *r.mutable_hidden_states() = MakeHiddenStates(values, rows, kHidden, v1::DTYPE_BF16);
  v1::SamplingParams* p = r.add_params();
  p->set_temperature(0.8f);
  p->set_seed(77 + data_seed);
  p->set_offset(2);
  r.set_return_logz(true);
  r.set_return_logprobs(true);
  r.set_request_id(absl::StrCat("req-", data_seed));
  return r;
}

void ExpectSameAnswer(const v1::SampleResponse& got, const v1::SampleResponse& want) {
  EXPECT_THAT(got.token_ids(), ElementsAreArray(want.token_ids()));
  EXPECT_THAT(got.logz(), ElementsAreArray(want.logz()));
  EXPECT_THAT(got.logprobs(), ElementsAreArray(want.logprobs()));
  EXPECT_THAT(got.seeds(), ElementsAreArray(want.seeds()));
  EXPECT_EQ(got.request_id(), want.request_id());
}

// A raw connection to the socket, for frames no client would send.
int ConnectRaw(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The next frame on `fd`, which must be a Status frame with call id `call_id`.
void ExpectStatusFrame(int fd, uint64_t call_id, absl::StatusCode code, const std::string& fragment) {
  std::string payload;
  absl::StatusOr<local::FrameHeader> h = local::ReadFrame(fd, 1 << 20, &payload);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->kind, local::FrameKind::kStatus);
  EXPECT_EQ(h->call_id, call_id);
  EXPECT_EQ(h->arg, static_cast<uint32_t>(code)) << payload;
  EXPECT_THAT(payload, HasSubstr(fragment));
}

void ExpectEndOfStream(int fd) {
  std::string payload;
  EXPECT_EQ(local::ReadFrame(fd, 1 << 20, &payload).status().code(), absl::StatusCode::kOutOfRange);
}

class LocalChannelE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir("local_channel");
    socket_ = dir_->Path("fs.sock");
    server_ = new ServerProcess({"--backend=cpu", "--demo_vocab=3000", "--demo_hidden=64",
                                 "--max_request_rows=256", "--threads=2", "--max_regions=4",
                                 "--metrics_address=127.0.0.1:0", "--local_socket=" + socket_,
                                 "--max_local_connections=3"});
    const absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
    grpc_ = new SamplerClient(server_->address());
  }
  static void TearDownTestSuite() {
    delete grpc_;
    absl::StatusOr<int> exit_code = server_->Stop(SIGTERM, absl::Seconds(30));
    EXPECT_TRUE(exit_code.ok()) << exit_code.status();
    if (exit_code.ok()) {
      EXPECT_EQ(*exit_code, 0);
    }
    // The server removes its socket file on the way out.
    struct stat st;
    EXPECT_NE(lstat(socket_.c_str(), &st), 0);
    delete server_;
    delete dir_;
  }

  static std::unique_ptr<LocalSamplerClient> Connect() {
    absl::StatusOr<std::unique_ptr<LocalSamplerClient>> c = LocalSamplerClient::Connect(socket_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // Samples `request` on a new connection, kept in *client when given. The
  // server counts a closed connection (of an earlier case or test) until its
  // thread has seen the close (--max_local_connections=3): a connection it
  // refuses for the limit (RESOURCE_EXHAUSTED) is opened again until it has
  // let those go. Any other outcome is returned.
  static absl::StatusOr<v1::SampleResponse> SampleOnANewConnection(
      const v1::SampleRequest& request, std::unique_ptr<LocalSamplerClient>* client = nullptr) {
    absl::StatusOr<v1::SampleResponse> r = absl::UnknownError("not sent");
    for (int attempt = 0; attempt < 10000; ++attempt) {
      std::unique_ptr<LocalSamplerClient> c = Connect();
      if (c == nullptr) return absl::UnavailableError("cannot connect");
      r = c->Sample(request);
      if (client != nullptr) *client = std::move(c);
      if (r.status().code() != absl::StatusCode::kResourceExhausted) break;
    }
    return r;
  }

  static ScopedTempDir* dir_;
  static std::string socket_;
  static ServerProcess* server_;
  static SamplerClient* grpc_;
};

ScopedTempDir* LocalChannelE2E::dir_ = nullptr;
std::string LocalChannelE2E::socket_;
ServerProcess* LocalChannelE2E::server_ = nullptr;
SamplerClient* LocalChannelE2E::grpc_ = nullptr;

TEST_F(LocalChannelE2E, TheSocketIsTheServerUsersAlone) {
  struct stat st;
  ASSERT_EQ(lstat(socket_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(LocalChannelE2E, AnswersAreThoseOfTheGrpcPathAndCounted) {
  std::unique_ptr<LocalSamplerClient> local = Connect();
  ASSERT_NE(local, nullptr);
  const std::string before = *testing::HttpGet(server_->metrics_address(), "/metrics");
  const std::string series = "flashsampler_requests_total{code=\"OK\",method=\"LocalSample\"}";
  int sent = 0;
  for (int64_t rows : {1, 5, 256}) {
    for (uint64_t seed : {1, 2}) {
      const v1::SampleRequest request = BytesRequest(rows, seed * 1000 + rows);
      absl::StatusOr<v1::SampleResponse> want = grpc_->Sample(request);
      ASSERT_TRUE(want.ok()) << want.status();
      absl::StatusOr<v1::SampleResponse> got = local->Sample(request);
      ASSERT_TRUE(got.ok()) << got.status();
      ++sent;
      ASSERT_EQ(got->token_ids_size(), rows);
      ExpectSameAnswer(*got, *want);
    }
  }
  // Every local request is in the metrics under its own method.
  const double counted_before = testing::SeriesValue(before, series);
  EXPECT_TRUE(testing::WaitForMetrics(server_->metrics_address(), [&](const std::string& text) {
                return testing::SeriesValue(text, series) >= counted_before + sent;
              }).ok());
}

TEST_F(LocalChannelE2E, RegionRequestsMatchTheGrpcPath) {
  absl::StatusOr<std::unique_ptr<SharedMemoryBuffer>> b =
      SharedMemoryBuffer::Create(absl::StrCat("/fs-local-e2e-", getpid()), 1 << 20);
  ASSERT_TRUE(b.ok()) << b.status();
  std::unique_ptr<SharedMemoryBuffer> buffer = *std::move(b);
  ASSERT_TRUE(grpc_->RegisterSystemSharedMemory("local-mem", buffer->key(), buffer->byte_size()).ok());
  std::unique_ptr<LocalSamplerClient> local = Connect();
  ASSERT_NE(local, nullptr);
  for (int64_t rows : {1, 16, 200}) {
    const v1::SampleRequest bytes = BytesRequest(rows, 500 + rows);
    absl::StatusOr<v1::SampleResponse> want = grpc_->Sample(bytes);
    ASSERT_TRUE(want.ok()) << want.status();
    v1::SampleRequest request = bytes;
    const std::string& data = bytes.hidden_states().data();
    std::memcpy(buffer->data() + 64, data.data(), data.size());
    request.mutable_hidden_states()->clear_data();
    v1::RegionSlice* in = request.mutable_hidden_states_region();
    in->set_region("local-mem");
    in->set_offset(64);
    in->set_byte_size(data.size());
    const uint64_t out_offset = 900000;
    v1::RegionSlice* out = request.mutable_output_region();
    out->set_region("local-mem");
    out->set_offset(out_offset);
    out->set_byte_size(rows * 12);
    absl::StatusOr<v1::SampleResponse> got = local->Sample(request);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->token_ids_size(), 0);  // the results are in the region
    EXPECT_THAT(got->seeds(), ElementsAreArray(want->seeds()));
    std::vector<int32_t> tokens(rows);
    std::vector<float> logz(rows), logprobs(rows);
    std::memcpy(tokens.data(), buffer->data() + out_offset, 4 * rows);
    std::memcpy(logz.data(), buffer->data() + out_offset + 4 * rows, 4 * rows);
    std::memcpy(logprobs.data(), buffer->data() + out_offset + 8 * rows, 4 * rows);
    EXPECT_THAT(tokens, ElementsAreArray(want->token_ids())) << rows << " rows";
    EXPECT_THAT(logz, ElementsAreArray(want->logz()));
    EXPECT_THAT(logprobs, ElementsAreArray(want->logprobs()));

    // A slice outside the region, an unregistered region: their errors, and
    // the connection goes on.
    v1::SampleRequest outside = request;
    outside.mutable_hidden_states_region()->set_offset(buffer->byte_size() - 8);
    absl::StatusOr<v1::SampleResponse> refused = local->Sample(outside);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("not inside"));
    v1::SampleRequest unknown = request;
    unknown.mutable_output_region()->set_region("nope");
    EXPECT_EQ(local->Sample(unknown).status().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_TRUE(grpc_->UnregisterRegion("local-mem").ok());
}

TEST_F(LocalChannelE2E, ARequestsErrorLeavesTheConnectionOpen) {
  std::unique_ptr<LocalSamplerClient> local = Connect();
  ASSERT_NE(local, nullptr);
  v1::SampleRequest wrong_shape = BytesRequest(2, 3);
  wrong_shape.mutable_hidden_states()->set_shape(1, kHidden + 1);
  absl::StatusOr<v1::SampleResponse> refused = local->Sample(wrong_shape);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  // A deadline that has passed before the request can run.
  absl::StatusOr<v1::SampleResponse> late = local->Sample(BytesRequest(64, 4), absl::Microseconds(1));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  absl::StatusOr<v1::SampleResponse> after = local->Sample(BytesRequest(2, 3));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->token_ids_size(), 2);
  EXPECT_FALSE(local->broken());  // a request's error is not the connection's

  // A payload that is no SampleRequest: its call id's error, then the
  // connection serves the next frame.
  const int fd = ConnectRaw(socket_);
  ASSERT_GE(fd, 0);
  local::FrameHeader h;
  h.call_id = 41;
  ASSERT_TRUE(local::WriteFrame(fd, h, std::string("\xff\xff\xff\xff garbage", 12)).ok());
  ExpectStatusFrame(fd, 41, absl::StatusCode::kInvalidArgument, "not a serialized");
  std::string request;
  ASSERT_TRUE(BytesRequest(1, 5).SerializeToString(&request));
  h.call_id = 42;
  ASSERT_TRUE(local::WriteFrame(fd, h, request).ok());
  std::string payload;
  absl::StatusOr<local::FrameHeader> answer = local::ReadFrame(fd, 1 << 20, &payload);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->kind, local::FrameKind::kSampleResponse);
  EXPECT_EQ(answer->call_id, 42u);
  v1::SampleResponse response;
  ASSERT_TRUE(response.ParseFromString(payload));
  EXPECT_EQ(response.token_ids_size(), 1);
  close(fd);
}

TEST_F(LocalChannelE2E, AFrameThatCannotBeTrustedEndsTheConnectionWithItsReason) {
  struct Case {
    std::string name;
    std::string bytes;
    absl::StatusCode code;
    std::string fragment;
  };
  std::vector<Case> cases;
  {
    std::string bad_magic(local::kFrameHeaderBytes, 'A');
    cases.push_back({"bad magic", bad_magic, absl::StatusCode::kInvalidArgument, "bad magic"});
  }
  {
    local::FrameHeader h;
    std::string frame;
    local::AppendFrame(h, "", &frame);
    frame[4] = 9;  // kind 9
    cases.push_back({"unknown kind", frame, absl::StatusCode::kInvalidArgument, "unknown"});
  }
  {
    local::FrameHeader h;
    h.kind = local::FrameKind::kSampleResponse;  // a server's kind
    std::string frame;
    local::AppendFrame(h, "", &frame);
    cases.push_back({"response kind", frame, absl::StatusCode::kInvalidArgument, "got kind 2"});
  }
  {
    // A header that announces 4 GiB - 1 bytes: refused before any is read.
    uint8_t head[local::kFrameHeaderBytes];
    local::FrameHeader h;
    h.payload_bytes = 0xFFFFFFFFu;
    local::EncodeFrameHeader(h, head);
    cases.push_back({"oversized", std::string(reinterpret_cast<char*>(head), sizeof(head)),
                     absl::StatusCode::kResourceExhausted, "exceeds the limit"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    // The connections of the cases before are closed, but the server counts
    // each until its thread has seen the close (--max_local_connections=3):
    // a connection it refuses for the limit, which it says in its Status
    // frame, is opened again until it has let them go.
    int fd = -1;
    absl::StatusOr<local::FrameHeader> h = absl::UnknownError("not read");
    std::string payload;
    for (int attempt = 0; attempt < 10000; ++attempt) {
      fd = ConnectRaw(socket_);
      ASSERT_GE(fd, 0);
      size_t sent = 0;
      // A refused connection may be closed before the bytes are all sent.
      const absl::Status send = local::SendBytes(fd, c.bytes, &sent, true);
      h = local::ReadFrame(fd, 1 << 20, &payload);
      const bool refused_for_the_limit =
          h.ok() && h->arg == static_cast<uint32_t>(absl::StatusCode::kResourceExhausted) &&
          payload.find("--max_local_connections") != std::string::npos;
      if (!refused_for_the_limit) {
        ASSERT_TRUE(send.ok()) << send;
        break;
      }
      close(fd);
      fd = -1;
    }
    ASSERT_GE(fd, 0) << "every connection was refused for the limit";
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->kind, local::FrameKind::kStatus);
    EXPECT_EQ(h->call_id, 0u);
    EXPECT_EQ(h->arg, static_cast<uint32_t>(c.code)) << payload;
    EXPECT_THAT(payload, HasSubstr(c.fragment));
    ExpectEndOfStream(fd);
    close(fd);
  }
  // A client that vanishes inside a frame takes nothing down.
  const int fd = ConnectRaw(socket_);
  ASSERT_GE(fd, 0);
  local::FrameHeader h;
  std::string half;
  local::AppendFrame(h, std::string(1000, 'x'), &half);
  size_t sent = 0;
  ASSERT_TRUE(local::SendBytes(fd, half.substr(0, 500), &sent, true).ok());
  close(fd);
  // The server still serves.
  const absl::StatusOr<v1::SampleResponse> served = SampleOnANewConnection(BytesRequest(3, 6));
  EXPECT_TRUE(served.ok()) << served.status();
}

TEST_F(LocalChannelE2E, ConnectionsBeyondTheLimitAreRefused) {
  // Three connections (the limit), each known to the server once it has
  // answered on it (connections of earlier tests may still be ending:
  // SampleOnANewConnection).
  std::vector<std::unique_ptr<LocalSamplerClient>> open(3);
  for (auto& c : open) {
    const absl::StatusOr<v1::SampleResponse> r = SampleOnANewConnection(BytesRequest(1, 7), &c);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // A fourth is told why and closed, whether its request was sent or not.
  std::unique_ptr<LocalSamplerClient> extra = Connect();
  ASSERT_NE(extra, nullptr);
  absl::StatusOr<v1::SampleResponse> r = extra->Sample(BytesRequest(1, 8));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--max_local_connections"));
  // A connection-level refusal: the client says so (a caller connects again),
  // and every later call fails at once with it.
  EXPECT_TRUE(extra->broken());
  EXPECT_EQ(extra->Sample(BytesRequest(1, 8)).status().code(), absl::StatusCode::kResourceExhausted);
  // The three go on.
  for (auto& c : open) EXPECT_TRUE(c->Sample(BytesRequest(1, 9)).ok());
}

TEST(LocalChannelLifecycle, StaleSocketIsReplacedASecondServerRefusedAndTheDrainSaysGoodbye) {
  ScopedTempDir dir("local_channel_lifecycle");
  const std::string path = dir.Path("fs.sock");
  {
    // A socket file whose server is gone.
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path.data(), path.size());
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    close(fd);
  }
  const std::vector<std::string> flags = {"--backend=cpu", "--demo_vocab=256", "--demo_hidden=64",
                                          "--threads=1", "--local_socket=" + path};
  ServerProcess server(flags);
  const absl::Status started = server.Start();
  ASSERT_TRUE(started.ok()) << started;
  // An idle connection, known to the server once it has answered on it.
  const int idle = ConnectRaw(path);
  ASSERT_GE(idle, 0);
  std::string request;
  ASSERT_TRUE(BytesRequest(1, 10).SerializeToString(&request));
  local::FrameHeader h;
  h.call_id = 1;
  ASSERT_TRUE(local::WriteFrame(idle, h, request).ok());
  std::string payload;
  absl::StatusOr<local::FrameHeader> answer = local::ReadFrame(idle, 1 << 20, &payload);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->kind, local::FrameKind::kSampleResponse);

  // A second server on the same path does not take it over.
  ServerProcess second(flags);
  EXPECT_FALSE(second.Start(absl::Seconds(60)).ok());
  absl::StatusOr<int> second_exit = second.WaitForExit(absl::Seconds(60));
  ASSERT_TRUE(second_exit.ok()) << second_exit.status();
  EXPECT_EQ(*second_exit, 1);
  std::unique_ptr<LocalSamplerClient> client = *LocalSamplerClient::Connect(path);
  ASSERT_TRUE(client->Sample(BytesRequest(1, 11)).ok());

  // SIGTERM: the idle connection is told why it ends, then closed.
  server.SendSignal(SIGTERM);
  ExpectStatusFrame(idle, 0, absl::StatusCode::kUnavailable, "shutting down");
  ExpectEndOfStream(idle);
  close(idle);
  // So is the client's, whose next request cannot be served.
  absl::StatusOr<v1::SampleResponse> after = client->Sample(BytesRequest(1, 12));
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable) << after.status();
  absl::StatusOr<int> exit_code = server.WaitForExit(absl::Seconds(60));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
  struct stat st;
  EXPECT_NE(lstat(path.c_str(), &st), 0);  // removed
}

}  // namespace
}  // namespace flashsampler
