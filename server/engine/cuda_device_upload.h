// CudaDeviceUpload: the CUDA engine's DeviceUpload (server/engine/engine.h).
// A request thread that has staged a large payload in pinned memory starts
// its host-to-device copy at once, on this object's own stream, into device
// memory from a pool of its own; the engine's stream later waits for the
// copy's event instead of copying at the start of the launch. Under load the
// copy of the next launch's rows then overlaps the kernel of this one.
//
// Memory: a CUDA memory pool on the device (cudaMallocFromPoolAsync), which
// keeps freed memory for reuse (its release threshold is unlimited), so an
// upload costs no cudaMalloc. Events come from a free list.
//
// Lifetime: each upload's owner holds the device memory, the event and the
// host bytes; when the last batch drops it, the memory returns to the pool in
// stream order, and the host bytes and the event are let go once the copy is
// done: at once in the usual case (the launch waited for it), else by a
// later upload that finds it done (an upload dropped before its launch, as a
// request refused in the queue), so no thread ever blocks on a copy. Owners
// keep this object alive, also after the engine is gone; its destructor
// waits for what is left.
//
// Thread safety: Upload may be called from any thread, concurrently; an
// owner may be dropped on any thread.
// Outcomes: MakeCudaDeviceUpload returns Internal when the stream, pool or
// event cannot be made; Upload returns Internal (a CUDA error) or
// ResourceExhausted (no device memory), and the caller then leaves the bytes
// on the host.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "server/engine/engine.h"

namespace flashsampler {

// `device`: the engine's CUDA ordinal; `min_bytes` > 0: DeviceUpload::min_bytes.
absl::StatusOr<std::shared_ptr<DeviceUpload>> MakeCudaDeviceUpload(int device, size_t min_bytes);

}  // namespace flashsampler
