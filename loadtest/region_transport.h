// RegionTransport: flashsampler-load's --transport=shm|cuda_ipc. The
// distinct request payloads are placed once in memory the server reads
// directly (a POSIX shared-memory object, or a GPU buffer shared by CUDA IPC),
// the memory is registered as one region, and each request names its slice
// instead of carrying the bytes; results are written back to a slice per
// distinct request. Requests in flight at once that reuse a payload share its
// result slice: the load generator measures the calls and never reads
// results, so their last writer wins.
//
// Thread safety: Create and the destructor on one thread; the requests it
// returns are plain messages.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/sampler_client.h"

namespace flashsampler::load {

class RegionTransport {
 public:
  // `kind`: "shm" or "cuda_ipc" (CUDA builds, device `cuda_device`). Rewrites
  // `requests` (hidden_states.data moved into the region) in place and
  // registers the region through `client`, which must outlive this object.
  static absl::StatusOr<std::unique_ptr<RegionTransport>> Create(const std::string& kind,
                                                                 SamplerClient* client, int cuda_device,
                                                                 std::vector<v1::SampleRequest>* requests);
  ~RegionTransport();  // unregisters the region, then frees the memory

  class Memory;  // the bytes behind the region (region_transport.cc)

 private:
  RegionTransport(SamplerClient* client, std::string name, std::unique_ptr<Memory> memory);

  SamplerClient* const client_;
  const std::string name_;
  std::unique_ptr<Memory> memory_;
};

}  // namespace flashsampler::load
