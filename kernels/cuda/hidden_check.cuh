// Device halves of hidden_check.h: the ride-along copy and the last block's
// report, for the kernels that check hidden states (hidden_states.cu, and the
// fused sampler's first kernel in fused_sample_mma.cu).
//
// Why one report is enough: every block counts itself done with one
// atomicAdd after a __threadfence, so the block that draws the last ticket
// sees every other block's atomicMin on first_bad; it moves the index to the
// host's word (one 8-byte store over the bus) and puts the two device words
// back to their start values for the next launch.
#pragma once

#include <cstdint>

#include "kernels/cuda/hidden_check.h"

namespace flashsampler::kernels::cuda_internal {

// RideAlongCopy's words, grid-stride (a launch has at least `words` threads
// or strides over them).
__device__ __forceinline__ void CopyRideAlong(const uint32_t* ride_src, uint32_t* ride_dst, int64_t words) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < words; w += stride) {
    ride_dst[w] = ride_src[w];
  }
}

// With a host word to report to (blocks_done != null): the block counts
// itself done, and the last one reports and resets. Every thread of the
// block calls it, after its own atomicMin (it has a __syncthreads).
__device__ __forceinline__ void ReportWhenLast(unsigned long long* first_bad, unsigned int* blocks_done,
                                               unsigned long long* first_bad_host) {
  if (blocks_done == nullptr) return;
  __syncthreads();  // every thread of the block has made its atomicMin
  if (threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(blocks_done, 1u) != gridDim.x - 1) return;
  __threadfence();
  *reinterpret_cast<volatile unsigned long long*>(first_bad_host) = atomicExch(first_bad, kNoBadHiddenElement);
  atomicExch(blocks_done, 0u);
}

}  // namespace flashsampler::kernels::cuda_internal
