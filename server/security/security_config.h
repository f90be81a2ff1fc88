// SecurityConfig: the server's transport security and authentication, from
// --tls_cert, --tls_key, --tls_client_ca, --auth_token_file and --health_address.
//
// - TLS when --tls_cert and --tls_key are set (both or neither);
// - mTLS when --tls_client_ca is also set: clients must present a certificate
//   that this CA signed, else the handshake fails (UNAVAILABLE for them);
// - a bearer token when --auth_token_file is set (see BearerTokenAuth);
// - --health_address: a second, plaintext listener that serves only
//   grpc.health.v1, for Kubernetes probes that cannot speak TLS.
//
// LoadSecurityConfig reads every file and checks that the certificate, key
// and CA parse and that the key belongs to the certificate, so a mistake is
// an InvalidArgument naming the flag at start-up rather than failed
// handshakes later. Call from one thread at start-up; the result is immutable.
//
// Rotation (--credentials_refresh_s, default 60 s; 0: read once): the TLS
// credentials come from gRPC's FileWatcherCertificateProvider, which re-reads
// the certificate, key and CA every interval, so new handshakes get the
// files' current contents; the token file is followed by TokenFileWatcher
// (token_file_watcher.h), which the server starts. Files must be replaced
// atomically (a rename, or a Kubernetes Secret volume's symlink swap): TLS
// files read while wrong (a certificate beside the previous key, a
// truncated PEM) fail every new handshake until the next read finds them
// right; missing ones keep the current credentials.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace flashsampler {

struct SecurityOptions {
  std::string tls_cert = {};         // PEM certificate chain of the server
  std::string tls_key = {};          // PEM private key of tls_cert
  std::string tls_client_ca = {};    // PEM CA for client certificates; set: mTLS
  std::string auth_token_file = {};  // bearer token file; empty: no token check
  std::string health_address = {};   // HOST:PORT of the plaintext health-only port; empty: none
  int credentials_refresh_s = 60;    // >= 0; 0: the files are read once
};

struct SecurityConfig {
  std::shared_ptr<grpc::ServerCredentials> credentials;  // insecure without TLS
  bool tls = false;
  bool mtls = false;
  std::optional<std::string> auth_token;  // set: every Sampler call needs it
  std::string auth_token_file;            // where auth_token came from
  absl::Duration credentials_refresh;     // zero: the files are not re-read
  std::string health_address;

  // One line for the start-up log (never the token): "TLS, mTLS, bearer token".
  std::string Describe() const;
};

SecurityOptions SecurityOptionsFromFlags();
absl::StatusOr<SecurityConfig> LoadSecurityConfig(const SecurityOptions& options);

}  // namespace flashsampler
