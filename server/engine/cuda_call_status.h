// CudaCallStatus: the absl::Status of a failed CUDA runtime call, one mapping
// for every CUDA engine file (CUDA builds only).
//
// What each outcome means to the engines: out of memory
// (cudaErrorMemoryAllocation) is ResourceExhausted. It leaves the context
// usable, so the call's error is cleared from the thread's last error, and the
// engine stays healthy: a buffer allocated while serving (controls grown for
// a larger batch, say) that does not fit fails that batch, not the server.
// Any other error is Internal, which the engines read as "the device failed"
// and report unhealthy.
//
// Thread safety: a pure function of its arguments (it clears the calling
// thread's CUDA error only).
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace flashsampler {

absl::Status CudaCallStatus(absl::string_view what, cudaError_t err);

}  // namespace flashsampler
