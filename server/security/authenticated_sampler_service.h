// AuthenticatedSamplerService: the Sampler service behind a bearer-token check.
//
// It is registered with the gRPC server in place of the real service and
// forwards each call to it once BearerTokenAuth accepts the call's metadata;
// otherwise the call ends at once with UNAUTHENTICATED and the request is never
// parsed. Health and reflection are separate services and stay open. An RPC
// added to sampler.proto but not forwarded here answers UNIMPLEMENTED (fails
// closed) until it is added.
//
// Thread safety: as the wrapped service; this class adds only immutable state.
#pragma once

#include "flashsampler/v1/sampler.grpc.pb.h"
#include "server/security/bearer_token_auth.h"

namespace flashsampler {

class AuthenticatedSamplerService final : public v1::Sampler::CallbackService {
 public:
  // Neither pointer is owned; both must outlive the gRPC server.
  AuthenticatedSamplerService(v1::Sampler::CallbackService* inner, const BearerTokenAuth* auth);

  grpc::ServerUnaryReactor* Sample(grpc::CallbackServerContext* context,
                                   const v1::SampleRequest* request,
                                   v1::SampleResponse* response) override;
  grpc::ServerBidiReactor<v1::SampleRequest, v1::SampleResponse>* SampleStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context,
                                   const v1::VerifyRequest* request,
                                   v1::VerifyResponse* response) override;
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* context,
                                           const v1::RegisterRegionRequest* request,
                                           v1::RegisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* context,
                                             const v1::UnregisterRegionRequest* request,
                                             v1::UnregisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* context,
                                        const v1::ListRegionsRequest* request,
                                        v1::ListRegionsResponse* response) override;

 private:
  // nullptr when the call may proceed, else a reactor already finished with
  // UNAUTHENTICATED.
  grpc::ServerUnaryReactor* RefuseUnary(grpc::CallbackServerContext* context) const;

  v1::Sampler::CallbackService* const inner_;
  const BearerTokenAuth* const auth_;
};

}  // namespace flashsampler
