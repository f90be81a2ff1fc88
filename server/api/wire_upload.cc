#include "server/api/wire_upload.h"

#include <utility>

namespace flashsampler {

WireUploads StartWireUploads(DeviceUpload& upload, int64_t hidden_size, SampleBatch* batch) {
  WireUploads started;
  for (WireHiddenRows& run : batch->wire_hidden) {
    // Only pinned host bytes: an asynchronous copy from pageable memory
    // would be staged by the driver, synchronously.
    if (!run.pinned || run.device != kHostMemory) continue;
    const size_t bytes = static_cast<size_t>(run.rows * hidden_size * WeightDTypeSize(run.dtype));
    if (bytes < upload.min_bytes()) continue;
    absl::StatusOr<UploadedRows> uploaded = upload.Upload(run.data, bytes, run.owner);
    if (!uploaded.ok()) continue;
    run.data = uploaded->data;
    run.device = uploaded->device;
    run.pinned = false;
    run.owner = std::move(uploaded->owner);
    run.ready = uploaded->ready;
    ++started.runs;
    started.bytes += static_cast<int64_t>(bytes);
  }
  return started;
}

}  // namespace flashsampler
