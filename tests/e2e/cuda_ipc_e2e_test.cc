// End to end on a GPU (label gpu): requests whose hidden states and results
// live in a GPU buffer of this (client) process, shared with the real server
// on the CUDA backend by CUDA IPC. Tokens, logz and logprobs must equal the
// gRPC path's, with the request sent over gRPC or over the local channel
// (--local_socket); every bad descriptor gets its error and the server stays up.
// (A process cannot open its own IPC handle, hence a separate server.)
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "client/local_sampler_client.h"
#include "client/sampler_client.h"
#include "client/shared_memory_buffer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/server_process.h"

namespace flashsampler {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing::ServerProcess;

constexpr int64_t kHidden = 256;
constexpr size_t kBufferBytes = 4 << 20;

v1::SampleRequest BytesRequest(int64_t rows, uint64_t seed, v1::DType dtype = v1::DTYPE_BF16) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  std::vector<float> values(rows * kHidden);
  for (float& x : values) x = normal(gen);
  v1::SampleRequest r;
  *r.mutable_hidden_states() = MakeHiddenStates(values, rows, kHidden, dtype);
  v1::SamplingParams* p = r.add_params();
  p->set_temperature(0.9f);
  p->set_seed(77 + seed);
  r.set_return_logz(true);
  r.set_return_logprobs(true);
  return r;
}

class CudaIpcE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
    ASSERT_GE(devices, 1) << "gpu-labelled test started without a CUDA device";
    server_ = std::make_unique<ServerProcess>(std::vector<std::string>{
        "--backend=cuda", "--cuda_device=0", "--demo_vocab=50000", "--demo_hidden=256",
        "--max_request_rows=256", "--local_socket=" + LocalSocket(),
        // Requests over 100 rows span launches: the engine writes each
        // launch's part of their results into the GPU buffer.
        "--max_batch_rows=100"});
    const absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
    client_ = std::make_unique<SamplerClient>(server_->address());
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&buffer_, kBufferBytes), cudaSuccess);
    cudaIpcMemHandle_t handle;
    ASSERT_EQ(cudaIpcGetMemHandle(&handle, buffer_), cudaSuccess);
    handle_.assign(reinterpret_cast<const char*>(&handle), sizeof handle);
  }
  void TearDown() override {
    if (server_ != nullptr && server_->running()) {
      absl::StatusOr<int> exit_code = server_->Stop(SIGTERM, absl::Seconds(30));
      EXPECT_TRUE(exit_code.ok() && *exit_code == 0);
    }
    if (buffer_ != nullptr) cudaFree(buffer_);  // after the server closed its mapping
  }

  static std::string LocalSocket() { return absl::StrCat("/tmp/fs-cuda-ipc-e2e-", getpid(), ".sock"); }

  // `request` with its hidden bytes copied into the GPU buffer at offset 0 and
  // its results directed to `out_offset`.
  v1::SampleRequest ThroughGpu(v1::SampleRequest request, uint64_t out_offset) {
    const std::string& data = request.hidden_states().data();
    EXPECT_EQ(cudaMemcpy(buffer_, data.data(), data.size(), cudaMemcpyHostToDevice), cudaSuccess);
    v1::RegionSlice* in = request.mutable_hidden_states_region();
    in->set_region("gpu");
    in->set_byte_size(data.size());
    request.mutable_hidden_states()->clear_data();
    const int64_t rows = request.hidden_states().shape(0);
    v1::RegionSlice* out = request.mutable_output_region();
    out->set_region("gpu");
    out->set_offset(out_offset);
    out->set_byte_size(rows * 12);
    return request;
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<SamplerClient> client_;
  void* buffer_ = nullptr;
  std::string handle_;
};

