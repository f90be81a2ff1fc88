#include "server/api/status_mapping.h"

#include "gtest/gtest.h"

namespace flashsampler {
namespace {

TEST(StatusMapping, OkStaysOk) { EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok()); }

TEST(StatusMapping, CodesAndMessagesCarryOver) {
  struct Case {
    absl::Status in;
    grpc::StatusCode out;
  } cases[] = {
      {absl::InvalidArgumentError("bad shape"), grpc::StatusCode::INVALID_ARGUMENT},
      {absl::ResourceExhaustedError("queue full"), grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::UnavailableError("loading"), grpc::StatusCode::UNAVAILABLE},
      {absl::InternalError("cuda"), grpc::StatusCode::INTERNAL},
      {absl::DeadlineExceededError("late"), grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::NotFoundError("tensor"), grpc::StatusCode::NOT_FOUND},
      {absl::UnauthenticatedError("token"), grpc::StatusCode::UNAUTHENTICATED},
  };
  for (const Case& c : cases) {
    grpc::Status s = ToGrpcStatus(c.in);
    EXPECT_EQ(s.error_code(), c.out) << c.in;
    EXPECT_EQ(s.error_message(), std::string(c.in.message()));
  }
}

}  // namespace
}  // namespace flashsampler
