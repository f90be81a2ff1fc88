#include "server/regions/memory_regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flashsampler {
namespace {

constexpr size_t kMaxNameLength = 128;
// shm_open's limit: NAME_MAX (255) including the leading "/".
constexpr size_t kMaxKeyLength = 255;
// Host reads go through a staging buffer of this size per thread that the
// request parser widens from, so the bytes are touched in L2 and never staged
// whole.
constexpr uint64_t kHostReadPieceBytes = 64 << 10;

absl::Status CheckName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("region name must have 1 to ", kMaxNameLength, " characters, got ", name.size()));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("region name may only hold [A-Za-z0-9_.-], got \"", name, "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckKey(const std::string& key) {
  if (key.size() < 2 || key.size() > kMaxKeyLength || key[0] != '/' ||
      key.find('/', 1) != std::string::npos || key.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "system shared-memory key must be \"/\" followed by 1 to ", kMaxKeyLength - 1,
        " characters other than \"/\" (as shm_open takes it), got \"", key, "\""));
  }
  return absl::OkStatus();
}

// [offset, offset + size) lies inside [0, limit), without overflow.
bool InsideRange(uint64_t offset, uint64_t size, uint64_t limit) {
  return offset <= limit && size <= limit - offset;
}

// A POSIX shared-memory object, read and written through its descriptor.
class SystemSharedMemoryRegion final : public MemoryRegion {
 public:
  SystemSharedMemoryRegion(int fd, std::string key, uint64_t start, uint64_t byte_size)
      : fd_(fd), key_(std::move(key)), start_(start), byte_size_(byte_size) {}
  ~SystemSharedMemoryRegion() override {
    close(fd_);  // a mapping outlives its descriptor
    mapping_.reset();
    if (budget_ != nullptr) budget_->fetch_sub(byte_size_);
  }

  // Once, at registration (before the region is shared): maps the region
  // for `device` when `budget` (the bytes all mappings hold) has room for it,
  // and gives the bytes back when the region closes. True when mapped.
  bool MapForDevice(int device, std::shared_ptr<std::atomic<uint64_t>> budget, uint64_t limit) {
    if (byte_size_ > limit) return false;
    if (budget->fetch_add(byte_size_) + byte_size_ > limit) {  // <= 2 x limit: no overflow
      budget->fetch_sub(byte_size_);
      return false;
    }
    mapping_ = MapForDeviceReads(fd_, start_, byte_size_, device);
    if (mapping_ == nullptr) {
      budget->fetch_sub(byte_size_);
      return false;
    }
    budget_ = std::move(budget);
    return true;
  }

  uint64_t byte_size() const override { return byte_size_; }
  // The device reads the pages pinned at registration. An object shrunk
  // since (one fstat, about a microsecond), or whose pages under the slice
  // are no longer those pinned (truncated and grown back, or a hole punched:
  // StillPinned, one read of /proc/self/pagemap, 8 bytes per 4 KiB page),
  // gets no address, now and later: the caller reads with pread, which
  // reports a truncation, and a regrown object is read afresh, not from the
  // old pinned pages. One changed while a launch reads it leaves the device
  // reading the old pages for that launch, never a fault (on hosts whose GPU
  // reads host memory through pinned DMA mappings, i.e. over PCIe; not
  // checked where the GPU walks the host's page tables, as on Grace Hopper).
  DeviceAddress DeviceAddressOf(uint64_t offset, uint64_t size) const override {
    if (mapping_ == nullptr || shrunk_.load(std::memory_order_relaxed)) return {};
    struct stat st {};
    if (fstat(fd_, &st) != 0 || static_cast<uint64_t>(st.st_size) < start_ + byte_size_ ||
        !mapping_->StillPinned(offset, size)) {
      shrunk_.store(true, std::memory_order_relaxed);
      return {};
    }
    return {mapping_->device_data() + offset, mapping_->device()};
  }

  absl::Status ReadPieces(uint64_t offset, uint64_t size, uint64_t granule,
                          const PieceConsumer& consume) const override {
    thread_local std::vector<char> staging(kHostReadPieceBytes);
    const uint64_t piece = kHostReadPieceBytes / granule * granule;
    for (uint64_t done = 0; done < size;) {
      const uint64_t take = std::min(piece, size - done);
      if (absl::Status s = ReadExactly(start_ + offset + done, take, staging.data()); !s.ok()) return s;
      consume(staging.data(), take);
      done += take;
    }
    return absl::OkStatus();
  }
  absl::Status Read(uint64_t offset, uint64_t size, void* dst) const override {
    return ReadExactly(start_ + offset, size, static_cast<char*>(dst));
  }