TEST_F(CudaIpcE2E, TokensLogzAndLogprobsAreThoseOfTheGrpcPath) {
  ASSERT_TRUE(client_->RegisterCudaIpc("gpu", handle_, 0, kBufferBytes).ok());
  absl::StatusOr<v1::ListRegionsResponse> list = client_->ListRegions();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->regions_size(), 1);
  EXPECT_EQ(list->regions(0).cuda_ipc().device_id(), 0);
  EXPECT_TRUE(list->regions(0).cuda_ipc().ipc_handle().empty());
  absl::StatusOr<std::unique_ptr<LocalSamplerClient>> connected = LocalSamplerClient::Connect(LocalSocket());
  ASSERT_TRUE(connected.ok()) << connected.status();
  std::unique_ptr<LocalSamplerClient> local = *std::move(connected);
  // The server reads the buffer in place (its single GPU) and widens on the
  // GPU: bf16 exactly, fp32 rounded to the head's bf16 as the host rounds it.
  // The engine writes plain rows' results into the buffer itself, device to
  // device; rows with sampling controls (top_k here) are written from the host.
  for (const auto& [rows, dtype, top_k] : std::vector<std::tuple<int64_t, v1::DType, int>>{
           {1, v1::DTYPE_BF16, 0}, {64, v1::DTYPE_BF16, 0}, {256, v1::DTYPE_BF16, 0}, {3, v1::DTYPE_FP32, 0},
           {200, v1::DTYPE_FP32, 0}, {5, v1::DTYPE_BF16, 20}, {150, v1::DTYPE_BF16, 20}}) {
    v1::SampleRequest bytes = BytesRequest(rows, rows, dtype);
    bytes.mutable_params(0)->set_top_k(top_k);
    absl::StatusOr<v1::SampleResponse> want = client_->Sample(bytes);
    ASSERT_TRUE(want.ok()) << want.status();
    const uint64_t out_offset = 3 << 20;
    for (bool over_local_channel : {false, true}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows of " << v1::DType_Name(dtype) << ", top_k " << top_k
                                        << (over_local_channel ? ", local channel" : ", gRPC"));
      ASSERT_EQ(cudaMemset(static_cast<char*>(buffer_) + out_offset, 0xff, rows * 12), cudaSuccess);
      absl::StatusOr<v1::SampleResponse> got =
          over_local_channel ? local->Sample(ThroughGpu(bytes, out_offset))
                             : client_->Sample(ThroughGpu(bytes, out_offset));
      ASSERT_TRUE(got.ok()) << got.status();
      std::vector<char> raw(rows * 12);
      ASSERT_EQ(cudaMemcpy(raw.data(), static_cast<char*>(buffer_) + out_offset, raw.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      std::vector<int32_t> tokens(rows);
      std::vector<float> logz(rows), logprobs(rows);
      std::memcpy(tokens.data(), raw.data(), 4 * rows);
      std::memcpy(logz.data(), raw.data() + 4 * rows, 4 * rows);
      std::memcpy(logprobs.data(), raw.data() + 8 * rows, 4 * rows);
      EXPECT_THAT(tokens, ElementsAreArray(want->token_ids())) << rows;
      EXPECT_THAT(logz, ElementsAreArray(want->logz()));
      EXPECT_THAT(logprobs, ElementsAreArray(want->logprobs()));
    }
  }
  EXPECT_TRUE(client_->UnregisterRegion("gpu").ok());
}

