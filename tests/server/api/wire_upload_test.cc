// StartWireUploads (server/api/wire_upload.h): which runs of an admitted
// request start for the GPU, and what a run becomes.
#include "server/api/wire_upload.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace flashsampler {
namespace {

constexpr int64_t kHidden = 8;

// A DeviceUpload whose "device memory" is a host copy made at Upload time;
// `fail` makes every upload fail (as a device out of memory).
class CopyingUpload final : public DeviceUpload {
 public:
  CopyingUpload(size_t min_bytes, bool fail = false) : min_bytes_(min_bytes), fail_(fail) {}
  size_t min_bytes() const override { return min_bytes_; }
  absl::StatusOr<UploadedRows> Upload(const void* host, size_t bytes,
                                      std::shared_ptr<const void> host_owner) override {
    ++calls;
    if (fail_) return absl::ResourceExhaustedError("no device memory");
    host_owners.push_back(host_owner);
    auto copy = std::make_shared<std::string>(static_cast<const char*>(host), bytes);
    return UploadedRows{copy->data(), /*device=*/0, &event, copy};
  }
  int calls = 0;
  std::vector<std::shared_ptr<const void>> host_owners;
  const int event = 0;  // stands for the copy's cudaEvent_t

 private:
  const size_t min_bytes_;
  const bool fail_;
};

// `rows` bf16 rows of bytes 0, 1, 2, ... in memory the run owns.
WireHiddenRows HostRun(int64_t first_row, int64_t rows, bool pinned) {
  auto bytes = std::make_shared<std::string>(static_cast<size_t>(rows * kHidden * 2), '\0');
  for (size_t i = 0; i < bytes->size(); ++i) (*bytes)[i] = static_cast<char>(i);
  return WireHiddenRows{first_row, rows, bytes->data(), WeightDType::kBFloat16, kHostMemory, pinned, bytes};
}

SampleBatch BatchOf(std::vector<WireHiddenRows> runs, int64_t rows) {
  SampleBatch batch;
  batch.rows = rows;
  batch.hidden.resize(static_cast<size_t>(rows * kHidden));
  batch.params.resize(static_cast<size_t>(rows));
  batch.wire_hidden = std::move(runs);
  return batch;
}

// Pinned runs of at least min_bytes() become the uploaded copy with its
// event; the host bytes stay alive with the upload (its copy reads them).
TEST(StartWireUploads, LargePinnedRunsBecomeTheirDeviceCopy) {
  CopyingUpload upload(/*min_bytes=*/3 * kHidden * 2);
  SampleBatch batch = BatchOf({HostRun(0, 3, true), HostRun(3, 2, true), HostRun(5, 4, true)}, 9);
  const SampleBatch before = batch;
  EXPECT_TRUE(HasWireUploadCandidates(upload, kHidden, batch));
  const WireUploads started = StartWireUploads(upload, kHidden, &batch);
  EXPECT_EQ(upload.calls, 2);  // the 2-row run is below the threshold
  EXPECT_FALSE(HasWireUploadCandidates(upload, kHidden, BatchOf({HostRun(0, 2, true)}, 2)));
  EXPECT_EQ(started.runs, 2);
  EXPECT_EQ(started.bytes, (3 + 4) * kHidden * 2);
  for (int i : {0, 2}) {
    SCOPED_TRACE(i);
    const WireHiddenRows& run = batch.wire_hidden[i];
    EXPECT_EQ(run.device, 0);
    EXPECT_FALSE(run.pinned);
    EXPECT_EQ(run.ready, &upload.event);
    EXPECT_NE(run.data, before.wire_hidden[i].data);
    EXPECT_EQ(std::memcmp(run.data, before.wire_hidden[i].data, run.rows * kHidden * 2), 0);
    EXPECT_EQ(run.first_row, before.wire_hidden[i].first_row);
    EXPECT_EQ(run.rows, before.wire_hidden[i].rows);
    EXPECT_EQ(run.dtype, WeightDType::kBFloat16);
  }
  EXPECT_EQ(upload.host_owners[0], before.wire_hidden[0].owner);
  EXPECT_EQ(upload.host_owners[1], before.wire_hidden[2].owner);
  const WireHiddenRows& small = batch.wire_hidden[1];
  EXPECT_EQ(small.device, kHostMemory);
  EXPECT_TRUE(small.pinned);
  EXPECT_EQ(small.ready, nullptr);
  EXPECT_EQ(small.data, before.wire_hidden[1].data);
}

// Bytes that are not pinned (an asynchronous copy would be staged by the
// driver) and rows already on the GPU (a CUDA IPC buffer) are left alone;
// so is a run whose upload fails: the launch copies it.
TEST(StartWireUploads, UnpinnedDeviceAndFailedRunsStayAsTheyAre) {
  CopyingUpload upload(1);
  WireHiddenRows on_gpu = HostRun(4, 2, false);
  on_gpu.device = 0;
  SampleBatch batch = BatchOf({HostRun(0, 4, false), on_gpu}, 6);
  EXPECT_FALSE(HasWireUploadCandidates(upload, kHidden, batch));
  StartWireUploads(upload, kHidden, &batch);
  EXPECT_EQ(upload.calls, 0);
  EXPECT_EQ(batch.wire_hidden[0].device, kHostMemory);
  EXPECT_EQ(batch.wire_hidden[1].ready, nullptr);

  CopyingUpload failing(1, /*fail=*/true);
  SampleBatch pinned = BatchOf({HostRun(0, 4, true)}, 4);
  const void* data = pinned.wire_hidden[0].data;
  EXPECT_EQ(StartWireUploads(failing, kHidden, &pinned).runs, 0);
  EXPECT_EQ(failing.calls, 1);
  EXPECT_EQ(pinned.wire_hidden[0].device, kHostMemory);
  EXPECT_TRUE(pinned.wire_hidden[0].pinned);
  EXPECT_EQ(pinned.wire_hidden[0].data, data);
}

}  // namespace
}  // namespace flashsampler
