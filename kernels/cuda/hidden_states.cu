// Widening hidden states on the device (contract in hidden_states.h).
//
// Why it is exact: the host path widens bf16 / fp16 with Bf16ToFloat /
// Fp16ToFloat (exact: every 16-bit value is an fp32 value) and rounds to the
// weights' dtype with FloatToBf16 / FloatToFp16 (round to nearest even). This
// kernel calls those very functions (FS_HOST_DEVICE), so each output is the
// host's bit for bit; bf16 in, bf16 weights (the usual decode step) is a
// plain widening.
//
// The check sees each element before rounding, in its own dtype: all-ones
// exponent bits are inf or NaN in fp32, bf16 and fp16 alike. A finite value
// can still leave the weights' range when it is rounded to their dtype: fp16
// from |x| >= 65520, and bf16 from |x| >= 0x1.ffp127 (an fp32 value within
// half a bf16 ulp of FLT_MAX; the tie rounds to the even infinity). Both are
// refused, as on the host (RoundHiddenToWeightDType). atomicMin keeps the
// smallest bad index, so the error names the first bad element whatever the
// thread order; the atomic runs only for bad elements, never on a valid
// payload.
//
// Reporting to the host (LaunchWidenHiddenStatesToHost): the launch's last
// block moves the index to the host's word and resets the device words
// (hidden_check.cuh), so neither a reset before the launch nor a copy after
// it is needed.
//
// The serving engine's form also carries the launch's row parameters when
// no other copy would (RideAlongCopy: grid-stride 4-byte words from mapped
// host memory, a few hundred bus reads in flight together), and lets the
// next kernel be scheduled early (griddepcontrol.launch_dependents at the
// top: the rounding kernel that follows waits in the kernel for these
// writes instead of on the stream). Each of the two takes one operation's
// latency off a decode step's critical path.
//
// Cost: memory-bound, one read of the payload and one fp32 write (2 MiB in,
// 4 MiB out at 256 rows of D = 4096 bf16: a few microseconds on an H100).
// When the source may be host memory mapped into the device (a shared-memory
// region read in place), every load crosses the bus as a read request of its
// warp's span: 2-byte loads ask for 64 bytes a warp instruction, 16-byte
// loads for 512. So a 16-byte-aligned source is read 16 bytes a thread
// (WidenVectorsKernel), four loads in flight before any is used; other
// alignments take the element kernel. Both compute each element with the same
// LoadWidened and RoundWidened, so the bits do not depend on the path.
#include "kernels/cuda/hidden_states.h"

#include "kernels/common/half_precision.h"
#include "kernels/cuda/hidden_check.cuh"
#include "kernels/cuda/sample_reduce.cuh"

namespace flashsampler::kernels {
namespace {

constexpr int kWidenThreads = 256;
// Elements per thread per grid-stride step: enough independent loads in flight.
constexpr int kWidenUnroll = 4;

template <CudaWeightDType kSrc>
__device__ __forceinline__ float LoadWidened(const void* src, int64_t i, bool* bad) {
  if constexpr (kSrc == CudaWeightDType::kFloat32) {
    const uint32_t bits = FloatToBits(static_cast<const float*>(src)[i]);
    *bad = (bits & 0x7f800000u) == 0x7f800000u;
    return BitsToFloat(bits);
  } else if constexpr (kSrc == CudaWeightDType::kBFloat16) {
    const uint16_t bits = static_cast<const uint16_t*>(src)[i];
    *bad = (bits & 0x7f80u) == 0x7f80u;
    return Bf16ToFloat(bits);
  } else {
    const uint16_t bits = static_cast<const uint16_t*>(src)[i];
    *bad = (bits & 0x7c00u) == 0x7c00u;
    return Fp16ToFloat(bits);
  }
}

// One element after widening: rounded to the weights' dtype, and whether it
// is refused (*bad, already set for a non-finite source value).
template <CudaWeightDType kWeight>
__device__ __forceinline__ float RoundWidened(float v, bool* bad) {
  if constexpr (kWeight == CudaWeightDType::kFloat32) {
    return v;
  } else {
    v = kWeight == CudaWeightDType::kBFloat16 ? Bf16ToFloat(FloatToBf16(v)) : Fp16ToFloat(FloatToFp16(v));
    *bad = *bad || (FloatToBits(v) & 0x7fffffffu) == 0x7f800000u;  // finite, rounded to inf
    return v;
  }
}

template <CudaWeightDType kSrc, CudaWeightDType kWeight>
__device__ __forceinline__ void WidenElement(const void* src, int64_t i, float* dst,
                                             unsigned long long* first_bad) {
  bool bad = false;
  const float v = RoundWidened<kWeight>(LoadWidened<kSrc>(src, i, &bad), &bad);
  dst[i] = v;
  if (bad) atomicMin(first_bad, static_cast<unsigned long long>(i));
}

using cuda_internal::CopyRideAlong;
using cuda_internal::ReportWhenLast;

template <CudaWeightDType kSrc, CudaWeightDType kWeight>
__global__ void __launch_bounds__(kWidenThreads)
    WidenHiddenStatesKernel(const void* __restrict__ src, int64_t count, float* __restrict__ dst,
                            unsigned long long* first_bad, unsigned int* blocks_done,
                            unsigned long long* first_bad_host, const uint32_t* ride_src,
                            uint32_t* ride_dst, int64_t ride_words) {
  if (blocks_done != nullptr) cuda_internal::AllowDependentLaunch();
  CopyRideAlong(ride_src, ride_dst, ride_words);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; base < count;
       base += stride * kWidenUnroll) {
#pragma unroll
    for (int u = 0; u < kWidenUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i >= count) break;
      WidenElement<kSrc, kWeight>(src, i, dst, first_bad);
    }
  }
  ReportWhenLast(first_bad, blocks_done, first_bad_host);
}

