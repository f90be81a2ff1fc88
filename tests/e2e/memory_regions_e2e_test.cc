// End to end: requests whose hidden states and results travel through a
// registered POSIX shared-memory region instead of gRPC, against the real
// server on the CPU backend. The CUDA IPC kind is covered by the gpu-labelled
// tests/gpu/cuda_ipc_e2e_gpu_test.cc.
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/sampler_client.h"
#include "client/shared_memory_buffer.h"
#include "flashsampler/v1/sampler.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/server_process.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;
using testing::ServerProcess;

constexpr int64_t kHidden = 64;

std::vector<float> RandomValues(int64_t n, uint64_t seed) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

// The gRPC form of a request: bf16 hidden states in the message.
v1::SampleRequest BytesRequest(int64_t rows, uint64_t data_seed) {
  v1::SampleRequest r;
  *r.mutable_hidden_states() =
      MakeHiddenStates(RandomValues(rows * kHidden, data_seed), rows, kHidden, v1::DTYPE_BF16);
  v1::SamplingParams* p = r.add_params();
  p->set_temperature(0.8f);
  p->set_seed(1234 + data_seed);
  p->set_offset(3);
  r.set_return_logz(true);
  r.set_return_logprobs(true);
  return r;
}

class MemoryRegionsE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--backend=cpu", "--demo_vocab=3000", "--demo_hidden=64",
                                 "--max_request_rows=256", "--threads=2", "--max_regions=4"});
    const absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
    client_ = new SamplerClient(server_->address());
  }
  static void TearDownTestSuite() {
    delete client_;
    // After every refused descriptor, the server still drains and exits 0.
    absl::StatusOr<int> exit_code = server_->Stop(SIGTERM, absl::Seconds(30));
    EXPECT_TRUE(exit_code.ok()) << exit_code.status();
    if (exit_code.ok()) {
      EXPECT_EQ(*exit_code, 0);
    }
    delete server_;
  }

  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    absl::StatusOr<std::unique_ptr<SharedMemoryBuffer>> b =
        SharedMemoryBuffer::Create(absl::StrCat("/fs-e2e-", getpid(), "-", test), 1 << 20);
    ASSERT_TRUE(b.ok()) << b.status();
    buffer_ = *std::move(b);
    ASSERT_TRUE(client_->RegisterSystemSharedMemory("mem", buffer_->key(), buffer_->byte_size()).ok());
  }
  void TearDown() override {
    // Every test leaves only its own region, and removes it.
    EXPECT_TRUE(client_->UnregisterRegion("mem").ok());
    absl::StatusOr<v1::ListRegionsResponse> list = client_->ListRegions();
    ASSERT_TRUE(list.ok());
    EXPECT_EQ(list->regions_size(), 0);
  }

  // `request` with its hidden bytes moved into the region at `in_offset`, and
  // its results directed to `out_offset`.
  v1::SampleRequest ThroughRegion(v1::SampleRequest request, uint64_t in_offset, uint64_t out_offset) {
    const std::string& data = request.hidden_states().data();
    std::memcpy(buffer_->data() + in_offset, data.data(), data.size());
    v1::RegionSlice* in = request.mutable_hidden_states_region();
    in->set_region("mem");
    in->set_offset(in_offset);
    in->set_byte_size(data.size());
    request.mutable_hidden_states()->clear_data();
    const int64_t rows = request.hidden_states().shape(0);
    v1::RegionSlice* out = request.mutable_output_region();
    out->set_region("mem");
    out->set_offset(out_offset);
    out->set_byte_size(rows * 12);
    return request;
  }

  // Token ids, logz and logprobs as the region holds them at `offset`.
  v1::SampleResponse ReadResults(uint64_t offset, int64_t rows) {
    v1::SampleResponse r;
    const uint8_t* at = buffer_->data() + offset;
    for (int64_t i = 0; i < rows; ++i) {
      int32_t token;
      float logz, logprob;
      std::memcpy(&token, at + 4 * i, 4);
      std::memcpy(&logz, at + 4 * rows + 4 * i, 4);
      std::memcpy(&logprob, at + 8 * rows + 4 * i, 4);
      r.add_token_ids(token);
      r.add_logz(logz);
      r.add_logprobs(logprob);
    }
    return r;
  }

  void ExpectCode(const v1::SampleRequest& request, absl::StatusCode code, const std::string& fragment) {
    absl::StatusOr<v1::SampleResponse> r = client_->Sample(request);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(fragment));
  }

  static ServerProcess* server_;
  static SamplerClient* client_;
  std::unique_ptr<SharedMemoryBuffer> buffer_;
};

