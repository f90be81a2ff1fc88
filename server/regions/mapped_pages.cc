#include "server/regions/mapped_pages.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flashsampler {
namespace {

constexpr uint64_t kPresentBit = uint64_t{1} << 63;
// Entries read per pread: 4 KiB of pagemap covers 2 MiB of 4 KiB pages.
constexpr uint64_t kEntriesPerRead = 512;

// Opened once for the process and never closed; pread needs no shared offset.
int PagemapDescriptor() {
  static const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  return fd;
}

}  // namespace

absl::StatusOr<bool> MappedPagesPresent(const void* addr, uint64_t bytes) {
  if (bytes == 0) return true;
  const int fd = PagemapDescriptor();
  if (fd < 0) return absl::UnavailableError("/proc/self/pagemap cannot be opened");
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t first = reinterpret_cast<uintptr_t>(addr) / page;
  const uint64_t last = (reinterpret_cast<uintptr_t>(addr) + bytes - 1) / page;
  uint64_t entries[kEntriesPerRead];
  for (uint64_t at = first; at <= last;) {
    const uint64_t want = std::min(kEntriesPerRead, last - at + 1);
    const ssize_t got = pread(fd, entries, want * sizeof(uint64_t), static_cast<off_t>(at * sizeof(uint64_t)));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0 || got % sizeof(uint64_t) != 0) {
      return absl::UnavailableError(absl::StrCat("reading /proc/self/pagemap: ",
                                                 got < 0 ? std::strerror(errno) : "short read"));
    }
    const uint64_t n = static_cast<uint64_t>(got) / sizeof(uint64_t);
    for (uint64_t i = 0; i < n; ++i) {
      if ((entries[i] & kPresentBit) == 0) return false;
    }
    at += n;
  }
  return true;
}

}  // namespace flashsampler
