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
#include "kernels/cuda/hidden_check.h"

namespace flashsampler::kernels {

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
// copy (FirstBadToHost, hidden_check.h). dst, src and the outcomes as
// LaunchWidenHiddenStates; kInvalidArgument also when ReportAndRideValid
// says no (a null report pointer; a ride whose dst overlaps src, dst or the
// report's words).
//
// `ride`: bytes the same launch copies besides (RideAlongCopy), or none.
// The kernel also lets the next kernel on the stream be scheduled while it
// runs (programmatic dependent launch); such a kernel must wait for this
// one's writes (griddepcontrol.wait) before it reads dst or ride.dst, and
// must not let its own dependents start before that wait, as
// LaunchFusedSample's first kernel does.
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