TEST_F(CudaIpcE2E, BadDescriptorsGetTheirErrorsAndTheServerStaysUp) {
  // Past the allocation, on a device the engine does not use, a handle of the
  // wrong size, a garbage handle.
  absl::Status s = client_->RegisterCudaIpc("gpu", handle_, 0, kBufferBytes, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("does not fit"));
  s = client_->RegisterCudaIpc("gpu", handle_, 7, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("runs on device(s) 0"));
  s = client_->RegisterCudaIpc("gpu", handle_.substr(1), 0, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  std::string garbage = handle_;
  for (char& c : garbage) c = static_cast<char>(~c);
  s = client_->RegisterCudaIpc("gpu", garbage, 0, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;

  ASSERT_TRUE(client_->RegisterCudaIpc("gpu", handle_, 0, 1 << 20, 1 << 20).ok());
  v1::SampleRequest r = ThroughGpu(BytesRequest(4, 1), 0);  // input copied at 0: outside the region
  EXPECT_TRUE(client_->Sample(r).ok());  // the region's slice 0 is the buffer's 1 MiB mark
  r.mutable_hidden_states_region()->set_offset((1 << 20) - 100);
  EXPECT_EQ(client_->Sample(r).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(client_->GetModelInfo().ok());
  EXPECT_TRUE(client_->UnregisterRegion("gpu").ok());
  EXPECT_TRUE(server_->running());
}

// The values are checked where they are, on the GPU: a NaN is refused with
// its row and column, the server stays up and serves the next request.
TEST_F(CudaIpcE2E, ANonFiniteValueInTheGpuBufferIsRefusedWithItsPlace) {
  ASSERT_TRUE(client_->RegisterCudaIpc("gpu", handle_, 0, kBufferBytes).ok());
  const v1::SampleRequest r = ThroughGpu(BytesRequest(4, 5), 1 << 20);
  const uint16_t bf16_nan = 0x7fc0;
  ASSERT_EQ(cudaMemcpy(static_cast<char*>(buffer_) + (2 * kHidden + 5) * 2, &bf16_nan, 2, cudaMemcpyHostToDevice),
            cudaSuccess);
  const absl::Status s = client_->Sample(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("[2][5] is NaN"));
  EXPECT_TRUE(client_->Sample(ThroughGpu(BytesRequest(4, 6), 1 << 20)).ok());
  EXPECT_TRUE(client_->UnregisterRegion("gpu").ok());
  EXPECT_TRUE(server_->running());
}

// Shared-memory regions on the CUDA server, read in place by the GPU (the
// default: the object mapped into its address space) or, with
// --shm_device_reads=false, read with pread into pinned staging: the gRPC
// path's results either way, and a NaN refused with its place. A client that
// shrinks the object under a registered region leaves the server up either
// way, and its next request is refused as truncated. Grown back to its size,
// the object passes the size check again and the request is answered: a GPU
// that reads in place reads the pages pinned at registration, pread the new
// pages.
void CheckSharedMemory(SamplerClient* client, ServerProcess* server, bool truncate, bool in_place) {
  const std::string key = absl::StrCat("/fs-cuda-shm-", getpid());
  absl::StatusOr<std::unique_ptr<SharedMemoryBuffer>> shm = SharedMemoryBuffer::Create(key, 4 << 20);
  ASSERT_TRUE(shm.ok()) << shm.status();
  ASSERT_TRUE(client->RegisterSystemSharedMemory("host", key, 4 << 20).ok());
  absl::StatusOr<v1::ListRegionsResponse> listed = client->ListRegions();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->regions_size(), 1);
  EXPECT_EQ(listed->regions(0).read_in_place(), in_place);
  const uint64_t out_offset = 3 << 20;
  uint64_t in_offset = 4096;
  const auto through_shm = [&](v1::SampleRequest request, const std::string& region = "host") {
    const std::string& data = request.hidden_states().data();
    std::memcpy((*shm)->data() + in_offset, data.data(), data.size());
    v1::RegionSlice* in = request.mutable_hidden_states_region();
    in->set_region(region);
    in->set_offset(in_offset);
    in->set_byte_size(data.size());
    request.mutable_hidden_states()->clear_data();
    v1::RegionSlice* out = request.mutable_output_region();
    out->set_region(region);
    out->set_offset(out_offset);
    out->set_byte_size(request.hidden_states().shape(0) * 12);
    return request;
  };
  for (const auto& [rows, dtype] : std::vector<std::pair<int64_t, v1::DType>>{
           {1, v1::DTYPE_BF16}, {64, v1::DTYPE_BF16}, {256, v1::DTYPE_BF16}, {5, v1::DTYPE_FP32}}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows of " << v1::DType_Name(dtype));
    const v1::SampleRequest bytes = BytesRequest(rows, 300 + rows, dtype);
    absl::StatusOr<v1::SampleResponse> want = client->Sample(bytes);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<v1::SampleResponse> got = client->Sample(through_shm(bytes));
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<int32_t> tokens(rows);
    std::vector<float> logz(rows);
    std::memcpy(tokens.data(), (*shm)->data() + out_offset, 4 * rows);
    std::memcpy(logz.data(), (*shm)->data() + out_offset + 4 * rows, 4 * rows);
    EXPECT_THAT(tokens, ElementsAreArray(want->token_ids()));
    EXPECT_THAT(logz, ElementsAreArray(want->logz()));
  }
  {
    // Rows at an odd offset: no device load may be misaligned (a fault
    // would stop the GPU for every later request), so they are read
    // through the host; the same results.
    in_offset = 4097;
    const v1::SampleRequest bytes = BytesRequest(3, 77);
    absl::StatusOr<v1::SampleResponse> want = client->Sample(bytes);
    absl::StatusOr<v1::SampleResponse> got = client->Sample(through_shm(bytes));
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << " " << got.status();
    std::vector<int32_t> tokens(3);
    std::memcpy(tokens.data(), (*shm)->data() + out_offset, 4 * 3);
    EXPECT_THAT(tokens, ElementsAreArray(want->token_ids()));
    in_offset = 4096;
  }
  v1::SampleRequest bad = through_shm(BytesRequest(4, 5));
  const uint16_t bf16_nan = 0x7fc0;
  std::memcpy((*shm)->data() + 4096 + (3 * kHidden + 7) * 2, &bf16_nan, 2);
  const absl::Status s = client->Sample(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("hidden_states[3][7] is NaN"));
  if (truncate) {
    // The object changed under the region between two requests, unseen by
    // any request: shrunk and grown back (region "host"), or a hole punched
    // where the rows lie (region "holed", registered after). New rows are
    // written, and the answer is theirs: a GPU that read the region in place
    // must not read the old pages pinned at registration.
    const auto expect_fresh_rows = [&](const std::string& region, uint64_t seed) {
      const v1::SampleRequest bytes = BytesRequest(4, seed);
      absl::StatusOr<v1::SampleResponse> want = client->Sample(bytes);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(client->Sample(through_shm(bytes, region)).ok());
      std::vector<int32_t> tokens(4);
      std::memcpy(tokens.data(), (*shm)->data() + out_offset, 4 * 4);
      EXPECT_THAT(tokens, ElementsAreArray(want->token_ids())) << region << ", seed " << seed;
    };
    expect_fresh_rows("host", 50);
    const int regrow = shm_open(key.c_str(), O_RDWR, 0);
    ASSERT_GE(regrow, 0);
    ASSERT_EQ(ftruncate(regrow, 0), 0);
    ASSERT_EQ(ftruncate(regrow, 4 << 20), 0);  // this process's mapping maps the new pages
    expect_fresh_rows("host", 51);
    ASSERT_TRUE(client->RegisterSystemSharedMemory("holed", key, 4 << 20).ok());
    expect_fresh_rows("holed", 52);
    ASSERT_EQ(fallocate(regrow, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, in_offset, 4096), 0);
    expect_fresh_rows("holed", 53);
    close(regrow);
    EXPECT_TRUE(client->UnregisterRegion("holed").ok());
    // (This process must not touch its own mapping from here on: SIGBUS.)
    const v1::SampleRequest after_truncation = through_shm(BytesRequest(4, 6));
    const int fd = shm_open(key.c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 0), 0);
    close(fd);
    const absl::Status truncated = client->Sample(after_truncation).status();
    EXPECT_EQ(truncated.code(), absl::StatusCode::kInvalidArgument) << truncated;
    EXPECT_THAT(std::string(truncated.message()), HasSubstr("truncated after registration"));
    EXPECT_TRUE(client->GetModelInfo().ok());
    EXPECT_TRUE(server->running());
    // Grown back: the size check passes again and every page is readable.
    const int again = shm_open(key.c_str(), O_RDWR, 0);
    ASSERT_GE(again, 0);
    ASSERT_EQ(ftruncate(again, 4 << 20), 0);
    close(again);
    const absl::Status regrown = client->Sample(after_truncation).status();
    EXPECT_TRUE(regrown.ok()) << regrown;
    EXPECT_TRUE(server->running());
  }
  EXPECT_TRUE(client->UnregisterRegion("host").ok());
}

TEST_F(CudaIpcE2E, SharedMemoryOnTheCudaServerGivesTheGrpcPathsResults) {
  CheckSharedMemory(client_.get(), server_.get(), /*truncate=*/true, /*in_place=*/true);
}

// Runs `body` against a CUDA server of the test head started with `flag`
// as well, then stops the server, which must exit cleanly.
void WithCudaServer(const std::string& flag, const std::function<void(SamplerClient&, ServerProcess&)>& body) {
  ServerProcess server({"--backend=cuda", "--cuda_device=0", "--demo_vocab=50000", "--demo_hidden=256",
                        "--max_request_rows=256", flag});
  const absl::Status started = server.Start();
  ASSERT_TRUE(started.ok()) << started;
  {
    SamplerClient client(server.address());
    body(client, server);
  }
  absl::StatusOr<int> exit_code = server.Stop(SIGTERM, absl::Seconds(30));
  EXPECT_TRUE(exit_code.ok() && *exit_code == 0);
}

TEST(CudaSharedMemoryE2E, SharedMemoryReadWithPreadGivesTheGrpcPathsResults) {
  WithCudaServer("--shm_device_reads=false", [](SamplerClient& client, ServerProcess& server) {
    CheckSharedMemory(&client, &server, /*truncate=*/true, /*in_place=*/false);
  });
}

// --shm_device_reads_max_bytes bounds the host memory regions pin for the
// GPU: a region past it is read with pread (ListRegions says which), and a
// closed region gives its bytes back.
TEST(CudaSharedMemoryE2E, PinnedBytesAreBounded) {
  WithCudaServer("--shm_device_reads_max_bytes=6291456", [](SamplerClient& client, ServerProcess&) {
    const std::string key_a = absl::StrCat("/fs-cuda-cap-a-", getpid());
    const std::string key_b = absl::StrCat("/fs-cuda-cap-b-", getpid());
    absl::StatusOr<std::unique_ptr<SharedMemoryBuffer>> a = SharedMemoryBuffer::Create(key_a, 4 << 20);
    absl::StatusOr<std::unique_ptr<SharedMemoryBuffer>> b = SharedMemoryBuffer::Create(key_b, 4 << 20);
    ASSERT_TRUE(a.ok() && b.ok());
    const auto in_place = [&](const std::string& name) {
      absl::StatusOr<v1::ListRegionsResponse> listed = client.ListRegions();
      EXPECT_TRUE(listed.ok()) << listed.status();
      for (const v1::RegionInfo& r : listed->regions()) {
        if (r.name() == name) return r.read_in_place();
      }
      ADD_FAILURE() << "no region " << name;
      return false;
    };
    ASSERT_TRUE(client.RegisterSystemSharedMemory("a", key_a, 4 << 20).ok());
    ASSERT_TRUE(client.RegisterSystemSharedMemory("b", key_b, 4 << 20).ok());
    EXPECT_TRUE(in_place("a"));
    EXPECT_FALSE(in_place("b"));  // 8 MiB would pass the 6 MiB bound
    // b's rows, read with pread, give the gRPC path's tokens.
    v1::SampleRequest request = BytesRequest(16, 91);
    absl::StatusOr<v1::SampleResponse> want = client.Sample(request);
    ASSERT_TRUE(want.ok()) << want.status();
    const std::string& data = request.hidden_states().data();
    std::memcpy((*b)->data(), data.data(), data.size());
    v1::RegionSlice* in = request.mutable_hidden_states_region();
    in->set_region("b");
    in->set_offset(0);
    in->set_byte_size(data.size());
    request.mutable_hidden_states()->clear_data();
    absl::StatusOr<v1::SampleResponse> got = client.Sample(request);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(got->token_ids(), ElementsAreArray(want->token_ids()));
    // a closes and gives its 4 MiB back: a new region fits again.
    ASSERT_TRUE(client.UnregisterRegion("a").ok());
    ASSERT_TRUE(client.RegisterSystemSharedMemory("c", key_a, 4 << 20).ok());
    EXPECT_TRUE(in_place("c"));
    EXPECT_TRUE(client.UnregisterRegion("b").ok());
    EXPECT_TRUE(client.UnregisterRegion("c").ok());
  });
}

// Payloads the request thread starts for the GPU once admitted
// (--cuda_upload_min_bytes; here every one that arrives while a launch runs:
// the concurrent rounds) give the results of payloads the launch copies
// itself (0: uploads off), alone and in launches shared by concurrent
// requests, bf16 and fp32, over gRPC and from shared memory; a NaN still
// fails its request with its place. (cuda_engine_gpu_test runs uploaded
// rows through the engine deterministically.)
TEST(CudaUploadE2E, PayloadsStartedOnArrivalGiveTheLaunchCopysResults) {
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  ASSERT_GE(devices, 1) << "gpu-labelled test started without a CUDA device";
  const std::vector<std::string> common = {"--backend=cuda", "--cuda_device=0", "--demo_vocab=50000",
                                           "--demo_hidden=256", "--max_request_rows=256",
                                           "--max_batch_rows=300"};
  std::vector<std::string> off_args = common, on_args = common;
  off_args.push_back("--cuda_upload_min_bytes=0");
  on_args.push_back("--cuda_upload_min_bytes=1");
  ServerProcess off(off_args), on(on_args);
  ASSERT_TRUE(off.Start().ok());
  ASSERT_TRUE(on.Start().ok());
  {
    SamplerClient off_client(off.address()), on_client(on.address());
    std::vector<v1::SampleRequest> requests;
    int64_t seed = 300;
    for (const auto& [rows, dtype] : std::vector<std::pair<int64_t, v1::DType>>{
             {1, v1::DTYPE_BF16}, {64, v1::DTYPE_BF16}, {256, v1::DTYPE_BF16}, {7, v1::DTYPE_FP32},
             {100, v1::DTYPE_FP32}, {33, v1::DTYPE_FP16}}) {
      requests.push_back(BytesRequest(rows, seed++, dtype));
    }
    std::vector<v1::SampleResponse> want;
    for (const v1::SampleRequest& r : requests) {
      absl::StatusOr<v1::SampleResponse> got = off_client.Sample(r);
      ASSERT_TRUE(got.ok()) << got.status();
      want.push_back(*got);
    }
    const auto expect_same = [&](const v1::SampleResponse& got, size_t i) {
      EXPECT_THAT(got.token_ids(), ElementsAreArray(want[i].token_ids())) << i;
      EXPECT_THAT(got.logz(), ElementsAreArray(want[i].logz())) << i;
      EXPECT_THAT(got.logprobs(), ElementsAreArray(want[i].logprobs())) << i;
    };
    for (size_t i = 0; i < requests.size(); ++i) {
      absl::StatusOr<v1::SampleResponse> got = on_client.Sample(requests[i]);
      ASSERT_TRUE(got.ok()) << got.status();
      expect_same(*got, i);
    }
    // All at once, several times: launches of several uploaded payloads.
    for (int round = 0; round < 10; ++round) {
      std::vector<absl::StatusOr<v1::SampleResponse>> got(requests.size(), absl::UnknownError("not run"));
      std::vector<std::thread> threads;
      for (size_t i = 0; i < requests.size(); ++i) {
        threads.emplace_back([&, i] { got[i] = on_client.Sample(requests[i]); });
      }
      for (std::thread& t : threads) t.join();
      for (size_t i = 0; i < requests.size(); ++i) {
        ASSERT_TRUE(got[i].ok()) << got[i].status();
        expect_same(*got[i], i);
      }
    }
    v1::SampleRequest bad = BytesRequest(40, 99);
    const uint16_t bf16_nan = 0x7fc0;
    std::memcpy(bad.mutable_hidden_states()->mutable_data()->data() + (37 * kHidden + 5) * 2, &bf16_nan, 2);
    const absl::Status bad_status = on_client.Sample(bad).status();
    EXPECT_EQ(bad_status.code(), absl::StatusCode::kInvalidArgument) << bad_status;
    EXPECT_THAT(std::string(bad_status.message()), HasSubstr("hidden_states[37][5] is NaN"));
    // Shared memory registered for device copies is pinned: uploaded too.
    CheckSharedMemory(&on_client, &on, /*truncate=*/false, /*in_place=*/true);
  }
  for (ServerProcess* server : {&off, &on}) {
    absl::StatusOr<int> exit_code = server->Stop(SIGTERM, absl::Seconds(30));
    EXPECT_TRUE(exit_code.ok() && *exit_code == 0);
  }
}

// Over gRPC the CUDA server also widens on the GPU, from the bytes where they
// lie in the message: a NaN there is refused with its place too, and only
// its own request fails when it shares a launch with good ones (whether it
// does depends on timing; the outcome must not).
TEST_F(CudaIpcE2E, ANonFiniteValueInTheMessageFailsOnlyItsOwnRequest) {
  std::vector<v1::SampleRequest> requests;
  std::vector<v1::SampleResponse> alone;
  for (int i = 0; i < 6; ++i) {
    requests.push_back(BytesRequest(8 + i, 100 + i));
    absl::StatusOr<v1::SampleResponse> r = client_->Sample(requests.back());
    ASSERT_TRUE(r.ok()) << r.status();
    alone.push_back(*r);
  }
  v1::SampleRequest bad = BytesRequest(3, 99);
  const uint16_t bf16_nan = 0x7fc0;
  std::memcpy(bad.mutable_hidden_states()->mutable_data()->data() + (1 * kHidden + 2) * 2, &bf16_nan, 2);
  for (int round = 0; round < 20; ++round) {
    std::vector<absl::StatusOr<v1::SampleResponse>> got(requests.size(), absl::UnknownError("not run"));
    absl::Status bad_status;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < requests.size(); ++i) {
      threads.emplace_back([&, i] { got[i] = client_->Sample(requests[i]); });
    }
    threads.emplace_back([&] { bad_status = client_->Sample(bad).status(); });
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(bad_status.code(), absl::StatusCode::kInvalidArgument) << bad_status;
    EXPECT_THAT(std::string(bad_status.message()), HasSubstr("hidden_states[1][2] is NaN"));
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << got[i].status();
      EXPECT_THAT(got[i]->token_ids(), ElementsAreArray(alone[i].token_ids()));
      EXPECT_THAT(got[i]->logz(), ElementsAreArray(alone[i].logz()));
    }
  }
  EXPECT_TRUE(server_->running());
}

}  // namespace
}  // namespace flashsampler
