// StartWireUploads: for an engine with a DeviceUpload (the CUDA engine), the
// step after admission that starts a request's large pinned hidden-state
// runs across the bus (server/engine/engine.h, DeviceUpload): each host run
// in pinned memory (the payload the parser staged, or a shared-memory slice
// it read with pread) of at least upload.min_bytes() becomes the
// uploaded device copy with its event (WireHiddenRows::ready), which the
// engine's launch waits for instead of copying the rows itself. So, under
// load, the next launch's rows cross the bus while this launch's kernel runs.
//
// It runs once the batcher has admitted the request (DynamicBatcher::Submit's
// `admitted`), never for a refused one: a refused request costs no copy.
//
// Thread safety: one call per batch, by the thread that owns it before the
// batcher queues it; calls on different batches may run concurrently.
// Outcomes: the runs started and their bytes. A run whose upload fails stays
// a host run; the launch then copies it, as without uploads.
#pragma once

#include <cstdint>

#include "server/engine/engine.h"

namespace flashsampler {

struct WireUploads {
  int64_t runs = 0;
  int64_t bytes = 0;
};

// `hidden_size`: the engine's D, to size each run.
WireUploads StartWireUploads(DeviceUpload& upload, int64_t hidden_size, SampleBatch* batch);

// Whether `batch` has a run StartWireUploads would start: requests without
// one (small payloads) skip the admission step altogether.
bool HasWireUploadCandidates(const DeviceUpload& upload, int64_t hidden_size, const SampleBatch& batch);

}  // namespace flashsampler
