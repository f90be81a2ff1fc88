#include "server/security/header_token_check.h"

#include <string_view>

namespace flashsampler {
namespace {

// The one service a caller without the token may reach: probes.
constexpr std::string_view kHealthPrefix = "/grpc.health.v1.Health/";

}  // namespace

grpc::Status HeaderTokenCheck::Process(const InputMetadata& auth_metadata, grpc::AuthContext* /*context*/,
                                       OutputMetadata* /*consumed_auth_metadata*/,
                                       OutputMetadata* /*response_metadata*/) {
  // The :path pseudo-header is among the metadata gRPC hands a processor
  // (every HTTP/2 request has one); a call without one needs the token.
  const auto path = auth_metadata.find(":path");
  if (path == auth_metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "a call without a :path header");
  }
  const std::string_view name(path->second.data(), path->second.size());
  if (name.substr(0, kHealthPrefix.size()) == kHealthPrefix) return grpc::Status::OK;
  // The header stays in the metadata (nothing is consumed), so
  // AuthenticatedSamplerService checks a Sampler call again when it arrives.
  const absl::Status status = auth_->Check(auth_metadata);
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(status.message()));
}

}  // namespace flashsampler
