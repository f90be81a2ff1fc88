// SamplerService in process, through a real gRPC server on loopback: the
// region RPCs before and after the engine is loaded. (Sample, streams, Verify
// and the drain end to end: tests/e2e.)
#include "server/api/sampler_service.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/shared_memory_buffer.h"
#include "gtest/gtest.h"
#include "server/model/lm_head.h"
#include "tests/common/loopback_sampler.h"

namespace flashsampler {
namespace {

class SamplerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::LoopbackSampler loopback = testing::StartLoopbackSampler(&service_);
    ASSERT_NE(loopback.server, nullptr);
    server_ = std::move(loopback.server);
    stub_ = std::move(loopback.stub);
  }
  void TearDown() override {
    server_->Shutdown();
    batcher_.Stop();
  }

  grpc::Status Register(const std::string& name, const std::string& key) {
    v1::RegisterRegionRequest request;
    request.set_name(name);
    request.set_byte_size(4096);
    request.mutable_system()->set_key(key);
    v1::RegisterRegionResponse response;
    grpc::ClientContext context;
    return stub_->RegisterRegion(&context, request, &response);
  }
  int Listed() {
    v1::ListRegionsResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->ListRegions(&context, v1::ListRegionsRequest(), &response).ok());
    return response.regions_size();
  }

  DynamicBatcher batcher_{BatcherOptions{}};
  MemoryRegions regions_{MemoryRegionsOptions{}};
  SamplerService service_{&batcher_, RequestLimits{16}, nullptr, &regions_};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Sampler::Stub> stub_;
};

// While the LM head loads, the regions do not know the engine's GPUs yet: a
// registration then is UNAVAILABLE (try again), not a region that would never
// be read in place. Once the engine is set, the same call registers.
TEST_F(SamplerServiceTest, RegisterRegionIsUnavailableUntilTheEngineIsLoaded) {
  absl::StatusOr<std::unique_ptr<SharedMemoryBuffer>> shm =
      SharedMemoryBuffer::Create(absl::StrCat("/fs-service-test-", getpid()), 4096);
  ASSERT_TRUE(shm.ok()) << shm.status();
  const grpc::Status early = Register("early", (*shm)->key());
  EXPECT_EQ(early.error_code(), grpc::StatusCode::UNAVAILABLE) << early.error_message();
  EXPECT_EQ(Listed(), 0);
  absl::StatusOr<std::unique_ptr<Engine>> engine = MakeEngine("cpu", LmHead::Demo(64, 16, 1), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  batcher_.SetEngine(*std::move(engine));
  const grpc::Status loaded = Register("early", (*shm)->key());
  EXPECT_TRUE(loaded.ok()) << loaded.error_message();
  EXPECT_EQ(Listed(), 1);
  v1::UnregisterRegionRequest unregister;
  unregister.set_name("early");
  v1::UnregisterRegionResponse unregistered;
  grpc::ClientContext context;
  EXPECT_TRUE(stub_->UnregisterRegion(&context, unregister, &unregistered).ok());
}

}  // namespace
}  // namespace flashsampler
