// FS_HOST_DEVICE marks inline functions that compile for the host and, under
// nvcc, for the device too. Headers using it stay plain C++ for host compilers.
#pragma once

#if defined(__CUDACC__)
#define FS_HOST_DEVICE __host__ __device__
#define FS_FORCE_INLINE __forceinline__
#else
#define FS_HOST_DEVICE
#define FS_FORCE_INLINE inline __attribute__((always_inline))
#endif
