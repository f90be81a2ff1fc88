#include "server/security/header_token_check.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace flashsampler {
namespace {

using Headers = std::vector<std::pair<std::string, std::string>>;

// The processor's outcome for a call carrying `headers` (the strings outlive
// the string_refs).
grpc::StatusCode Process(HeaderTokenCheck& check, const Headers& headers) {
  grpc::AuthMetadataProcessor::InputMetadata metadata;
  for (const auto& [key, value] : headers) metadata.emplace(key, value);
  grpc::AuthMetadataProcessor::OutputMetadata consumed, response;
  const grpc::Status status = check.Process(metadata, nullptr, &consumed, &response);
  EXPECT_TRUE(consumed.empty()) << "the header must stay for the service's own check";
  return status.error_code();
}

TEST(HeaderTokenCheck, EveryCallButHealthNeedsTheTokenOnItsHeaders) {
  BearerTokenAuth auth("tok-1");
  HeaderTokenCheck check(&auth);
  EXPECT_FALSE(check.IsBlocking());
  for (const char* path : {"/flashsampler.v1.Sampler/Sample", "/flashsampler.v1.Sampler/SampleStream",
                           "/flashsampler.v1.Sampler/Verify", "/flashsampler.v1.Sampler/RegisterRegion",
                           "/flashsampler.v1.Sampler/NoSuchMethod",
                           "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                           "/flashsampler.v1.Sampler", "/grpc.health.v1.Healthy/Check", "/other.Service/Call"}) {
    SCOPED_TRACE(path);
    EXPECT_EQ(Process(check, Headers{{":path", path}}), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Process(check, Headers{{":path", path}, {"authorization", "Bearer tok-2"}}),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Process(check, Headers{{":path", path}, {"authorization", "Bearer tok-1"}}), grpc::StatusCode::OK);
  }
  // A call without a path.
  EXPECT_EQ(Process(check, Headers{{"authorization", "Bearer tok-1"}}), grpc::StatusCode::UNAUTHENTICATED);
}

TEST(HeaderTokenCheck, HealthStaysOpen) {
  BearerTokenAuth auth("tok-1");
  HeaderTokenCheck check(&auth);
  for (const char* path : {"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"}) {
    EXPECT_EQ(Process(check, Headers{{":path", path}}), grpc::StatusCode::OK) << path;
  }
}

TEST(HeaderTokenCheck, FollowsARotatedToken) {
  BearerTokenAuth auth("old");
  HeaderTokenCheck check(&auth);
  const Headers old_token{{":path", "/flashsampler.v1.Sampler/Sample"}, {"authorization", "Bearer old"}};
  const Headers new_token{{":path", "/flashsampler.v1.Sampler/Sample"}, {"authorization", "Bearer new"}};
  EXPECT_EQ(Process(check, old_token), grpc::StatusCode::OK);
  auth.Replace("new");
  EXPECT_EQ(Process(check, old_token), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Process(check, new_token), grpc::StatusCode::OK);
}

}  // namespace
}  // namespace flashsampler
