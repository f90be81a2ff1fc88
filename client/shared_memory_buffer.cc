#include "client/shared_memory_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flashsampler {

absl::StatusOr<std::unique_ptr<SharedMemoryBuffer>> SharedMemoryBuffer::Create(const std::string& key,
                                                                               size_t byte_size) {
  if (byte_size == 0) return absl::InvalidArgumentError("a shared-memory buffer needs >= 1 byte");
  const int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const std::string what = absl::StrCat("shm_open(\"", key, "\"): ", std::strerror(errno));
    return errno == EEXIST ? absl::AlreadyExistsError(what) : absl::InvalidArgumentError(what);
  }
  // ftruncate only sets the size: a tmpfs without room for the pages (a
  // container's 64 MiB /dev/shm) would then kill the first write with SIGBUS.
  // posix_fallocate takes the pages now, or says there is no room.
  int err = ftruncate(fd, static_cast<off_t>(byte_size)) == 0 ? 0 : errno;
  const char* step = "ftruncate";
  if (err == 0) {
    err = posix_fallocate(fd, 0, static_cast<off_t>(byte_size));
    step = "posix_fallocate";
  }
  if (err != 0) {
    const std::string what = absl::StrCat(step, "(\"", key, "\", ", byte_size, "): ", std::strerror(err),
                                          err == ENOSPC ? " (is /dev/shm large enough?)" : "");
    close(fd);
    shm_unlink(key.c_str());
    return absl::ResourceExhaustedError(what);
  }
  void* data = mmap(nullptr, byte_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);  // the mapping keeps the object
  if (data == MAP_FAILED) {
    const std::string what = absl::StrCat("mmap(\"", key, "\"): ", std::strerror(errno));
    shm_unlink(key.c_str());
    return absl::ResourceExhaustedError(what);
  }
  return std::unique_ptr<SharedMemoryBuffer>(
      new SharedMemoryBuffer(key, byte_size, static_cast<uint8_t*>(data)));
}

SharedMemoryBuffer::~SharedMemoryBuffer() {
  munmap(data_, byte_size_);
  shm_unlink(key_.c_str());
}

}  // namespace flashsampler
