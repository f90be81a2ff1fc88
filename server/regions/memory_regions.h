// MemoryRegions: the memory regions callers registered (the RegisterRegion
// RPC), by name, and the one place that reads and writes them.
//
// A region is memory of another process on this host, through which a
// request's hidden states and results travel instead of through gRPC:
// - a POSIX shared-memory object, opened once at registration and afterwards
//   read with pread and written with pwrite on that descriptor, never
//   through a mapping the CPU reads: a caller that shrinks the object after
//   registering it then gets a short read, which is an error, where a mapping
//   would take SIGBUS and kill the server. On a server whose engine widens
//   hidden states on a GPU (in_place_device), the region is also mapped and
//   pinned for that GPU (DeviceReadableMapping), which reads the requests'
//   hidden states in place over the bus: no host copy, and no CPU access that
//   a shrunk object could fault;
// - a GPU buffer shared by CUDA IPC (server/regions/cuda_ipc_region.cc), opened once
//   with cudaIpcOpenMemHandle and copied with cudaMemcpy.
//
// Every bound is checked here: a name that is not registered is NotFound, a
// slice outside its region InvalidArgument, so no request reads or writes
// outside the memory the caller registered.
//
// Thread safety: every method may be called concurrently. A slice returned by
// Resolve holds its region open: Unregister forgets the name at once, and the
// memory is closed when the last request using it drops its slice.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace flashsampler {

// Registered memory of one kind. Offsets are relative to the region's start;
// callers (MemoryRegions::Resolve) keep offset + size <= byte_size().
class MemoryRegion {
 public:
  // Called with each piece of a read, in order; the piece lives in the
  // region's staging memory until the call returns.
  using PieceConsumer = std::function<void(const char* piece, uint64_t bytes)>;

  virtual ~MemoryRegion() = default;
  virtual uint64_t byte_size() const = 0;
  // Reads [offset, offset + size) a piece at a time into staging memory of
  // the calling thread (host memory: 64 KiB, so a reader that converts each
  // piece works in cache; CUDA IPC: 1 MiB of pinned memory, which the
  // device-to-host copy needs to run at bus speed) and hands each piece to
  // `consume`. Every piece but the last is a multiple of `granule` bytes
  // (1 <= granule <= 4096), so a reader of elements never sees one split.
  virtual absl::Status ReadPieces(uint64_t offset, uint64_t size, uint64_t granule,
                                  const PieceConsumer& consume) const = 0;
  // Copies `size` bytes of host memory `src` to [offset, offset + size).
  virtual absl::Status Write(uint64_t offset, const void* src, uint64_t size) const = 0;
  // The device address of `offset`, for an engine on `device` to read
  // [offset, offset + size) in place: GPU memory (CUDA IPC), or host memory
  // mapped into that device's address space (a shared-memory region, read
  // over the bus). {nullptr, -1} where there is none, or where those bytes
  // may no longer be the object's: they are then read through Read /
  // ReadPieces.
  struct DeviceAddress {
    const void* data = nullptr;
    int device = -1;
  };
  virtual DeviceAddress DeviceAddressOf(uint64_t offset, uint64_t size) const {
    (void)offset;
    (void)size;
    return {};
  }
  // The same where the device may also write there (GPU memory; a
  // shared-memory mapping is read-only): the engine writes results there
  // itself. {nullptr, -1} otherwise: results are written through Write.
  virtual DeviceAddress DeviceWritableAddressOf(uint64_t offset) const {
    (void)offset;
    return {};
  }

  // Copies [offset, offset + size) to host memory `dst` (by default through
  // ReadPieces; a kind that can read straight into `dst` does).
  virtual absl::Status Read(uint64_t offset, uint64_t size, void* dst) const;
};

// What ListRegions reports about a region.
struct RegionDescription {
  enum class Kind { kSystemSharedMemory, kCudaIpc };
  std::string name;
  uint64_t byte_size = 0;
  Kind kind = Kind::kSystemSharedMemory;
  std::string key;     // kSystemSharedMemory: the shm_open name
  uint64_t offset = 0;  // where the region starts in the object / allocation
  int device_id = -1;   // kCudaIpc: the CUDA ordinal
  // At registration: requests' hidden states are read where they are by the
  // engine's GPU (a CUDA IPC buffer on its device, or a shared-memory object
  // mapped for it); false: read through the host.
  bool read_in_place = false;
};

// A bounds-checked piece of a registered region, holding the region open.
struct RegionSlice {
  std::shared_ptr<const MemoryRegion> region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;

  absl::Status Read(void* dst) const { return region->Read(offset, byte_size, dst); }
  // Writes `size` <= byte_size bytes at the slice's start.
  absl::Status Write(const void* src, uint64_t size) const {
    return region->Write(offset, src, size);
  }
};

struct MemoryRegionsOptions {
  // Registrations beyond this many are ResourceExhausted; 0 turns the
  // feature off (every Register is FailedPrecondition).
  int max_regions = 64;
  // Map shared-memory regions for the engine's GPU to read in place
  // (DeviceReadableMapping) when the engine widens hidden states on a GPU.
  // The GPU reads pinned pages: a caller that shrinks the object cannot
  // fault the server, and a request on a shrunk object is refused as with
  // pread (DeviceAddressOf checks the object's size, and that the pages are
  // still the object's: MappedPagesPresent, server/regions/mapped_pages.h;
  // once shrunk, truncated or holed, a region is read with pread for good,
  // so a regrown object is read afresh, never from the old pinned pages).
  bool map_shared_memory_for_device = true;
  // Pinned host memory all mapped regions may hold at once: a region that
  // would take the total past it is read with pread instead. Pinned pages
  // cannot be swapped, and a caller may register a large sparse object.
  uint64_t max_device_mapped_bytes = uint64_t{4} << 30;
};

