// The one place where internal absl::Status values become grpc::Status at the
// service edge. absl and gRPC share the canonical code numbering, so the code
// is carried over as is and the message verbatim.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace flashsampler {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace flashsampler
