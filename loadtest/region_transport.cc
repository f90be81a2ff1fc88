#include "loadtest/region_transport.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/shared_memory_buffer.h"

#ifdef FLASHSAMPLER_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace flashsampler::load {

class RegionTransport::Memory {
 public:
  virtual ~Memory() = default;
  // Copies `size` host bytes to `offset`.
  virtual absl::Status Put(uint64_t offset, const void* src, size_t size) = 0;
  // Registers the memory as region `name` of `size` bytes.
  virtual absl::Status Register(SamplerClient* client, const std::string& name, uint64_t size) = 0;
};

namespace {

class SystemMemory final : public RegionTransport::Memory {
 public:
  explicit SystemMemory(std::unique_ptr<SharedMemoryBuffer> buffer) : buffer_(std::move(buffer)) {}
  absl::Status Put(uint64_t offset, const void* src, size_t size) override {
    std::memcpy(buffer_->data() + offset, src, size);
    return absl::OkStatus();
  }
  absl::Status Register(SamplerClient* client, const std::string& name, uint64_t size) override {
    return client->RegisterSystemSharedMemory(name, buffer_->key(), size);
  }

 private:
  std::unique_ptr<SharedMemoryBuffer> buffer_;
};

#ifdef FLASHSAMPLER_HAVE_CUDA
class DeviceMemory final : public RegionTransport::Memory {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceMemory>> Allocate(int device, uint64_t size) {
    if (cudaSetDevice(device) != cudaSuccess) return absl::InvalidArgumentError("cudaSetDevice failed");
    void* p = nullptr;
    if (cudaError_t err = cudaMalloc(&p, size); err != cudaSuccess) {
      return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc: ", cudaGetErrorString(err)));
    }
    return std::unique_ptr<DeviceMemory>(new DeviceMemory(device, p));
  }
  ~DeviceMemory() override { cudaFree(ptr_); }
  absl::Status Put(uint64_t offset, const void* src, size_t size) override {
    if (cudaError_t err = cudaMemcpy(static_cast<char*>(ptr_) + offset, src, size, cudaMemcpyHostToDevice);
        err != cudaSuccess) {
      return absl::InternalError(absl::StrCat("cudaMemcpy: ", cudaGetErrorString(err)));
    }
    return absl::OkStatus();
  }
  absl::Status Register(SamplerClient* client, const std::string& name, uint64_t size) override {
    cudaIpcMemHandle_t handle;
    if (cudaError_t err = cudaIpcGetMemHandle(&handle, ptr_); err != cudaSuccess) {
      return absl::InternalError(absl::StrCat("cudaIpcGetMemHandle: ", cudaGetErrorString(err)));
    }
    return client->RegisterCudaIpc(name, std::string(reinterpret_cast<const char*>(&handle), sizeof handle),
                                   device_, size);
  }

 private:
  DeviceMemory(int device, void* ptr) : device_(device), ptr_(ptr) {}
  const int device_;
  void* const ptr_;
};
#endif

}  // namespace

RegionTransport::RegionTransport(SamplerClient* client, std::string name, std::unique_ptr<Memory> memory)
    : client_(client), name_(std::move(name)), memory_(std::move(memory)) {}

RegionTransport::~RegionTransport() {
  if (absl::Status s = client_->UnregisterRegion(name_); !s.ok()) {
    std::fprintf(stderr, "flashsampler-load: unregistering region %s: %s\n", name_.c_str(),
                 s.ToString().c_str());
  }
}

absl::StatusOr<std::unique_ptr<RegionTransport>> RegionTransport::Create(
    const std::string& kind, SamplerClient* client, int cuda_device, std::vector<v1::SampleRequest>* requests) {
  // Layout: every payload, then every request's result slice (int32 tokens;
  // the load requests ask for no logz / logprobs).
  uint64_t inputs = 0;
  for (const v1::SampleRequest& r : *requests) inputs += r.hidden_states().data().size();
  uint64_t outputs = 0;
  for (const v1::SampleRequest& r : *requests) outputs += 4 * static_cast<uint64_t>(r.hidden_states().shape(0));
  const uint64_t size = inputs + outputs;
  const std::string name = absl::StrCat("flashsampler-load-", getpid());

  std::unique_ptr<Memory> memory;
  if (kind == "shm") {
    absl::StatusOr<std::unique_ptr<SharedMemoryBuffer>> buffer = SharedMemoryBuffer::Create("/" + name, size);
    if (!buffer.ok()) return buffer.status();
    memory = std::make_unique<SystemMemory>(*std::move(buffer));
  } else if (kind == "cuda_ipc") {
#ifdef FLASHSAMPLER_HAVE_CUDA
    absl::StatusOr<std::unique_ptr<DeviceMemory>> device = DeviceMemory::Allocate(cuda_device, size);
    if (!device.ok()) return device.status();
    memory = *std::move(device);
#else
    (void)cuda_device;
    return absl::FailedPreconditionError("--transport=cuda_ipc needs a CUDA build of flashsampler-load");
#endif
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown transport ", kind));
  }

  uint64_t in_at = 0;
  uint64_t out_at = inputs;
  for (v1::SampleRequest& r : *requests) {
    const std::string& data = r.hidden_states().data();
    if (absl::Status s = memory->Put(in_at, data.data(), data.size()); !s.ok()) return s;
    v1::RegionSlice* in = r.mutable_hidden_states_region();
    in->set_region(name);
    in->set_offset(in_at);
    in->set_byte_size(data.size());
    in_at += data.size();
    r.mutable_hidden_states()->clear_data();
    v1::RegionSlice* out = r.mutable_output_region();
    out->set_region(name);
    out->set_offset(out_at);
    out->set_byte_size(4 * static_cast<uint64_t>(r.hidden_states().shape(0)));
    out_at += out->byte_size();
  }
  if (absl::Status s = memory->Register(client, name, size); !s.ok()) return s;
  return std::unique_ptr<RegionTransport>(new RegionTransport(client, name, std::move(memory)));
}

}  // namespace flashsampler::load
