// The CUDA IPC kind of MemoryRegion (server/regions/memory_regions.h): a GPU buffer of
// another process on this host, opened once with cudaIpcOpenMemHandle; and
// the CUDA side of shared-memory regions, their mapping for device copies.
//
// Bounds: the driver reports the whole allocation the handle names
// (cuMemGetAddressRange on the opened pointer), and the region must lie
// inside it, so no copy ever touches memory the caller did not export.
//
// Copies run on the calling thread's per-thread default stream and are
// waited for there: that stream does not serialise with the engine's streams,
// so reading a request's hidden states never waits behind a running launch.
// The caller must have finished writing the buffer (e.g. synchronised its
// stream) before it sends the request, as for any CUDA IPC consumer.
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/regions/mapped_pages.h"
#include "server/regions/memory_regions.h"

namespace flashsampler {
namespace {

// A device-to-host copy into pageable memory runs at a fraction of the bus
// (the driver stages it through its own pinned buffer); into pinned memory
// it runs at bus speed. Each thread that reads a region keeps one buffer.
constexpr uint64_t kPinnedStagingBytes = 1 << 20;

struct PinnedBuffer {
  char* data = nullptr;
  ~PinnedBuffer() {
    if (data != nullptr) cudaFreeHost(data);
  }
};

absl::StatusOr<char*> PinnedStaging() {
  thread_local PinnedBuffer buffer;
  if (buffer.data == nullptr) {
    void* p = nullptr;
    if (cudaError_t err = cudaMallocHost(&p, kPinnedStagingBytes); err != cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrCat("pinned staging for a CUDA IPC region: ", cudaGetErrorString(err)));
    }
    buffer.data = static_cast<char*>(p);
  }
  return buffer.data;
}

absl::Status CudaError(cudaError_t err, const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

class CudaIpcRegion final : public MemoryRegion {
 public:
  CudaIpcRegion(int device, void* base, uint64_t start, uint64_t byte_size)
      : device_(device), base_(static_cast<char*>(base)), start_(start), byte_size_(byte_size) {}
  ~CudaIpcRegion() override {
    cudaSetDevice(device_);
    cudaIpcCloseMemHandle(base_);
  }

  uint64_t byte_size() const override { return byte_size_; }

  absl::Status ReadPieces(uint64_t offset, uint64_t size, uint64_t granule,
                          const PieceConsumer& consume) const override {
    absl::StatusOr<char*> staging = PinnedStaging();
    if (!staging.ok()) return staging.status();
    const uint64_t piece = kPinnedStagingBytes / granule * granule;
    for (uint64_t done = 0; done < size;) {
      const uint64_t take = std::min(piece, size - done);
      if (absl::Status s = Copy(*staging, base_ + start_ + offset + done, take, cudaMemcpyDeviceToHost, "reading");
          !s.ok()) {
        return s;
      }
      consume(*staging, take);
      done += take;
    }
    return absl::OkStatus();
  }
  absl::Status Write(uint64_t offset, const void* src, uint64_t size) const override {
    return Copy(base_ + start_ + offset, src, size, cudaMemcpyHostToDevice, "writing");
  }
  DeviceAddress DeviceAddressOf(uint64_t offset, uint64_t /*size*/) const override {
    return {base_ + start_ + offset, device_};
  }
  DeviceAddress DeviceWritableAddressOf(uint64_t offset) const override { return DeviceAddressOf(offset, 0); }

 private:
  absl::Status Copy(void* dst, const void* src, uint64_t size, cudaMemcpyKind kind,
                    const char* what) const {
    if (cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) {
      return CudaError(err, absl::StrCat(what, " a CUDA IPC region: cudaSetDevice(", device_, ")"));
    }
    cudaError_t err = cudaMemcpyAsync(dst, src, size, kind, cudaStreamPerThread);
    if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamPerThread);
    if (err != cudaSuccess) return CudaError(err, absl::StrCat(what, " a CUDA IPC region"));
    return absl::OkStatus();
  }

  const int device_;
  char* const base_;
  const uint64_t start_;
  const uint64_t byte_size_;
};

// DeviceReadableMapping (memory_regions.h): a read-only mapping registered
// with cudaHostRegister and mapped into the device's address space.
// Read-only registration needs driver support; where it is missing the
// mapping is writable (the fd is opened read-write), which changes nothing:
// neither the server's code nor its kernels write through it.
class RegisteredMapping final : public DeviceReadableMapping {
 public:
  RegisteredMapping(void* base, size_t length, uint64_t start_in_mapping, const char* device_data, int device)
      : base_(base), length_(length), host_data_(static_cast<const char*>(base) + start_in_mapping),
        device_data_(device_data), device_(device) {}
  ~RegisteredMapping() override {
    cudaHostUnregister(base_);
    munmap(base_, length_);
  }
  const char* device_data() const override { return device_data_; }
  int device() const override { return device_; }
  bool StillPinned(uint64_t offset, uint64_t size) const override {
    const absl::StatusOr<bool> present = MappedPagesPresent(host_data_ + offset, size);
    return present.ok() && *present;
  }

