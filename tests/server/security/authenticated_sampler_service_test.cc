#include "server/security/authenticated_sampler_service.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <utility>

#include "gtest/gtest.h"
#include "tests/common/loopback_sampler.h"

namespace flashsampler {
namespace {

// Answers every RPC at once and counts the calls that reached it.
class FakeSampler final : public v1::Sampler::CallbackService {
 public:
  grpc::ServerUnaryReactor* Sample(grpc::CallbackServerContext* context, const v1::SampleRequest*,
                                   v1::SampleResponse* response) override {
    ++calls;
    response->add_token_ids(7);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerBidiReactor<v1::SampleRequest, v1::SampleResponse>* SampleStream(
      grpc::CallbackServerContext*) override {
    ++calls;
    class Done final : public grpc::ServerBidiReactor<v1::SampleRequest, v1::SampleResponse> {
     public:
      Done() { Finish(grpc::Status::OK); }
      void OnDone() override { delete this; }
    };
    return new Done;
  }
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest*, v1::ModelInfo* info) override {
    ++calls;
    info->set_vocab_size(5);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context, const v1::VerifyRequest*,
                                   v1::VerifyResponse* response) override {
    ++calls;
    response->add_sequences()->set_num_accepted(1);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  std::atomic<int> calls{0};
};

class AuthenticatedSamplerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::LoopbackSampler loopback = testing::StartLoopbackSampler(&service_);
    ASSERT_NE(loopback.server, nullptr);
    server_ = std::move(loopback.server);
    stub_ = std::move(loopback.stub);
  }
  void TearDown() override { server_->Shutdown(); }

  // The four RPCs' codes with `authorization` (none when empty).
  std::vector<grpc::StatusCode> CallAll(const std::string& authorization) {
    std::vector<grpc::StatusCode> codes;
    auto prepare = [&](grpc::ClientContext* c) {
      if (!authorization.empty()) c->AddMetadata("authorization", authorization);
    };
    {
      grpc::ClientContext c;
      prepare(&c);
      v1::SampleResponse r;
      codes.push_back(stub_->Sample(&c, v1::SampleRequest(), &r).error_code());
    }
    {
      grpc::ClientContext c;
      prepare(&c);
      auto stream = stub_->SampleStream(&c);
      stream->WritesDone();
      codes.push_back(stream->Finish().error_code());
    }
    {
      grpc::ClientContext c;
      prepare(&c);
      v1::ModelInfo info;
      codes.push_back(stub_->GetModelInfo(&c, v1::GetModelInfoRequest(), &info).error_code());
    }
    {
      grpc::ClientContext c;
      prepare(&c);
      v1::VerifyResponse r;
      codes.push_back(stub_->Verify(&c, v1::VerifyRequest(), &r).error_code());
    }
    return codes;
  }

  FakeSampler inner_;
  BearerTokenAuth auth_{"right"};
  AuthenticatedSamplerService service_{&inner_, &auth_};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Sampler::Stub> stub_;
};

TEST_F(AuthenticatedSamplerServiceTest, ForwardsOnlyAuthenticatedCalls) {
  using grpc::StatusCode;
  const std::vector<StatusCode> refused(4, StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CallAll(""), refused);
  EXPECT_EQ(CallAll("Bearer wrong"), refused);
  EXPECT_EQ(inner_.calls, 0);  // refused calls never reach the service
  EXPECT_EQ(CallAll("Bearer right"), std::vector<StatusCode>(4, StatusCode::OK));
  EXPECT_EQ(inner_.calls, 4);
}

}  // namespace
}  // namespace flashsampler
