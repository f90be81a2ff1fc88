#include "server/engine/cuda_call_status.h"

#include "absl/strings/str_cat.h"

namespace flashsampler {

absl::Status CudaCallStatus(absl::string_view what, cudaError_t err) {
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: later calls on this thread must not see it
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

}  // namespace flashsampler