 private:
  void* const base_;
  const size_t length_;
  const char* const host_data_;  // the object's byte `start` in this mapping
  const char* const device_data_;
  const int device_;
};

}  // namespace

std::unique_ptr<DeviceReadableMapping> MapForDeviceReads(int fd, uint64_t start, uint64_t size, int device) {
  if (size == 0 || cudaSetDevice(device) != cudaSuccess) return nullptr;
  // mmap takes page-aligned offsets: map from the page that holds `start`.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t aligned = start / page * page;
  const size_t length = static_cast<size_t>(start - aligned + size);
  for (const bool read_only : {true, false}) {
    void* base = mmap(nullptr, length, read_only ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                      static_cast<off_t>(aligned));
    if (base == MAP_FAILED) return nullptr;
    const unsigned flags =
        cudaHostRegisterPortable | cudaHostRegisterMapped | (read_only ? cudaHostRegisterReadOnly : 0u);
    if (cudaHostRegister(base, length, flags) == cudaSuccess) {
      void* device_base = nullptr;
      if (cudaHostGetDevicePointer(&device_base, base, 0) == cudaSuccess) {
        auto mapping = std::make_unique<RegisteredMapping>(
            base, length, start - aligned, static_cast<const char*>(device_base) + (start - aligned), device);
        // The pinning made every page present; where pagemap cannot say so,
        // a later truncation could not be seen: read with pread instead.
        if (mapping->StillPinned(0, size)) return mapping;
        return nullptr;  // unregisters and unmaps
      }
      cudaHostUnregister(base);
    }
    cudaGetLastError();  // not sticky: clear it for this thread's later calls
    munmap(base, length);
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> OpenCudaIpcRegion(const std::string& ipc_handle,
                                                                int device_id, uint64_t offset,
                                                                uint64_t byte_size) {
  cudaIpcMemHandle_t handle;
  if (ipc_handle.size() != sizeof(handle)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc.ipc_handle must be the ", sizeof(handle),
                                                   " bytes of a cudaIpcMemHandle_t, got ",
                                                   ipc_handle.size()));
  }
  std::memcpy(&handle, ipc_handle.data(), sizeof(handle));
  if (cudaError_t err = cudaSetDevice(device_id); err != cudaSuccess) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc.device_id ", device_id, ": ", cudaGetErrorString(err)));
  }
  void* base = nullptr;
  if (cudaError_t err = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
      err != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it so later calls on this thread are unaffected
    return absl::InvalidArgumentError(absl::StrCat(
        "cudaIpcOpenMemHandle refused the handle on device ", device_id, ": ", cudaGetErrorString(err),
        " (a stale handle, one of another device, or one exported by this very process)"));
  }
  // The allocation the handle names: the region must lie inside it. The
  // driver function is looked up through the runtime, so that the server
  // does not link libcuda (absent on machines without a GPU driver).
  using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  CUdeviceptr alloc_base = 0;
  size_t alloc_size = 0;
  CUresult r = CUDA_ERROR_NOT_FOUND;
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found) ==
          cudaSuccess &&
      found == cudaDriverEntryPointSuccess) {
    r = reinterpret_cast<AddressRangeFn>(fn)(&alloc_base, &alloc_size, reinterpret_cast<CUdeviceptr>(base));
  }
  if (r != CUDA_SUCCESS) {
    cudaIpcCloseMemHandle(base);
    return absl::InternalError(absl::StrCat("cuMemGetAddressRange on a CUDA IPC buffer failed (", r, ")"));
  }
  const uint64_t usable = alloc_size - (reinterpret_cast<CUdeviceptr>(base) - alloc_base);
  if (offset > usable || byte_size > usable - offset) {
    cudaIpcCloseMemHandle(base);
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC region [", offset, ", ", offset, " + ",
                                                   byte_size, ") does not fit in the shared allocation of ",
                                                   usable, " bytes"));
  }
  return std::unique_ptr<MemoryRegion>(new CudaIpcRegion(device_id, base, offset, byte_size));
}

}  // namespace flashsampler
