// ChannelSecurity: how a client reaches a flashsampler-server that runs with
// TLS, mTLS and/or a bearer token: the channel credentials to dial with and
// the `authorization` metadata to attach to every Sampler call.
//
// LoadChannelSecurity reads the files named in the options once; every
// problem (missing or unreadable file, a key without a certificate) is
// InvalidArgument naming the flag. The result is immutable and may be shared
// by any number of threads and channels.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"

namespace flashsampler {

struct ChannelSecurityOptions {
  std::string tls_ca = {};           // PEM roots that sign the server certificate; any TLS option turns TLS on
  std::string tls_cert = {};         // PEM client certificate chain, for mTLS (needs tls_key)
  std::string tls_key = {};          // PEM private key of tls_cert
  std::string tls_server_name = {};  // name checked against the server certificate; empty: the dialled host
  std::string auth_token_file = {};  // bearer token file; empty: no token
};

struct ChannelSecurity {
  // Insecure (plaintext) unless a TLS option was given.
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  std::string tls_server_name;
  std::string authorization;  // "Bearer <token>", or empty for none

  // Adds the authorization metadata (when there is a token) to a call.
  void Apply(grpc::ClientContext* context) const;
};

absl::StatusOr<ChannelSecurity> LoadChannelSecurity(const ChannelSecurityOptions& options);

// The service config every client channel gets: round_robin over all the
// addresses the target resolves to (a "dns:///" name of a Kubernetes headless
// service, or "ipv4:HOST:PORT,HOST:PORT"), so calls spread over the servers
// behind one name instead of all riding gRPC's default pick_first connection.
// With one address it is one connection, as before.
inline constexpr char kClientServiceConfig[] = R"({"loadBalancingConfig": [{"round_robin": {}}]})";

// A channel to `address` with `security` and `args` (the server-name override
// and kClientServiceConfig are added).
std::shared_ptr<grpc::Channel> MakeSecureChannel(const std::string& address,
                                                 const ChannelSecurity& security,
                                                 grpc::ChannelArguments args);

}  // namespace flashsampler
