#include "client/channel_security.h"

#include <utility>

#include "absl/status/status.h"
#include "client/credential_files.h"

namespace flashsampler {

void ChannelSecurity::Apply(grpc::ClientContext* context) const {
  if (!authorization.empty()) context->AddMetadata("authorization", authorization);
}

absl::StatusOr<ChannelSecurity> LoadChannelSecurity(const ChannelSecurityOptions& options) {
  ChannelSecurity security;
  security.tls_server_name = options.tls_server_name;
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadBearerToken(options.auth_token_file, "auth_token_file");
    if (!token.ok()) return token.status();
    security.authorization = BearerAuthorization(*token);
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  if (options.tls_ca.empty() && options.tls_cert.empty()) {
    if (!options.tls_server_name.empty()) {
      return absl::InvalidArgumentError("--tls_server_name needs TLS (--tls_ca)");
    }
    return security;
  }
  grpc::SslCredentialsOptions ssl;
  // Without --tls_ca, gRPC verifies against the system's default roots.
  if (!options.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadCredentialFile(options.tls_ca, "tls_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!options.tls_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadCredentialFile(options.tls_cert, "tls_cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadCredentialFile(options.tls_key, "tls_key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  security.credentials = grpc::SslCredentials(ssl);
  return security;
}

std::shared_ptr<grpc::Channel> MakeSecureChannel(const std::string& address,
                                                 const ChannelSecurity& security,
                                                 grpc::ChannelArguments args) {
  if (!security.tls_server_name.empty()) args.SetSslTargetNameOverride(security.tls_server_name);
  args.SetServiceConfigJSON(kClientServiceConfig);
  return grpc::CreateCustomChannel(address, security.credentials, args);
}

}  // namespace flashsampler