  absl::Status Write(uint64_t offset, const void* src, uint64_t size) const override {
    const char* in = static_cast<const char*>(src);
    uint64_t done = 0;
    while (done < size) {
      const ssize_t n = pwrite(fd_, in + done, size - done, static_cast<off_t>(start_ + offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return absl::InternalError(absl::StrCat("writing shared memory ", key_, ": ",
                                                n < 0 ? std::strerror(errno) : "nothing written"));
      }
      done += static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }

 private:
  // pread until `size` bytes of the object at `at` are in `dst`.
  absl::Status ReadExactly(uint64_t at, uint64_t size, char* dst) const {
    uint64_t done = 0;
    while (done < size) {
      const ssize_t n = pread(fd_, dst + done, size - done, static_cast<off_t>(at + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::InternalError(absl::StrCat("reading shared memory ", key_, ": ", std::strerror(errno)));
      }
      if (n == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shared-memory object ", key_, " ends at byte ", at + done, ", inside its registered "
            "region: it was truncated after registration"));
      }
      done += static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }

  const int fd_;
  const std::string key_;
  const uint64_t start_;
  const uint64_t byte_size_;
  std::unique_ptr<DeviceReadableMapping> mapping_;
  std::shared_ptr<std::atomic<uint64_t>> budget_;  // set when mapped
  mutable std::atomic<bool> shrunk_{false};
};

absl::Status OpenError(const std::string& key, int err) {
  const std::string what = absl::StrCat("shm_open(\"", key, "\"): ", std::strerror(err));
  switch (err) {
    case ENOENT: return absl::NotFoundError(absl::StrCat(what, "; create it before registering it"));
    case EACCES: return absl::PermissionDeniedError(absl::StrCat(what, "; the server needs read and write access"));
    case ENAMETOOLONG:
    case EINVAL: return absl::InvalidArgumentError(what);
    case EMFILE:
    case ENFILE: return absl::ResourceExhaustedError(what);
    default: return absl::InternalError(what);
  }
}

}  // namespace

absl::Status MemoryRegion::Read(uint64_t offset, uint64_t size, void* dst) const {
  char* out = static_cast<char*>(dst);
  return ReadPieces(offset, size, 1, [&out](const char* piece, uint64_t bytes) {
    std::memcpy(out, piece, bytes);
    out += bytes;
  });
}

MemoryRegions::MemoryRegions(MemoryRegionsOptions options) : options_(std::move(options)) {}

void MemoryRegions::SetCudaDevices(std::vector<int> devices, int in_place_device) {
  absl::MutexLock lock(&mu_);
  cuda_devices_ = std::move(devices);
  in_place_device_.store(in_place_device, std::memory_order_relaxed);
}

int MemoryRegions::in_place_device() const { return in_place_device_.load(std::memory_order_relaxed); }

absl::Status MemoryRegions::CheckNewRegion(const std::string& name, uint64_t byte_size) const {
  if (options_.max_regions <= 0) {
    return absl::FailedPreconditionError(
        "memory regions are turned off on this server (--max_regions=0)");
  }
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  if (byte_size == 0) return absl::InvalidArgumentError("region byte_size must be >= 1");
  if (regions_.contains(name)) {
    return absl::AlreadyExistsError(absl::StrCat("a region named \"", name,
                                                 "\" is already registered; unregister it first"));
  }
  if (static_cast<int64_t>(regions_.size()) >= options_.max_regions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this server holds its limit of ", options_.max_regions,
        " regions (--max_regions); unregister one first"));
  }
  return absl::OkStatus();
}

absl::Status MemoryRegions::Add(RegionDescription description, std::shared_ptr<const MemoryRegion> region) {
  absl::MutexLock lock(&mu_);
  // Checked again: another caller may have taken the name or the last slot
  // while the memory was being opened.
  if (absl::Status s = CheckNewRegion(description.name, description.byte_size); !s.ok()) return s;
  const std::string name = description.name;
  regions_.emplace(name, Entry{std::move(description), std::move(region)});
  return absl::OkStatus();
}

