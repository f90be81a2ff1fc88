#include "server/security/authenticated_sampler_service.h"

#include <utility>

#include "server/api/status_mapping.h"

namespace flashsampler {
namespace {

// Ends a refused stream before reading anything; deletes itself when gRPC is done.
class RefusedStream final : public grpc::ServerBidiReactor<v1::SampleRequest, v1::SampleResponse> {
 public:
  explicit RefusedStream(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

AuthenticatedSamplerService::AuthenticatedSamplerService(v1::Sampler::CallbackService* inner,
                                                         const BearerTokenAuth* auth)
    : inner_(inner), auth_(auth) {}

grpc::ServerUnaryReactor* AuthenticatedSamplerService::RefuseUnary(
    grpc::CallbackServerContext* context) const {
  const absl::Status status = auth_->Check(context->client_metadata());
  if (status.ok()) return nullptr;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* AuthenticatedSamplerService::Sample(grpc::CallbackServerContext* context,
                                                              const v1::SampleRequest* request,
                                                              v1::SampleResponse* response) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnary(context)) return refused;
  return inner_->Sample(context, request, response);
}

grpc::ServerBidiReactor<v1::SampleRequest, v1::SampleResponse>*
AuthenticatedSamplerService::SampleStream(grpc::CallbackServerContext* context) {
  const absl::Status status = auth_->Check(context->client_metadata());
  if (!status.ok()) return new RefusedStream(ToGrpcStatus(status));
  return inner_->SampleStream(context);
}

grpc::ServerUnaryReactor* AuthenticatedSamplerService::GetModelInfo(
    grpc::CallbackServerContext* context, const v1::GetModelInfoRequest* request,
    v1::ModelInfo* response) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnary(context)) return refused;
  return inner_->GetModelInfo(context, request, response);
}

grpc::ServerUnaryReactor* AuthenticatedSamplerService::Verify(grpc::CallbackServerContext* context,
                                                              const v1::VerifyRequest* request,
                                                              v1::VerifyResponse* response) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnary(context)) return refused;
  return inner_->Verify(context, request, response);
}

grpc::ServerUnaryReactor* AuthenticatedSamplerService::RegisterRegion(
    grpc::CallbackServerContext* context, const v1::RegisterRegionRequest* request,
    v1::RegisterRegionResponse* response) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnary(context)) return refused;
  return inner_->RegisterRegion(context, request, response);
}

grpc::ServerUnaryReactor* AuthenticatedSamplerService::UnregisterRegion(
    grpc::CallbackServerContext* context, const v1::UnregisterRegionRequest* request,
    v1::UnregisterRegionResponse* response) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnary(context)) return refused;
  return inner_->UnregisterRegion(context, request, response);
}

grpc::ServerUnaryReactor* AuthenticatedSamplerService::ListRegions(
    grpc::CallbackServerContext* context, const v1::ListRegionsRequest* request,
    v1::ListRegionsResponse* response) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnary(context)) return refused;
  return inner_->ListRegions(context, request, response);
}

}  // namespace flashsampler
