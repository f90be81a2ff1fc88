#include "server/security/bearer_token_auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace flashsampler {
namespace {

std::array<unsigned char, 32> Sha256(absl::string_view text) {
  std::array<unsigned char, 32> digest;
  static_assert(SHA256_DIGEST_LENGTH == 32);
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
  return digest;
}

}  // namespace

BearerTokenAuth::BearerTokenAuth(const std::string& token) : token_digest_(Sha256(token)) {}

void BearerTokenAuth::Replace(const std::string& token) {
  const std::array<unsigned char, 32> digest = Sha256(token);
  absl::MutexLock lock(&mu_);
  token_digest_ = digest;
}

absl::Status BearerTokenAuth::Check(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  // gRPC lower-cases metadata keys on the wire. A repeated header is refused:
  // which copy a proxy would honour is ambiguous.
  if (metadata.count("authorization") != 1) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  }
  const grpc::string_ref value = metadata.find("authorization")->second;
  absl::string_view header(value.data(), value.size());
  constexpr absl::string_view kScheme = "bearer ";  // RFC 6750: the scheme is case-insensitive
  if (header.size() <= kScheme.size() || !absl::EqualsIgnoreCase(header.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError("the authorization metadata is not a Bearer token");
  }
  const std::array<unsigned char, 32> presented =
      Sha256(absl::StripAsciiWhitespace(header.substr(kScheme.size())));
  std::array<unsigned char, 32> expected;
  {
    absl::ReaderMutexLock lock(&mu_);
    expected = token_digest_;
  }
  if (CRYPTO_memcmp(presented.data(), expected.data(), presented.size()) != 0) {
    return absl::UnauthenticatedError("invalid bearer token");
  }
  return absl::OkStatus();
}

}  // namespace flashsampler
