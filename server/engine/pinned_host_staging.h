// PinnedHostStaging: the CUDA engine's HostStaging (server/engine/engine.h), a pool
// of pinned host buffers that request threads fill with a request's hidden
// states and the engine copies to the device from, at bus speed.
//
// cudaHostAlloc costs milliseconds (it maps and locks pages), far more than a
// decode step, so buffers are pooled: sizes round up to a power of two (at
// least 64 KiB), a released buffer goes back to its size's free list, and
// buffers beyond `max_pooled_bytes` of free memory are freed instead. The
// pool holds no buffer a caller still uses: each Allocate result returns its
// buffer when its last copy is dropped, also after the engine is gone (the
// buffers keep the pool alive).
//
// Thread safety: Allocate may be called from any thread at any time.
// Outcomes: a buffer of at least `bytes` bytes, or null when cudaHostAlloc
// fails (the caller then stages in ordinary memory).
#pragma once

#include <cstddef>
#include <memory>

#include "server/engine/engine.h"

namespace flashsampler {

// `device`: the CUDA ordinal whose context allocates (the engine's).
std::shared_ptr<HostStaging> MakePinnedHostStaging(int device, size_t max_pooled_bytes = size_t{256} << 20);

}  // namespace flashsampler
