// The copies request threads start for the CUDA engine; the contract is in
// cuda_device_upload.h.
#include "server/engine/cuda_device_upload.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/cuda_call_status.h"

namespace flashsampler {
namespace {

class CudaDeviceUpload final : public DeviceUpload,
                               public std::enable_shared_from_this<CudaDeviceUpload> {
 public:
  CudaDeviceUpload(int device, size_t min_bytes) : device_(device), min_bytes_(min_bytes) {}

  ~CudaDeviceUpload() override {
    // Every owner is gone (each holds this object); their frees are on
    // stream_, and retired_ holds the uploads whose copies were not yet seen
    // done.
    if (cudaSetDevice(device_) != cudaSuccess) return;
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (Retired& r : retired_) free_events_.push_back(r.event);
    retired_.clear();  // the copies are done: their host bytes may go
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (pool_ != nullptr) cudaMemPoolDestroy(pool_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return CudaCallStatus("cudaSetDevice", e);
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess) {
      return CudaCallStatus("cudaStreamCreateWithFlags", e);
    }
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    if (cudaError_t e = cudaMemPoolCreate(&pool_, &props); e != cudaSuccess) return CudaCallStatus("cudaMemPoolCreate", e);
    // Freed memory stays in the pool for the next upload instead of going
    // back to the device at every stream synchronisation.
    uint64_t keep_all = UINT64_MAX;
    if (cudaError_t e = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_all);
        e != cudaSuccess) {
      return CudaCallStatus("cudaMemPoolSetAttribute", e);
    }
    return absl::OkStatus();
  }

  size_t min_bytes() const override { return min_bytes_; }

  absl::StatusOr<UploadedRows> Upload(const void* host, size_t bytes,
                                      std::shared_ptr<const void> host_owner) override {
    // The calling thread's current device is per thread: set it every time.
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return CudaCallStatus("cudaSetDevice", e);
    ReapRetired();
    absl::StatusOr<cudaEvent_t> event = TakeEvent();
    if (!event.ok()) return event.status();
    void* data = nullptr;
    if (cudaError_t e = cudaMallocFromPoolAsync(&data, bytes, pool_, stream_); e != cudaSuccess) {
      ReturnEvent(*event);
      return CudaCallStatus("cudaMallocFromPoolAsync", e);
    }
    // The event follows this copy in stream order (this thread's calls are
    // ordered; another thread's copy may land between them, which only
    // makes the wait longer).
    cudaError_t e = cudaMemcpyAsync(data, host, bytes, cudaMemcpyHostToDevice, stream_);
    if (e == cudaSuccess) e = cudaEventRecord(*event, stream_);
    auto owner = std::make_shared<UploadHold>(shared_from_this(), data, *event, std::move(host_owner));
    if (e != cudaSuccess) return CudaCallStatus("an upload's cudaMemcpyAsync / cudaEventRecord", e);
    return UploadedRows{data, device_, *event, std::move(owner)};
  }

 private:
  // One upload's device memory, event and host bytes, released together.
  struct UploadHold {
    UploadHold(std::shared_ptr<CudaDeviceUpload> from, void* data, cudaEvent_t event,
               std::shared_ptr<const void> host)
        : from(std::move(from)), data(data), event(event), host(std::move(host)) {}
    ~UploadHold() {
      // The memory returns to the pool in stream order: after the copy, and
      // after the launch that waited for it (which finished before its batch
      // let go of these rows). The host bytes and the event wait for the
      // copy (Retire).
      cudaSetDevice(from->device_);
      cudaFreeAsync(data, from->stream_);
      from->Retire(event, std::move(host));
    }
    std::shared_ptr<CudaDeviceUpload> from;
    void* data;
    cudaEvent_t event;
    std::shared_ptr<const void> host;
  };

  absl::StatusOr<cudaEvent_t> TakeEvent() {
    {
      absl::MutexLock lock(&mu_);
      if (!free_events_.empty()) {
        cudaEvent_t e = free_events_.back();
        free_events_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    if (cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); err != cudaSuccess) {
      return CudaCallStatus("cudaEventCreateWithFlags", err);
    }
    return e;
  }

  // A waiter that already enqueued cudaStreamWaitEvent keeps waiting for the
  // record it saw, so an event may be recorded again at once.
  void ReturnEvent(cudaEvent_t e) {
    absl::MutexLock lock(&mu_);
    free_events_.push_back(e);
  }

  // A dropped upload whose copy may still read its host bytes.
  struct Retired {
    cudaEvent_t event;
    std::shared_ptr<const void> host;
  };

  // The host bytes may change or go, and the event be recorded again, only
  // once the copy is done. It usually is (the launch waited for it): then
  // both go at once (`host` on return, outside the lock). An upload dropped
  // before its launch (a request cancelled in the queue) may still be
  // copying, and no thread should block on that: it waits in retired_ until
  // a later upload finds its copy done (ReapRetired).
  void Retire(cudaEvent_t e, std::shared_ptr<const void> host) {
    absl::MutexLock lock(&mu_);
    if (cudaEventQuery(e) == cudaErrorNotReady) {
      retired_.push_back(Retired{e, std::move(host)});
    } else {
      free_events_.push_back(e);
    }
  }

  // Releases the retired uploads whose copies are done (their host bytes
  // outside the lock: a staging buffer may go back to cudaFreeHost).
  void ReapRetired() {
    std::vector<std::shared_ptr<const void>> released;
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < retired_.size();) {  // usually empty
        if (cudaEventQuery(retired_[i].event) == cudaErrorNotReady) {
          ++i;
          continue;
        }
        // Done (or failed: the copy will not run, and a sticky error shows
        // on the engine's own calls).
        free_events_.push_back(retired_[i].event);
        released.push_back(std::move(retired_[i].host));
        retired_[i] = std::move(retired_.back());
        retired_.pop_back();
      }
    }
  }

  const int device_;
  const size_t min_bytes_;
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  absl::Mutex mu_;
  std::vector<cudaEvent_t> free_events_ ABSL_GUARDED_BY(mu_);
  std::vector<Retired> retired_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::shared_ptr<DeviceUpload>> MakeCudaDeviceUpload(int device, size_t min_bytes) {
  auto upload = std::make_shared<CudaDeviceUpload>(device, min_bytes);
  if (absl::Status s = upload->Init(); !s.ok()) return s;
  return std::shared_ptr<DeviceUpload>(std::move(upload));
}

}  // namespace flashsampler
