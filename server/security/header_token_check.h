// HeaderTokenCheck: the bearer token checked on a call's headers, before
// gRPC reads its request message, on a TLS port: every call but health's.
//
// Why: AuthenticatedSamplerService checks the token when gRPC hands the
// server a whole request, and gRPC 1.51 buffers a unary call's message in
// full before that (up to the length its 5-byte prefix announces, about
// 4 GiB, whatever the receive limit), so a caller without a token could
// make the server hold memory by never finishing its messages. gRPC runs an
// AuthMetadataProcessor on the headers of every call of a secure port,
// before the message: a call without the token then ends with
// UNAUTHENTICATED and its stream is closed at once. Only grpc.health.v1
// stays open (probes carry no token), and so does its exposure: its unary
// Check is read whole before any handler (docs/limits.md). Reflection needs
// the token here (its stream would read messages unchecked). gRPC's C++ API
// takes a processor on secure credentials only, so a plaintext port keeps
// the message-time check alone.
//
// Thread safety: Process runs on gRPC's threads, any number at once; it
// calls BearerTokenAuth::Check, which is thread-safe (and follows Replace).
// Outcomes: OK for health calls and for calls that carry the token;
// UNAUTHENTICATED (the Check's message) otherwise, and for a call without a
// :path header.
#pragma once

#include <grpcpp/security/auth_metadata_processor.h>

#include "server/security/bearer_token_auth.h"

namespace flashsampler {

class HeaderTokenCheck final : public grpc::AuthMetadataProcessor {
 public:
  // `auth` is not owned and must outlive the gRPC server.
  explicit HeaderTokenCheck(const BearerTokenAuth* auth) : auth_(auth) {}

  // A token compare: cheap enough for gRPC's own thread.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata, OutputMetadata* response_metadata) override;

 private:
  const BearerTokenAuth* const auth_;
};

}  // namespace flashsampler
