// SharedMemoryBuffer: a POSIX shared-memory object this process creates and
// maps, for requests whose tensors travel through a registered region
// instead of through gRPC (SamplerClient::RegisterSystemSharedMemory).
//
// Create() makes a new object (shm_open with O_CREAT | O_EXCL, so an existing
// object is never taken over), sizes it, takes its pages (posix_fallocate:
// ResourceExhausted when /dev/shm has no room, rather than SIGBUS at the
// first write) and maps it read-write. The
// destructor unmaps it and unlinks the name; a server that still has it
// registered keeps its own descriptor, so unregister first to free the
// memory. Not thread-safe as an object; the bytes are shared memory, so the
// caller orders its writes before the request that reads them (a gRPC call
// is such an order) and its reads after the response.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace flashsampler {

class SharedMemoryBuffer {
 public:
  // `key`: "/" and 1-254 characters other than "/". AlreadyExists when an
  // object of that name exists; other failures as errno says.
  static absl::StatusOr<std::unique_ptr<SharedMemoryBuffer>> Create(const std::string& key,
                                                                    size_t byte_size);
  ~SharedMemoryBuffer();
  SharedMemoryBuffer(const SharedMemoryBuffer&) = delete;
  SharedMemoryBuffer& operator=(const SharedMemoryBuffer&) = delete;

  const std::string& key() const { return key_; }
  size_t byte_size() const { return byte_size_; }
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }

 private:
  SharedMemoryBuffer(std::string key, size_t byte_size, uint8_t* data)
      : key_(std::move(key)), byte_size_(byte_size), data_(data) {}

  const std::string key_;
  const size_t byte_size_;
  uint8_t* const data_;
};

}  // namespace flashsampler
