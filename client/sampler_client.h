// SamplerClient: a blocking C++ client for flashsampler-server.
//
// Wraps the generated stubs with absl::Status results (gRPC codes carried over
// unchanged) and helpers to pack hidden states into the wire Tensor.
//
// Thread safety: one SamplerClient may be used from many threads at once (gRPC
// channels and stubs are thread-safe). Every call blocks until the server
// answers or `timeout` passes (DEADLINE_EXCEEDED). With TLS, a failed
// handshake is UNAVAILABLE; a missing or wrong bearer token UNAUTHENTICATED.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/channel_security.h"
#include "flashsampler/v1/sampler.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace flashsampler {

class SamplerClient {
 public:
  // Connects lazily (the first call dials). `max_message_bytes` bounds
  // requests and responses on this side.
  explicit SamplerClient(const std::string& address, int max_message_bytes = 256 << 20);
  // The same over TLS / mTLS and with a bearer token on every call.
  SamplerClient(const std::string& address, ChannelSecurity security,
                int max_message_bytes = 256 << 20);

  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& request,
                                            absl::Duration timeout = absl::Seconds(60));

  // Speculative verification (sampler.proto's Verify).
  absl::StatusOr<v1::VerifyResponse> Verify(const v1::VerifyRequest& request,
                                            absl::Duration timeout = absl::Seconds(60));

  // Sends every request on one SampleStream and returns the responses in order.
  // If the server ends the stream with an error, that status is returned.
  absl::StatusOr<std::vector<v1::SampleResponse>> SampleStream(
      const std::vector<v1::SampleRequest>& requests, absl::Duration timeout = absl::Seconds(60));

  absl::StatusOr<v1::ModelInfo> GetModelInfo(absl::Duration timeout = absl::Seconds(10));

  // Memory regions (sampler.proto's RegisterRegion): a POSIX shared-memory
  // object `key` (e.g. a SharedMemoryBuffer's), or a CUDA IPC handle (the 64
  // bytes of a cudaIpcMemHandle_t) of a buffer on `device_id`. A request then
  // names a slice of the region in hidden_states_region / output_region.
  absl::Status RegisterSystemSharedMemory(const std::string& name, const std::string& key,
                                          uint64_t byte_size, uint64_t offset = 0,
                                          absl::Duration timeout = absl::Seconds(10));
  absl::Status RegisterCudaIpc(const std::string& name, const std::string& ipc_handle,
                               int device_id, uint64_t byte_size, uint64_t offset = 0,
                               absl::Duration timeout = absl::Seconds(10));
  absl::Status UnregisterRegion(const std::string& name, absl::Duration timeout = absl::Seconds(10));
  absl::StatusOr<v1::ListRegionsResponse> ListRegions(absl::Duration timeout = absl::Seconds(10));

  // grpc.health.v1 Check for `service` ("" = the whole server).
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> CheckHealth(
      const std::string& service = "", absl::Duration timeout = absl::Seconds(10));

 private:
  void Prepare(grpc::ClientContext* context, absl::Duration timeout) const;
  // RegisterRegion with `request`'s memory (system or cuda_ipc) already set.
  absl::Status RegisterRegion(const std::string& name, uint64_t byte_size, v1::RegisterRegionRequest request,
                              absl::Duration timeout);

  ChannelSecurity security_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Sampler::Stub> sampler_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

// Packs row-major fp32 values [rows, cols] into a Tensor of `dtype`
// (FP32 as is; FP16/BF16 rounded to nearest even).
v1::Tensor MakeHiddenStates(const std::vector<float>& values, int64_t rows, int64_t cols,
                            v1::DType dtype);

absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace flashsampler