class MemoryRegions {
 public:
  explicit MemoryRegions(MemoryRegionsOptions options);

  // The CUDA devices the engine runs on (set once it is loaded); a CUDA IPC
  // region must be on one of them. Until set, or when empty (the CPU
  // backend), CUDA IPC regions are refused. `in_place_device` >= 0: the
  // engine reads hidden states on that device where they are
  // (Engine::reads_wire_hidden), so requests take CUDA IPC slices there
  // without copying them to the host.
  void SetCudaDevices(std::vector<int> devices, int in_place_device = -1);
  // The device set above, or -1.
  int in_place_device() const;

  // Opens the POSIX shared-memory object `key` (shm_open, read and write) and
  // registers [offset, offset + byte_size) of it as `name`. InvalidArgument
  // for a bad name, key or size, or a range past the object's end;
  // AlreadyExists for a name in use; NotFound when no object has that key;
  // PermissionDenied when the server may not open it; ResourceExhausted past
  // max_regions; FailedPrecondition when regions are off.
  absl::Status RegisterSystemSharedMemory(const std::string& name, const std::string& key,
                                          uint64_t offset, uint64_t byte_size);
  // Opens the CUDA IPC handle (64 bytes) on `device_id` and registers
  // [offset, offset + byte_size) of its allocation as `name`. As above, plus
  // InvalidArgument for a device the engine does not use, a handle the driver
  // refuses (stale, or of this very process), or a range past the allocation.
  absl::Status RegisterCudaIpc(const std::string& name, const std::string& ipc_handle,
                               int device_id, uint64_t offset, uint64_t byte_size);
  // NotFound when no region has this name.
  absl::Status Unregister(const std::string& name);
  // Sorted by name.
  std::vector<RegionDescription> List() const;

  // The slice [offset, offset + byte_size) of region `name`. NotFound for an
  // unknown name; InvalidArgument when the slice is empty or not inside the
  // region. `field` names the request field in messages.
  absl::StatusOr<RegionSlice> Resolve(const std::string& name, uint64_t offset,
                                      uint64_t byte_size, const std::string& field) const;

  // Registers an opened region as description.name (the Register* methods
  // above end here; tests add regions of their own). The name and limit
  // checks of Register*: InvalidArgument, AlreadyExists, ResourceExhausted,
  // FailedPrecondition.
  absl::Status Add(RegionDescription description, std::shared_ptr<const MemoryRegion> region);

 private:
  struct Entry {
    RegionDescription description;
    std::shared_ptr<const MemoryRegion> region;
  };
  absl::Status CheckNewRegion(const std::string& name, uint64_t byte_size) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const MemoryRegionsOptions options_;
  mutable absl::Mutex mu_;
  std::vector<int> cuda_devices_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> in_place_device_{-1};
  // Bytes of the mappings alive now (shared with the regions, which give
  // theirs back when closed, possibly after this object).
  std::shared_ptr<std::atomic<uint64_t>> device_mapped_bytes_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  std::map<std::string, Entry> regions_ ABSL_GUARDED_BY(mu_);
};

// Host memory of a shared-memory object mapped for one GPU to read in place:
// [start, start + size) of the object mapped read-only, registered with CUDA
// (pinned) and mapped into the device's address space. Nothing on the CPU
// reads it: the CUDA driver read small copies' sources with the CPU, so a
// caller that shrank the object under a mapping the copy engines read from
// killed the server with SIGBUS (measured on an H200, 2 KiB copy). The
// device reads the pinned pages, which stay allocated until unregistered
// even when the object shrinks.
class DeviceReadableMapping {
 public:
  virtual ~DeviceReadableMapping() = default;
  virtual const char* device_data() const = 0;  // the object's byte `start`, a device address
  virtual int device() const = 0;
  // Whether the object's bytes [start + offset, start + offset + size) are
  // still on the pages pinned at registration: false once the object was
  // truncated there (even if grown back since) or had a hole punched there
  // (MappedPagesPresent on the mapping, which the CPU never touches).
  virtual bool StillPinned(uint64_t offset, uint64_t size) const = 0;
};

// Maps `fd`'s [start, start + size) for CUDA device `device` to read
// (server/regions/cuda_ipc_region.cc in CUDA builds); null where it cannot (no
// CUDA, the driver refuses, or StillPinned cannot tell: no readable
// /proc/self/pagemap), and the region is then read with pread.
std::unique_ptr<DeviceReadableMapping> MapForDeviceReads(int fd, uint64_t start, uint64_t size, int device);

// Opens a CUDA IPC handle (server/regions/cuda_ipc_region.cc in CUDA builds; in
// others, FailedPrecondition). Exposed for MemoryRegions and tests.
absl::StatusOr<std::unique_ptr<MemoryRegion>> OpenCudaIpcRegion(const std::string& ipc_handle,
                                                                int device_id, uint64_t offset,
                                                                uint64_t byte_size);

}  // namespace flashsampler
