// Hidden states that reach the GPU in the caller's dtype (a serving engine's
// CUDA IPC buffer, read in place): widened to the fp32 the samplers read,
// rounded to the LM head's dtype and checked, in one pass on the device.
//
// This is the device half of what the request parser does on the host for
// hidden states that arrive as bytes (server/api/request_parser.cc): the same
// conversions (kernels/common/half_precision.h, compiled for both sides), so a
// row's fp32 input, and hence its token, is bit-identical whichever way it came.
//
// Thread safety: the launcher only enqueues work on `stream`; concurrent
// launches on different streams are independent.
// Outcomes: kOk (the widening is enqueued; read *first_bad once the stream has
// finished); kInvalidArgument for a null pointer, count < 1 or an unknown
// dtype; kDeviceError when the launch fails.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common/kernel_status.h"
#include "kernels/cuda/fused_sample.h"

namespace flashsampler::kernels {

// No bad element: the value *first_bad keeps.
inline constexpr unsigned long long kNoBadHiddenElement = ~0ull;

// Who sets *first_bad to kNoBadHiddenElement before the kernel runs: the
// launcher (one memset on the stream), or the caller, who enqueued that value
// ahead of the launch on the same stream (one operation less if it has a
// copy to fold it into; the serving engine's LaunchWidenHiddenStatesToHost,
// below, needs no reset at all).
enum class FirstBadReset { kByLauncher, kByCaller };

// dst[i] = the fp32 value of src[i] (`src_dtype`), rounded to `weight_dtype`
// (nearest even) for i < count. *first_bad (device memory) becomes the
// smallest i whose element is NaN or infinite, or rounds to infinity in a
// 16-bit weight dtype (fp16: |x| >= 65520; bf16: |x| >= 0x1.ffp127, fp32
// sources only); it stays kNoBadHiddenElement when there is none
// (see FirstBadReset for who resets it). dst must not overlap src.
KernelStatus LaunchWidenHiddenStates(const void* src, CudaWeightDType src_dtype, int64_t count,
                                     CudaWeightDType weight_dtype, float* dst,
                                     unsigned long long* first_bad, cudaStream_t stream,
                                     FirstBadReset reset = FirstBadReset::kByLauncher);

// The serving engine's form: the first bad index reaches the host without a
// copy. *first_bad and *blocks_done (device memory) hold kNoBadHiddenElement
// and 0 when the launch starts, and the launch leaves them so (the caller
// sets them once, before its first launch, and then never touches them);
// the launch's last block to finish writes the smallest bad index, or
// kNoBadHiddenElement, to *first_bad_host: pinned host memory mapped into
// the device's address space, readable once the stream has passed the
// launch. Launches sharing first_bad and blocks_done must be ordered (one
// stream). dst, src and the outcomes as LaunchWidenHiddenStates;
// kInvalidArgument also for a null first_bad_host or blocks_done.
//
// `ride`: bytes the same launch copies besides (RideAlongCopy), or none.
// The kernel also lets the next kernel on the stream be scheduled while it
// runs (programmatic dependent launch); such a kernel must wait for this
// one's writes (griddepcontrol.wait) before it reads dst or ride.dst, and
// must not let its own dependents start before that wait, as
// LaunchFusedSample's first kernel does.
struct FirstBadToHost {
  unsigned long long* first_bad = nullptr;       // device
  unsigned int* blocks_done = nullptr;           // device
  unsigned long long* first_bad_host = nullptr;  // mapped pinned host memory
};
// A few bytes of the caller's per-launch input (the serving engine's row
// parameters when its hidden states are already on the GPU) that the
// widening kernel's threads copy, one 4-byte word each, from src
// (device-accessible: device memory or mapped pinned host memory) to dst
// (device memory): they are there once the stream has passed the launch,
// with no copy operation of their own on the stream. bytes == 0: nothing;
// else both pointers non-null and 4-byte aligned, bytes a multiple of 4,
// and dst overlapping neither src nor the widening's buffers and report
// words (else kInvalidArgument).
struct RideAlongCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  size_t bytes = 0;
};
KernelStatus LaunchWidenHiddenStatesToHost(const void* src, CudaWeightDType src_dtype, int64_t count,
                                           CudaWeightDType weight_dtype, float* dst,
                                           const FirstBadToHost& report, cudaStream_t stream,
                                           const RideAlongCopy& ride = {});

// Copies `bytes` (1 to 8) bytes from src to dst on the device, by a kernel
// thread. src may be GPU memory or host memory mapped into the device's
// address space; dst is device memory. For reading one bad element of a
// widened source: a cudaMemcpy from registered host memory is done by the
// CPU, which a caller's shrunk shared-memory object would fault (SIGBUS),
// where the device reads the pages pinned at registration. kInvalidArgument
// for a null pointer or a size outside 1..8; kDeviceError when the launch
// fails.
KernelStatus LaunchCopyDeviceBytes(const void* src, int bytes, void* dst, cudaStream_t stream);

}  // namespace flashsampler::kernels
