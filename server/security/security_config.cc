#include "server/security/security_config.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <utility>
#include <vector>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/credential_files.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the server; with --tls_key turns TLS on");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; when set, clients must present a certificate it signed (mTLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding a bearer token (trimmed); when set, every Sampler call must carry "
          "'authorization: Bearer <token>' (health and reflection stay open)");
ABSL_FLAG(int32_t, credentials_refresh_s, 60,
          "Seconds between re-reads of --tls_cert, --tls_key, --tls_client_ca and --auth_token_file "
          "while serving (replace them atomically: a rename, or a Kubernetes Secret volume); "
          "0 reads them once, at start");
ABSL_FLAG(std::string, health_address, "",
          "HOST:PORT of a plaintext listener serving only grpc.health.v1 (for probes when TLS is on)");

namespace flashsampler {
namespace {

struct BioDeleter { void operator()(BIO* b) const { BIO_free(b); } };
struct X509Deleter { void operator()(X509* x) const { X509_free(x); } };
struct KeyDeleter { void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); } };
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;

std::unique_ptr<BIO, BioDeleter> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM bundle, or InvalidArgument naming the flag.
absl::StatusOr<X509Ptr> FirstCertificate(const std::string& pem, const std::string& flag) {
  auto bio = MemoryBio(pem);
  X509Ptr cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": no PEM certificate in the file"));
  }
  return cert;
}

// A PEM file that holds at least one certificate.
absl::StatusOr<std::string> ReadCertificateFile(const std::string& path, const std::string& flag) {
  absl::StatusOr<std::string> pem = ReadCredentialFile(path, flag);
  if (!pem.ok()) return pem.status();
  absl::StatusOr<X509Ptr> cert = FirstCertificate(*pem, flag);
  if (!cert.ok()) return cert.status();
  return pem;
}

}  // namespace

std::string SecurityConfig::Describe() const {
  std::vector<std::string> parts;
  parts.push_back(tls ? (mtls ? "mTLS" : "TLS") : "plaintext");
  if (auth_token.has_value()) parts.push_back("bearer token");
  if (!health_address.empty()) parts.push_back(absl::StrCat("plaintext health on ", health_address));
  return absl::StrJoin(parts, ", ");
}

SecurityOptions SecurityOptionsFromFlags() {
  SecurityOptions o;
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  o.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  o.health_address = absl::GetFlag(FLAGS_health_address);
  o.credentials_refresh_s = absl::GetFlag(FLAGS_credentials_refresh_s);
  return o;
}

absl::StatusOr<SecurityConfig> LoadSecurityConfig(const SecurityOptions& options) {
  SecurityConfig config;
  config.health_address = options.health_address;
  if (options.credentials_refresh_s < 0) {
    return absl::InvalidArgumentError("--credentials_refresh_s must be >= 0");
  }
  config.credentials_refresh = absl::Seconds(options.credentials_refresh_s);
  config.auth_token_file = options.auth_token_file;
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadBearerToken(options.auth_token_file, "auth_token_file");
    if (!token.ok()) return token.status();
    config.auth_token = *std::move(token);
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  if (options.tls_cert.empty()) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    }
    config.credentials = grpc::InsecureServerCredentials();
    return config;
  }

  absl::StatusOr<std::string> cert_pem = ReadCredentialFile(options.tls_cert, "tls_cert");
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<X509Ptr> cert = FirstCertificate(*cert_pem, "tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key_pem = ReadCredentialFile(options.tls_key, "tls_key");
  if (!key_pem.ok()) return key_pem.status();
  auto key_bio = MemoryBio(*key_pem);
  KeyPtr key(key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (key == nullptr) {
    return absl::InvalidArgumentError("--tls_key: no unencrypted PEM private key in the file");
  }
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    return absl::InvalidArgumentError("--tls_key does not match the certificate in --tls_cert");
  }

  std::string ca_pem;
  if (!options.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadCertificateFile(options.tls_client_ca, "tls_client_ca");
    if (!ca.ok()) return ca.status();
    ca_pem = *std::move(ca);
    config.mtls = true;
  }
  // gRPC's TLS credentials with a certificate provider: the files as read
  // here, or, with a refresh interval, gRPC's own watcher of the files, which
  // re-reads them every interval and serves new handshakes with what it
  // found (connections already open keep theirs).
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (options.credentials_refresh_s > 0) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        options.tls_key, options.tls_cert, options.tls_client_ca,
        static_cast<unsigned int>(options.credentials_refresh_s));
  } else {
    provider = std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
        ca_pem, std::vector<grpc::experimental::IdentityKeyCertPair>{
                    {*std::move(key_pem), *std::move(cert_pem)}});
  }
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (config.mtls) {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  config.credentials = grpc::experimental::TlsServerCredentials(tls);
  config.tls = true;
  return config;
}

}  // namespace flashsampler