absl::Status MemoryRegions::RegisterSystemSharedMemory(const std::string& name, const std::string& key,
                                                       uint64_t offset, uint64_t byte_size) {
  {
    absl::ReaderMutexLock lock(&mu_);
    if (absl::Status s = CheckNewRegion(name, byte_size); !s.ok()) return s;
  }
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  const int fd = shm_open(key.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return OpenError(key, errno);
  auto region = std::make_shared<SystemSharedMemoryRegion>(fd, key, offset, byte_size);  // owns fd
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("fstat on shared memory ", key, ": ", std::strerror(errno)));
  }
  const uint64_t object_size = static_cast<uint64_t>(st.st_size);
  if (!InsideRange(offset, byte_size, object_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region [", offset, ", ", offset, " + ", byte_size, ") does not fit in shared-memory object ",
        key, " of ", object_size, " bytes"));
  }
  bool mapped = false;
  if (const int device = in_place_device(); device >= 0 && options_.map_shared_memory_for_device) {
    mapped = region->MapForDevice(device, device_mapped_bytes_, options_.max_device_mapped_bytes);
  }
  return Add(RegionDescription{.name = name, .byte_size = byte_size,
                               .kind = RegionDescription::Kind::kSystemSharedMemory, .key = key,
                               .offset = offset, .read_in_place = mapped},
             std::move(region));
}

absl::Status MemoryRegions::RegisterCudaIpc(const std::string& name, const std::string& ipc_handle,
                                            int device_id, uint64_t offset, uint64_t byte_size) {
  std::vector<int> devices;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (absl::Status s = CheckNewRegion(name, byte_size); !s.ok()) return s;
    devices = cuda_devices_;
  }
  if (devices.empty()) {
    return absl::InvalidArgumentError(
        "CUDA IPC regions need the cuda backend; this server's engine is not on a GPU (or not "
        "loaded yet); use a system shared-memory region");
  }
  if (!absl::c_linear_search(devices, device_id)) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC region on device ", device_id,
                                                   ", but this server's engine runs on device(s) ",
                                                   absl::StrJoin(devices, ",")));
  }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> region =
      OpenCudaIpcRegion(ipc_handle, device_id, offset, byte_size);
  if (!region.ok()) return region.status();
  return Add(RegionDescription{.name = name, .byte_size = byte_size, .kind = RegionDescription::Kind::kCudaIpc,
                               .key = {}, .offset = offset, .device_id = device_id,
                               .read_in_place = device_id == in_place_device()},
             std::move(*region));
}

absl::Status MemoryRegions::Unregister(const std::string& name) {
  std::shared_ptr<const MemoryRegion> last;  // closed outside the lock
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(name);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("no region named \"", name, "\" is registered"));
  }
  last = std::move(it->second.region);
  regions_.erase(it);
  return absl::OkStatus();
}

std::vector<RegionDescription> MemoryRegions::List() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<RegionDescription> out;
  out.reserve(regions_.size());
  for (const auto& [name, entry] : regions_) out.push_back(entry.description);
  return out;
}

absl::StatusOr<RegionSlice> MemoryRegions::Resolve(const std::string& name, uint64_t offset,
                                                   uint64_t byte_size, const std::string& field) const {
  RegionSlice slice;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = regions_.find(name);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat(field, ".region \"", name,
                                              "\" is not registered (RegisterRegion first)"));
    }
    slice.region = it->second.region;
  }
  const uint64_t size = slice.region->byte_size();
  if (byte_size == 0 || !InsideRange(offset, byte_size, size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " [", offset, ", ", offset, " + ", byte_size, ") is ",
        byte_size == 0 ? "empty" : "not inside", " region \"", name, "\" of ", size, " bytes"));
  }
  slice.offset = offset;
  slice.byte_size = byte_size;
  return slice;
}

#ifndef FLASHSAMPLER_HAVE_CUDA
absl::StatusOr<std::unique_ptr<MemoryRegion>> OpenCudaIpcRegion(const std::string&, int, uint64_t,
                                                                uint64_t) {
  return absl::FailedPreconditionError("this build of the server has no CUDA support");
}

std::unique_ptr<DeviceReadableMapping> MapForDeviceReads(int, uint64_t, uint64_t, int) { return nullptr; }
#endif

}  // namespace flashsampler
