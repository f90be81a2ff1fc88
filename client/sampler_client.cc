#include "client/sampler_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "kernels/common/half_precision.h"

namespace flashsampler {
absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

SamplerClient::SamplerClient(const std::string& address, int max_message_bytes)
    : SamplerClient(address, ChannelSecurity(), max_message_bytes) {}

SamplerClient::SamplerClient(const std::string& address, ChannelSecurity security,
                             int max_message_bytes)
    : security_(std::move(security)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  channel_ = MakeSecureChannel(address, security_, args);
  sampler_ = v1::Sampler::NewStub(channel_);
  health_ = grpc::health::v1::Health::NewStub(channel_);
}

void SamplerClient::Prepare(grpc::ClientContext* context, absl::Duration timeout) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  security_.Apply(context);
}

absl::StatusOr<v1::SampleResponse> SamplerClient::Sample(const v1::SampleRequest& request,
                                                         absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(&context, timeout);
  v1::SampleResponse response;
  grpc::Status status = sampler_->Sample(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::VerifyResponse> SamplerClient::Verify(const v1::VerifyRequest& request,
                                                         absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(&context, timeout);
  v1::VerifyResponse response;
  grpc::Status status = sampler_->Verify(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<std::vector<v1::SampleResponse>> SamplerClient::SampleStream(
    const std::vector<v1::SampleRequest>& requests, absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(&context, timeout);
  auto stream = sampler_->SampleStream(&context);
  std::vector<v1::SampleResponse> responses;
  // The server answers strictly one request at a time, so write-then-read keeps
  // at most one message in flight each way.
  for (const v1::SampleRequest& request : requests) {
    if (!stream->Write(request)) break;
    v1::SampleResponse response;
    if (!stream->Read(&response)) break;
    responses.push_back(std::move(response));
  }
  stream->WritesDone();
  v1::SampleResponse extra;
  while (stream->Read(&extra)) responses.push_back(std::move(extra));
  grpc::Status status = stream->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  if (responses.size() != requests.size()) {
    return absl::DataLossError("stream ended with fewer responses than requests");
  }
  return responses;
}

absl::Status SamplerClient::RegisterSystemSharedMemory(const std::string& name, const std::string& key,
                                                       uint64_t byte_size, uint64_t offset,
                                                       absl::Duration timeout) {
  v1::RegisterRegionRequest request;
  request.mutable_system()->set_key(key);
  request.mutable_system()->set_offset(offset);
  return RegisterRegion(name, byte_size, std::move(request), timeout);
}

absl::Status SamplerClient::RegisterCudaIpc(const std::string& name, const std::string& ipc_handle,
                                            int device_id, uint64_t byte_size, uint64_t offset,
                                            absl::Duration timeout) {
  v1::RegisterRegionRequest request;
  request.mutable_cuda_ipc()->set_ipc_handle(ipc_handle);
  request.mutable_cuda_ipc()->set_device_id(device_id);
  request.mutable_cuda_ipc()->set_offset(offset);
  return RegisterRegion(name, byte_size, std::move(request), timeout);
}

absl::Status SamplerClient::RegisterRegion(const std::string& name, uint64_t byte_size,
                                           v1::RegisterRegionRequest request, absl::Duration timeout) {
  request.set_name(name);
  request.set_byte_size(byte_size);
  grpc::ClientContext context;
  Prepare(&context, timeout);
  v1::RegisterRegionResponse response;
  return FromGrpcStatus(sampler_->RegisterRegion(&context, request, &response));
}

absl::Status SamplerClient::UnregisterRegion(const std::string& name, absl::Duration timeout) {
  v1::UnregisterRegionRequest request;
  request.set_name(name);
  grpc::ClientContext context;
  Prepare(&context, timeout);
  v1::UnregisterRegionResponse response;
  return FromGrpcStatus(sampler_->UnregisterRegion(&context, request, &response));
}

absl::StatusOr<v1::ListRegionsResponse> SamplerClient::ListRegions(absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(&context, timeout);
  v1::ListRegionsResponse response;
  grpc::Status status = sampler_->ListRegions(&context, v1::ListRegionsRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::ModelInfo> SamplerClient::GetModelInfo(absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(&context, timeout);
  v1::ModelInfo info;
  grpc::Status status = sampler_->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
  if (!status.ok()) return FromGrpcStatus(status);
  return info;
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> SamplerClient::CheckHealth(
    const std::string& service, absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(&context, timeout);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = health_->Check(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.status();
}

v1::Tensor MakeHiddenStates(const std::vector<float>& values, int64_t rows, int64_t cols,
                            v1::DType dtype) {
  v1::Tensor t;
  t.set_dtype(dtype);
  t.add_shape(rows);
  t.add_shape(cols);
  std::string* data = t.mutable_data();
  if (dtype == v1::DTYPE_FP32) {
    data->resize(values.size() * sizeof(float));
    std::memcpy(data->data(), values.data(), data->size());
    return t;
  }
  data->resize(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = dtype == v1::DTYPE_BF16 ? FloatToBf16(values[i]) : FloatToFp16(values[i]);
    std::memcpy(data->data() + 2 * i, &bits, 2);
  }
  return t;
}

}  // namespace flashsampler
