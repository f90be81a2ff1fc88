// The pinned buffer pool behind the CUDA engine's HostStaging; the contract
// is in pinned_host_staging.h.
#include "server/engine/pinned_host_staging.h"

#include <cuda_runtime_api.h>

#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace flashsampler {
namespace {

constexpr size_t kSmallestBuffer = size_t{64} << 10;

size_t SizeClass(size_t bytes) {
  size_t size = kSmallestBuffer;
  while (size < bytes) size <<= 1;
  return size;
}

class PinnedHostStaging final : public HostStaging,
                                public std::enable_shared_from_this<PinnedHostStaging> {
 public:
  PinnedHostStaging(int device, size_t max_pooled_bytes)
      : device_(device), max_pooled_bytes_(max_pooled_bytes) {}

  ~PinnedHostStaging() override {
    for (auto& [size, buffers] : free_) {
      for (void* p : buffers) cudaFreeHost(p);
    }
  }

  std::shared_ptr<void> Allocate(size_t bytes) override {
    const size_t size = SizeClass(bytes);
    void* buffer = nullptr;
    {
      absl::MutexLock lock(&mu_);
      std::vector<void*>& buffers = free_[size];
      if (!buffers.empty()) {
        buffer = buffers.back();
        buffers.pop_back();
        pooled_bytes_ -= size;
      }
    }
    // A new buffer is allocated outside the lock: it takes milliseconds.
    // cudaHostAlloc runs in the calling thread's current context, so it is
    // pointed at the engine's device (else the first call would create a
    // context on device 0).
    if (buffer == nullptr &&
        (cudaSetDevice(device_) != cudaSuccess ||
         cudaHostAlloc(&buffer, size, cudaHostAllocPortable) != cudaSuccess)) {
      cudaGetLastError();  // not sticky: clear it for this thread's later calls
      return nullptr;
    }
    return std::shared_ptr<void>(buffer, [pool = shared_from_this(), size](void* p) { pool->Release(p, size); });
  }

 private:
  void Release(void* buffer, size_t size) {
    {
      absl::MutexLock lock(&mu_);
      if (pooled_bytes_ + size <= max_pooled_bytes_) {
        free_[size].push_back(buffer);
        pooled_bytes_ += size;
        return;
      }
    }
    cudaFreeHost(buffer);
  }

  const int device_;
  const size_t max_pooled_bytes_;
  absl::Mutex mu_;
  std::map<size_t, std::vector<void*>> free_ ABSL_GUARDED_BY(mu_);
  size_t pooled_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::shared_ptr<HostStaging> MakePinnedHostStaging(int device, size_t max_pooled_bytes) {
  return std::make_shared<PinnedHostStaging>(device, max_pooled_bytes);
}

}  // namespace flashsampler