// Elements of a 16-byte vector of the source dtype.
__host__ __device__ constexpr int VectorElements(CudaWeightDType src) { return src == CudaWeightDType::kFloat32 ? 4 : 8; }

// src and dst 16-byte aligned: vector v holds elements [v * kN, v * kN + kN),
// read with one 16-byte load and written with kN / 4 float4 stores; the
// count % kN elements past the last whole vector go one a thread. Within a
// vector the smallest bad index is the one offered to atomicMin, so
// *first_bad ends the same as the element kernel's.
template <CudaWeightDType kSrc, CudaWeightDType kWeight>
__global__ void __launch_bounds__(kWidenThreads)
    WidenVectorsKernel(const uint4* __restrict__ src, int64_t count, float* __restrict__ dst,
                       unsigned long long* first_bad, unsigned int* blocks_done,
                       unsigned long long* first_bad_host, const uint32_t* ride_src, uint32_t* ride_dst,
                       int64_t ride_words) {
  if (blocks_done != nullptr) cuda_internal::AllowDependentLaunch();
  CopyRideAlong(ride_src, ride_dst, ride_words);
  constexpr int kN = VectorElements(kSrc);
  const int64_t vectors = count / kN;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t base = first; base < vectors; base += stride * kWidenUnroll) {
    uint4 raw[kWidenUnroll];
#pragma unroll
    for (int u = 0; u < kWidenUnroll; ++u) {
      const int64_t v = base + u * stride;
      raw[u] = v < vectors ? src[v] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kWidenUnroll; ++u) {
      const int64_t v = base + u * stride;
      if (v >= vectors) break;
      float out[kN];
      int bad_at = kN;
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        bool bad = false;
        out[j] = RoundWidened<kWeight>(LoadWidened<kSrc>(&raw[u], j, &bad), &bad);
        bad_at = bad && bad_at == kN ? j : bad_at;
      }
      float4* to = reinterpret_cast<float4*>(dst + v * kN);
#pragma unroll
      for (int q = 0; q < kN / 4; ++q) {
        to[q] = make_float4(out[4 * q], out[4 * q + 1], out[4 * q + 2], out[4 * q + 3]);
      }
      if (bad_at < kN) atomicMin(first_bad, static_cast<unsigned long long>(v * kN + bad_at));
    }
  }
  const int64_t tail = vectors * kN + first;
  if (tail < count) WidenElement<kSrc, kWeight>(src, tail, dst, first_bad);
  ReportWhenLast(first_bad, blocks_done, first_bad_host);
}

template <CudaWeightDType kSrc, CudaWeightDType kWeight>
void* PickKernel(bool vectors) {
  return vectors ? reinterpret_cast<void*>(&WidenVectorsKernel<kSrc, kWeight>)
                 : reinterpret_cast<void*>(&WidenHiddenStatesKernel<kSrc, kWeight>);
}

template <CudaWeightDType kSrc>
void* PickKernel(CudaWeightDType weight, bool vectors) {
  switch (weight) {
    case CudaWeightDType::kFloat32: return PickKernel<kSrc, CudaWeightDType::kFloat32>(vectors);
    case CudaWeightDType::kFloat16: return PickKernel<kSrc, CudaWeightDType::kFloat16>(vectors);
    case CudaWeightDType::kBFloat16: return PickKernel<kSrc, CudaWeightDType::kBFloat16>(vectors);
  }
  return nullptr;
}

void* PickKernel(CudaWeightDType src, CudaWeightDType weight, bool vectors) {
  switch (src) {
    case CudaWeightDType::kFloat32: return PickKernel<CudaWeightDType::kFloat32>(weight, vectors);
    case CudaWeightDType::kFloat16: return PickKernel<CudaWeightDType::kFloat16>(weight, vectors);
    case CudaWeightDType::kBFloat16: return PickKernel<CudaWeightDType::kBFloat16>(weight, vectors);
  }
  return nullptr;
}