ServerProcess* MemoryRegionsE2E::server_ = nullptr;
SamplerClient* MemoryRegionsE2E::client_ = nullptr;

TEST_F(MemoryRegionsE2E, TokensLogzAndLogprobsAreThoseOfTheGrpcPath) {
  for (int64_t rows : {1, 7, 256}) {
    const v1::SampleRequest bytes = BytesRequest(rows, rows);
    absl::StatusOr<v1::SampleResponse> want = client_->Sample(bytes);
    ASSERT_TRUE(want.ok()) << want.status();
    const uint64_t out_offset = 600000;
    absl::StatusOr<v1::SampleResponse> got = client_->Sample(ThroughRegion(bytes, 8, out_offset));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->token_ids_size(), 0);  // the results went to the region
    EXPECT_EQ(got->logz_size(), 0);
    ASSERT_EQ(got->seeds_size(), rows);
    const v1::SampleResponse in_region = ReadResults(out_offset, rows);
    EXPECT_THAT(in_region.token_ids(), ::testing::ElementsAreArray(want->token_ids())) << rows << " rows";
    EXPECT_THAT(in_region.logz(), ::testing::ElementsAreArray(want->logz()));
    EXPECT_THAT(in_region.logprobs(), ::testing::ElementsAreArray(want->logprobs()));
  }
}

TEST_F(MemoryRegionsE2E, AStreamOfRegionRequestsMatchesTheGrpcPath) {
  std::vector<v1::SampleRequest> bytes, regions;
  for (int i = 0; i < 8; ++i) {
    bytes.push_back(BytesRequest(16, 100 + i));
    // Distinct input and output slices per request: a stream may hold them all.
    regions.push_back(ThroughRegion(bytes.back(), 40000 * i, 500000 + 1000 * i));
  }
  absl::StatusOr<std::vector<v1::SampleResponse>> want = client_->SampleStream(bytes);
  ASSERT_TRUE(want.ok()) << want.status();
  absl::StatusOr<std::vector<v1::SampleResponse>> got = client_->SampleStream(regions);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_THAT(ReadResults(500000 + 1000 * i, 16).token_ids(),
                ::testing::ElementsAreArray((*want)[i].token_ids())) << i;
  }
}

// How many of the server's descriptors name the shared-memory object `key`.
int ServerDescriptorsOf(pid_t pid, const std::string& key) {
  int n = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"), error)) {
    std::error_code link_error;
    const std::filesystem::path target = std::filesystem::read_symlink(entry.path(), link_error);
    if (!link_error && target.string().rfind("/dev/shm" + key, 0) == 0) ++n;
  }
  EXPECT_FALSE(error) << error.message();
  return n;
}

// A stream that used a region lets go of it with its answer: unregistered
// while the stream stays open, the region closes at once (the server keeps no
// descriptor of the object), as after a unary call.
TEST_F(MemoryRegionsE2E, AnOpenStreamDoesNotHoldARegionItUsedBefore) {
  absl::StatusOr<std::unique_ptr<SharedMemoryBuffer>> held =
      SharedMemoryBuffer::Create(absl::StrCat("/fs-e2e-", getpid(), "-held"), 1 << 20);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(client_->RegisterSystemSharedMemory("held", (*held)->key(), (*held)->byte_size()).ok());
  EXPECT_EQ(ServerDescriptorsOf(server_->pid(), (*held)->key()), 1);
  v1::SampleRequest request = BytesRequest(4, 31);
  const std::string& data = request.hidden_states().data();
  std::memcpy((*held)->data(), data.data(), data.size());
  request.mutable_hidden_states_region()->set_region("held");
  request.mutable_hidden_states_region()->set_byte_size(data.size());
  request.mutable_hidden_states()->clear_data();
  request.mutable_output_region()->set_region("held");
  request.mutable_output_region()->set_offset(1 << 19);
  request.mutable_output_region()->set_byte_size(4 * 12);
  std::unique_ptr<v1::Sampler::Stub> stub =
      v1::Sampler::NewStub(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SampleRequest, v1::SampleResponse>> stream =
      stub->SampleStream(&context);
  ASSERT_TRUE(stream->Write(request));
  v1::SampleResponse response;
  ASSERT_TRUE(stream->Read(&response));
  // The stream is open and idle; its last request named the region twice.
  ASSERT_TRUE(client_->UnregisterRegion("held").ok());
  EXPECT_EQ(ServerDescriptorsOf(server_->pid(), (*held)->key()), 0);
  // The stream still serves (a request through the fixture's region).
  ASSERT_TRUE(stream->Write(ThroughRegion(BytesRequest(2, 32), 0, 4096)));
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.token_ids_size(), 0);  // the results went to the region
  stream->WritesDone();
  const grpc::Status finished = stream->Finish();
  EXPECT_TRUE(finished.ok()) << finished.error_message();
}

