#include "server/sampler_service.h"

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "server/status_mapping.h"

namespace flashsampler {
namespace {

v1::DType ToWireDType(WeightDType d) {
  switch (d) {
    case WeightDType::kFloat32: return v1::DTYPE_FP32;
    case WeightDType::kFloat16: return v1::DTYPE_FP16;
    case WeightDType::kBFloat16: return v1::DTYPE_BF16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

// One bidirectional stream. Strictly one request in flight: read, sample,
// write, read again. OnDone deletes the reactor; gRPC calls it only after
// Finish and after every started read/write completed, and Finish is never
// called while a sample is in flight, so the executor callback always finds
// the reactor alive.
class SampleStreamReactor final
    : public grpc::ServerBidiReactor<v1::SampleRequest, v1::SampleResponse> {
 public:
  SampleStreamReactor(SamplerService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed (or the call was cancelled)
      Finish(grpc::Status::OK);
      return;
    }
    service_->StartSample(context_, request_, &parsed_, &response_, [this](grpc::Status status) {
      if (!status.ok()) {
        Finish(status);
        return;
      }
      StartWrite(&response_);
    });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed while writing"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  SamplerService* const service_;
  grpc::CallbackServerContext* const context_;
  v1::SampleRequest request_;
  ParsedSampleRequest parsed_;
  v1::SampleResponse response_;
};

}  // namespace

SamplerService::SamplerService(SampleExecutor* executor, RequestLimits limits)
    : executor_(executor), limits_(limits) {}

uint64_t SamplerService::DrawSeed() {
  absl::MutexLock lock(&seed_mu_);
  return absl::Uniform<uint64_t>(seed_gen_);
}

void SamplerService::StartSample(grpc::CallbackServerContext* context,
                                 const v1::SampleRequest& request, ParsedSampleRequest* parsed,
                                 v1::SampleResponse* response,
                                 std::function<void(grpc::Status)> done) {
  if (!executor_->ready()) {
    done(grpc::Status(grpc::StatusCode::UNAVAILABLE, "model is not loaded or not serving"));
    return;
  }
  absl::StatusOr<ParsedSampleRequest> p =
      ParseSampleRequest(request, executor_->shape(), limits_, [this] { return DrawSeed(); });
  if (!p.ok()) {
    done(ToGrpcStatus(p.status()));
    return;
  }
  *parsed = *std::move(p);
  executor_->Submit(&parsed->batch, [parsed, response, done = std::move(done)](
                                        absl::StatusOr<SampleResult> result) {
    if (!result.ok()) {
      done(ToGrpcStatus(result.status()));
      return;
    }
    FillSampleResponse(*parsed, *result, response);
    done(grpc::Status::OK);
  }, [context] { return context->IsCancelled(); });
}

grpc::ServerUnaryReactor* SamplerService::Sample(grpc::CallbackServerContext* context,
                                                 const v1::SampleRequest* request,
                                                 v1::SampleResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The parsed batch must outlive the executor job; the callback owns it.
  auto parsed = std::make_shared<ParsedSampleRequest>();
  StartSample(context, *request, parsed.get(), response,
              [reactor, parsed](grpc::Status status) { reactor->Finish(std::move(status)); });
  return reactor;
}

grpc::ServerBidiReactor<v1::SampleRequest, v1::SampleResponse>* SamplerService::SampleStream(
    grpc::CallbackServerContext* context) {
  return new SampleStreamReactor(this, context);
}

grpc::ServerUnaryReactor* SamplerService::GetModelInfo(grpc::CallbackServerContext* context,
                                                       const v1::GetModelInfoRequest* /*request*/,
                                                       v1::ModelInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!executor_->ready()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "model is not loaded or not serving"));
    return reactor;
  }
  const ModelShape shape = executor_->shape();
  response->set_vocab_size(shape.vocab_size);
  response->set_hidden_size(shape.hidden_size);
  response->set_weight_dtype(ToWireDType(shape.weight_dtype));
  response->set_valid_vocab_size(shape.valid_vocab);
  response->set_backend(executor_->backend_name());
  response->set_max_batch_rows(limits_.max_batch_rows);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace flashsampler