// One thread, byte by byte: any alignment, a few bytes.
__global__ void CopyDeviceBytesKernel(const unsigned char* __restrict__ src, int bytes,
                                      unsigned char* __restrict__ dst) {
  for (int i = 0; i < bytes; ++i) dst[i] = src[i];
}

}  // namespace

KernelStatus LaunchCopyDeviceBytes(const void* src, int bytes, void* dst, cudaStream_t stream) {
  if (src == nullptr || dst == nullptr || bytes < 1 || bytes > 8) return KernelStatus::kInvalidArgument;
  CopyDeviceBytesKernel<<<1, 1, 0, stream>>>(static_cast<const unsigned char*>(src), bytes,
                                            static_cast<unsigned char*>(dst));
  return cudaGetLastError() == cudaSuccess ? KernelStatus::kOk : KernelStatus::kDeviceError;
}

namespace {

// Both launchers: blocks_done and first_bad_host null for the plain form.
KernelStatus LaunchWiden(const void* src, CudaWeightDType src_dtype, int64_t count,
                         CudaWeightDType weight_dtype, float* dst, unsigned long long* first_bad,
                         unsigned int* blocks_done, unsigned long long* first_bad_host,
                         const RideAlongCopy& ride, cudaStream_t stream, FirstBadReset reset) {
  if (src == nullptr || dst == nullptr || first_bad == nullptr || count < 1) {
    return KernelStatus::kInvalidArgument;
  }
  const bool aligned = reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const int64_t vector_elements = VectorElements(src_dtype);
  // Vectors when aligned and at least one whole vector's worth.
  const bool vectors = aligned && count >= vector_elements;
  void* kernel = PickKernel(src_dtype, weight_dtype, vectors);
  if (kernel == nullptr) return KernelStatus::kInvalidArgument;
  // 0xff bytes: kNoBadHiddenElement.
  if (reset == FirstBadReset::kByLauncher &&
      cudaMemsetAsync(first_bad, 0xff, sizeof(*first_bad), stream) != cudaSuccess) {
    return KernelStatus::kDeviceError;
  }
  // Grid: one element (or 16-byte vector) per thread per unrolled step,
  // capped so a large payload strides (a few waves of 256-thread blocks
  // saturate HBM, or the bus; more blocks only cost scheduling). 1024 blocks
  // x 256 threads x 4 = 1 M elements, or vectors, per pass: 256 rows of
  // D = 4096 in one pass either way. The vector kernel's tail (fewer than one
  // vector's elements) takes its grid's first threads, so its grid covers at
  // least that many threads (one block does).
  const int64_t units = vectors ? count / vector_elements : count;
  const int64_t per_block = static_cast<int64_t>(kWidenThreads) * kWidenUnroll;
  const int64_t blocks = (units + per_block - 1) / per_block;
  const dim3 grid(static_cast<unsigned>(blocks < 1024 ? blocks : 1024));
  const dim3 block(kWidenThreads);
  const uint32_t* ride_src = static_cast<const uint32_t*>(ride.src);
  uint32_t* ride_dst = static_cast<uint32_t*>(ride.dst);
  int64_t ride_words = static_cast<int64_t>(ride.bytes / 4);
  void* args[] = {const_cast<void**>(&src), &count, &dst, &first_bad, &blocks_done, &first_bad_host,
                  &ride_src, &ride_dst, &ride_words};
  if (cudaLaunchKernel(kernel, grid, block, args, 0, stream) != cudaSuccess) {
    return KernelStatus::kDeviceError;
  }
  return KernelStatus::kOk;
}

}  // namespace

KernelStatus LaunchWidenHiddenStates(const void* src, CudaWeightDType src_dtype, int64_t count,
                                     CudaWeightDType weight_dtype, float* dst,
                                     unsigned long long* first_bad, cudaStream_t stream,
                                     FirstBadReset reset) {
  return LaunchWiden(src, src_dtype, count, weight_dtype, dst, first_bad, nullptr, nullptr, RideAlongCopy{},
                     stream, reset);
}

KernelStatus LaunchWidenHiddenStatesToHost(const void* src, CudaWeightDType src_dtype, int64_t count,
                                           CudaWeightDType weight_dtype, float* dst,
                                           const FirstBadToHost& report, cudaStream_t stream,
                                           const RideAlongCopy& ride) {
  const size_t src_bytes = static_cast<size_t>(count) * CudaWeightDTypeBytes(src_dtype);
  if (!ReportAndRideValid(report, ride, {{src, src_bytes}, {dst, static_cast<size_t>(count) * sizeof(float)}})) {
    return KernelStatus::kInvalidArgument;
  }
  return LaunchWiden(src, src_dtype, count, weight_dtype, dst, report.first_bad, report.blocks_done,
                     report.first_bad_host, ride, stream, FirstBadReset::kByCaller);
}

}  // namespace flashsampler::kernels