TEST_F(MemoryRegionsE2E, EveryBoundViolationGetsItsErrorAndTheServerStaysUp) {
  const v1::SampleRequest good = ThroughRegion(BytesRequest(4, 9), 0, 4096);
  ASSERT_TRUE(client_->Sample(good).ok());

  v1::SampleRequest r = good;
  r.mutable_hidden_states_region()->set_region("nope");
  ExpectCode(r, absl::StatusCode::kNotFound, "not registered");
  r = good;
  r.mutable_output_region()->set_region("nope");
  ExpectCode(r, absl::StatusCode::kNotFound, "not registered");
  r = good;
  r.mutable_hidden_states_region()->set_offset(buffer_->byte_size() - 100);
  ExpectCode(r, absl::StatusCode::kInvalidArgument, "not inside");
  r = good;
  r.mutable_hidden_states_region()->set_offset(~uint64_t{0} - 10);
  ExpectCode(r, absl::StatusCode::kInvalidArgument, "not inside");
  r = good;
  r.mutable_hidden_states_region()->set_byte_size(good.hidden_states_region().byte_size() + 2);
  ExpectCode(r, absl::StatusCode::kInvalidArgument, "needs");
  r = good;
  r.mutable_output_region()->set_offset(buffer_->byte_size() - 10);
  ExpectCode(r, absl::StatusCode::kInvalidArgument, "not inside");
  r = good;
  r.mutable_output_region()->set_byte_size(47);
  ExpectCode(r, absl::StatusCode::kInvalidArgument, "need 48");
  r = good;
  r.mutable_hidden_states()->set_data(std::string(good.hidden_states_region().byte_size(), '\0'));
  ExpectCode(r, absl::StatusCode::kInvalidArgument, "data must be empty");

  // Registration errors, as the RPC reports them.
  EXPECT_EQ(client_->RegisterSystemSharedMemory("mem", buffer_->key(), 16).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(client_->RegisterSystemSharedMemory("x", absl::StrCat("/fs-e2e-absent-", getpid()), 16).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->RegisterSystemSharedMemory("x", "../etc/passwd", 16).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->RegisterSystemSharedMemory("x", buffer_->key(), buffer_->byte_size() + 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->RegisterCudaIpc("x", std::string(64, '\0'), 0, 16).code(),
            absl::StatusCode::kInvalidArgument);  // the CPU backend
  EXPECT_EQ(client_->UnregisterRegion("x").code(), absl::StatusCode::kNotFound);

  // The limit (--max_regions=4; "mem" holds one).
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(client_->RegisterSystemSharedMemory(absl::StrCat("extra", i), buffer_->key(), 16).ok());
  }
  EXPECT_EQ(client_->RegisterSystemSharedMemory("extra3", buffer_->key(), 16).code(),
            absl::StatusCode::kResourceExhausted);
  absl::StatusOr<v1::ListRegionsResponse> list = client_->ListRegions();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->regions_size(), 4);
  EXPECT_EQ(list->regions(0).name(), "extra0");  // sorted by name
  EXPECT_EQ(list->regions(3).name(), "mem");
  EXPECT_EQ(list->regions(3).system().key(), buffer_->key());
  EXPECT_EQ(list->regions(3).byte_size(), buffer_->byte_size());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client_->UnregisterRegion(absl::StrCat("extra", i)).ok());

  // Still serving, through the region and through gRPC.
  EXPECT_TRUE(client_->Sample(good).ok());
  EXPECT_TRUE(client_->Sample(BytesRequest(4, 9)).ok());
  EXPECT_TRUE(server_->running());
}

}  // namespace
}  // namespace flashsampler
