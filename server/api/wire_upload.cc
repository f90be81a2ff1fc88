#include "server/api/wire_upload.h"

#include <utility>

namespace flashsampler {

namespace {

// The bytes of `run` when it is to be uploaded, else 0. Only pinned host
// bytes: an asynchronous copy from pageable memory would be staged by the
// driver, synchronously.
size_t UploadBytes(const DeviceUpload& upload, int64_t hidden_size, const WireHiddenRows& run) {
  if (!run.pinned || run.device != kHostMemory) return 0;
  const size_t bytes = static_cast<size_t>(run.rows * hidden_size * WeightDTypeSize(run.dtype));
  return bytes >= upload.min_bytes() ? bytes : 0;
}

}  // namespace

bool HasWireUploadCandidates(const DeviceUpload& upload, int64_t hidden_size, const SampleBatch& batch) {
  for (const WireHiddenRows& run : batch.wire_hidden) {
    if (UploadBytes(upload, hidden_size, run) > 0) return true;
  }
  return false;
}

WireUploads StartWireUploads(DeviceUpload& upload, int64_t hidden_size, SampleBatch* batch) {
  WireUploads started;
  for (WireHiddenRows& run : batch->wire_hidden) {
    const size_t bytes = UploadBytes(upload, hidden_size, run);
    if (bytes == 0) continue;
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
