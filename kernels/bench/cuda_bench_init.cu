// Device-side input generation for the CUDA kernel bench: a 2 GB LM head is
// filled in milliseconds instead of the minutes a host RNG would take.
// N(0, 1) values come from a counter hash (splitmix64 of seed and index) and
// Box-Muller; they are benchmark inputs, not part of any sampling contract.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/bench/cuda_bench.h"

namespace flashsampler::kernels::bench {
namespace {

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ float StandardNormal(uint64_t seed, uint64_t i) {
  const uint64_t bits = SplitMix64(seed * 0xD1B54A32D192ED03ull ^ SplitMix64(i));
  // Two 24-bit uniforms; u1 in (0, 1] so log(u1) is finite.
  const float u1 = (static_cast<float>(bits >> 40) + 1.0f) * 0x1p-24f;
  const float u2 = static_cast<float>((bits >> 8) & 0xFFFFFFull) * 0x1p-24f;
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

__global__ void FillBf16Kernel(__nv_bfloat16* out, size_t n, float scale, uint64_t seed) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(scale * StandardNormal(seed, i));
  }
}

__global__ void FillFloatBf16Kernel(float* out, size_t n, float scale, uint64_t seed) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __bfloat162float(__float2bfloat16_rn(scale * StandardNormal(seed, i)));
  }
}

__global__ void CastKernel(const float* in, __nv_bfloat16* out, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

unsigned Blocks(size_t n) {
  const size_t needed = (n + 255) / 256;
  return static_cast<unsigned>(needed < 8192 ? (needed > 0 ? needed : 1) : 8192);
}

int Status() { return cudaGetLastError() == cudaSuccess ? 0 : 1; }

}  // namespace

int FillNormalBf16(void* out, size_t n, float scale, uint64_t seed, void* stream) {
  FillBf16Kernel<<<Blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<__nv_bfloat16*>(out), n, scale, seed);
  return Status();
}

int FillNormalFloatBf16Exact(float* out, size_t n, float scale, uint64_t seed, void* stream) {
  FillFloatBf16Kernel<<<Blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(out, n, scale,
                                                                                 seed);
  return Status();
}

int CastFloatToBf16(const float* in, void* out, size_t n, void* stream) {
  CastKernel<<<Blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      in, static_cast<__nv_bfloat16*>(out), n);
  return Status();
}

}  // namespace flashsampler::kernels::bench
