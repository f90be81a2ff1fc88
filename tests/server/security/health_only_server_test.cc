#include "server/security/health_only_server.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "flashsampler/v1/sampler.grpc.pb.h"
#include "gtest/gtest.h"

namespace flashsampler {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

grpc::Status Check(grpc::health::v1::Health::Stub* stub, const std::string& service,
                   HealthCheckResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  HealthCheckRequest request;
  request.set_service(service);
  return stub->Check(&context, request, response);
}

TEST(HealthOnlyServer, AnswersChecksForItsServicesAndServesNothingElse) {
  absl::StatusOr<std::unique_ptr<HealthOnlyServer>> server =
      HealthOnlyServer::Start("127.0.0.1:0", {"flashsampler.v1.Sampler"});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                                     grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);

  HealthCheckResponse response;
  ASSERT_TRUE(Check(health.get(), "", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);  // until main says so
  (*server)->SetServing(true);
  for (const char* service : {"", "flashsampler.v1.Sampler"}) {
    ASSERT_TRUE(Check(health.get(), service, &response).ok()) << service;
    EXPECT_EQ(response.status(), HealthCheckResponse::SERVING) << service;
  }
  EXPECT_EQ(Check(health.get(), "other.Service", &response).error_code(), grpc::StatusCode::NOT_FOUND);
  (*server)->SetServing(false);
  ASSERT_TRUE(Check(health.get(), "flashsampler.v1.Sampler", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);

  // The Sampler is not served here.
  auto sampler = v1::Sampler::NewStub(channel);
  grpc::ClientContext context;
  v1::ModelInfo info;
  EXPECT_EQ(sampler->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  // A second listener on the same port cannot start.
  absl::StatusOr<std::unique_ptr<HealthOnlyServer>> clash =
      HealthOnlyServer::Start(absl::StrCat("127.0.0.1:", (*server)->port()), {});
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kUnavailable);
  (*server)->Shutdown();
}

}  // namespace
}  // namespace flashsampler
