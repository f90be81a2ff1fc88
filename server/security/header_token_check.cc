#include "server/security/header_token_check.h"

#include <string_view>

namespace flashsampler {
namespace {

constexpr std::string_view kSamplerPrefix = "/flashsampler.v1.Sampler/";

}  // namespace

grpc::Status HeaderTokenCheck::Process(const InputMetadata& auth_metadata, grpc::AuthContext* /*context*/,
                                       OutputMetadata* /*consumed_auth_metadata*/,
                                       OutputMetadata* /*response_metadata*/) {
  // The :path pseudo-header is among the metadata gRPC hands a processor
  // (every HTTP/2 request has one); without it nothing says the call is
  // not a Sampler call, so it needs the token.
  const auto path = auth_metadata.find(":path");
  if (path == auth_metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "a call without a :path header");
  }
  const std::string_view name(path->second.data(), path->second.size());
  if (name.substr(0, kSamplerPrefix.size()) != kSamplerPrefix) return grpc::Status::OK;
  // The header stays in the metadata (nothing is consumed), so
  // AuthenticatedSamplerService checks it again when the call arrives.
  const absl::Status status = auth_->Check(auth_metadata);
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(status.message()));
}

}  // namespace flashsampler
