#include "client/channel_security_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA that signs the server certificate; turns TLS on");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate chain for mTLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name to check the server certificate against (default: the host of --address)");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the bearer token sent as 'authorization: Bearer <token>'");

namespace flashsampler {

ChannelSecurityOptions ChannelSecurityOptionsFromFlags() {
  ChannelSecurityOptions o;
  o.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  return o;
}

}  // namespace flashsampler
