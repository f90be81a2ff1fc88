// CudaCallStatus: out of memory is ResourceExhausted (the engine stays
// healthy), any other CUDA error Internal (the engine reports the device
// failed). Needs the CUDA runtime library only, not a GPU.
#include "server/engine/cuda_call_status.h"

#include <string>

#include "gtest/gtest.h"

namespace flashsampler {
namespace {

TEST(CudaCallStatus, OutOfMemoryIsResourceExhaustedAndOtherErrorsAreInternal) {
  const absl::Status oom = CudaCallStatus("cudaMalloc(&controls, 1 << 40)", cudaErrorMemoryAllocation);
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(oom.message()).find("cudaMalloc(&controls, 1 << 40): cudaErrorMemoryAllocation"),
            std::string::npos)
      << oom;
  for (cudaError_t err : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorInvalidValue}) {
    EXPECT_EQ(CudaCallStatus("a call", err).code(), absl::StatusCode::kInternal) << cudaGetErrorName(err);
  }
}

}  // namespace
}  // namespace flashsampler
