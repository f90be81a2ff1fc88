// KernelStatus: the outcome of a kernel launcher in kernels/.
//
// Kernels know nothing of absl or gRPC; they return one of these codes and the
// server maps it once to absl::Status. Plain enum, safe to copy anywhere.
#pragma once

namespace flashsampler::kernels {

enum class KernelStatus : int {
  kOk = 0,
  kInvalidArgument = 1,  // a size, pointer or parameter the launcher rejects
  kOutOfMemory = 2,      // scratch or device memory could not be allocated
  kDeviceError = 3,      // the device (CUDA, NCCL) reported an error
  kInternal = 4,         // a broken invariant inside the kernel library
  kFailedPrecondition = 5,  // a row with controls has no token with a finite logit left
};

inline const char* KernelStatusName(KernelStatus s) {
  switch (s) {
    case KernelStatus::kOk: return "ok";
    case KernelStatus::kInvalidArgument: return "invalid argument";
    case KernelStatus::kOutOfMemory: return "out of memory";
    case KernelStatus::kDeviceError: return "device error";
    case KernelStatus::kInternal: return "internal error";
    case KernelStatus::kFailedPrecondition: return "no token left to sample";
  }
  return "unknown";
}

}  // namespace flashsampler::kernels
