#include "server/api/sampler_service.h"

#include <chrono>
#include <memory>
#include <vector>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/api/status_mapping.h"

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

}  // namespace

// One bidirectional stream. Strictly one request in flight: read, sample,
// write, read again. State changes happen under mu_, and exactly one path sets
// finished_ and calls Finish. OnDone deletes the reactor; gRPC calls it only
// after Finish and after every started read/write completed, and Finish is
// never called while a sample is in flight, so the batcher callback always
// finds the reactor alive.
//
// Draining (SIGTERM): an idle stream (a read pending, nothing in flight) is
// finished at once with UNAVAILABLE, which gRPC allows with a read pending
// (that read then completes with ok = false); a busy stream is finished the
// same way right after its current response is written. So open streams never
// hold the drain until the grace period.
class SampleStreamReactor final
    : public grpc::ServerBidiReactor<v1::SampleRequest, v1::SampleResponse> {
 public:
  SampleStreamReactor(SamplerService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    if (service_->RegisterStream(this)) {
      StartRead(&request_);
    } else {
      MarkFinished();
      Finish(DrainingStatus());
    }
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;  // drained while this read was pending
      if (!ok) {              // the client half-closed (or the call was cancelled)
        finished_ = true;
      } else {
        sampling_ = true;
      }
    }
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    service_->StartSample(RpcMethod::kSampleStream, context_, request_, &parsed_, &response_, [this](grpc::Status status) {
      if (!status.ok()) {
        MarkFinished();
        Finish(status);
        return;
      }
      StartWrite(&response_);
    });
  }

  void OnWriteDone(bool ok) override {
    bool drain;
    {
      absl::MutexLock lock(&mu_);
      sampling_ = false;
      drain = draining_ || !ok;
      if (drain) finished_ = true;
    }
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed while writing"));
    } else if (drain) {
      Finish(DrainingStatus());
    } else {
      StartRead(&request_);
    }
  }

  void OnDone() override {
    service_->UnregisterStream(this);
    delete this;
  }

  // Called by SamplerService::BeginDrain with the registry locked. Returns true
  // when the stream is idle: the caller must then call FinishDrained() (after
  // unlocking); until then the reactor cannot be deleted, as Finish has not
  // been called. A busy stream finishes itself after its current write.
  bool MarkDraining() {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    if (finished_ || sampling_) return false;
    finished_ = true;
    return true;
  }
  void FinishDrained() { Finish(DrainingStatus()); }

 private:
  static grpc::Status DrainingStatus() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "server is shutting down; reconnect to continue the stream");
  }
  void MarkFinished() {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }

  SamplerService* const service_;
  grpc::CallbackServerContext* const context_;
  v1::SampleRequest request_;
  ParsedSampleRequest parsed_;
  v1::SampleResponse response_;
  absl::Mutex mu_;
  bool sampling_ ABSL_GUARDED_BY(mu_) = false;  // a request is being sampled or written
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was (or is about to be) called
};

bool SamplerService::RegisterStream(SampleStreamReactor* stream) {
  absl::MutexLock lock(&streams_mu_);
  if (draining_) return false;
  streams_.insert(stream);
  return true;
}

void SamplerService::UnregisterStream(SampleStreamReactor* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.erase(stream);
}

void SamplerService::BeginDrain() {
  {
    absl::MutexLock lock(&inflight_mu_);
    refusing_ = true;
  }
  std::vector<SampleStreamReactor*> idle;
  {
    absl::MutexLock lock(&streams_mu_);
    draining_ = true;
    for (SampleStreamReactor* stream : streams_) {
      if (stream->MarkDraining()) idle.push_back(stream);
    }
  }
  // Outside the lock: Finish may run OnDone, which unregisters.
  for (SampleStreamReactor* stream : idle) stream->FinishDrained();
}

bool SamplerService::WaitUntilIdle(absl::Time deadline) {
  absl::MutexLock lock(&inflight_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(inflight_mu_) { return inflight_ == 0; };
  return inflight_mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

SamplerService::SamplerService(DynamicBatcher* batcher, RequestLimits limits,
                               ServerMetrics* metrics, MemoryRegions* regions)
    : batcher_(batcher), limits_(limits), metrics_(metrics), regions_(regions) {}

uint64_t SamplerService::DrawSeed() {
  absl::MutexLock lock(&seed_mu_);
  return absl::Uniform<uint64_t>(seed_gen_);
}

bool SamplerService::Admit(RpcMethod method, const SampleBatch* batch,
                           std::function<void(grpc::Status)>* done) {
  if (metrics_ != nullptr) {
    metrics_->RequestStarted();
    *done = [this, method, batch, start = absl::Now(), done = std::move(*done)](grpc::Status status) {
      metrics_->RequestFinished(method, status.error_code(), batch->rows, absl::Now() - start);
      done(std::move(status));
    };
  }
  bool refused;
  {
    absl::MutexLock lock(&inflight_mu_);
    refused = refusing_;
    if (!refused) ++inflight_;
  }
  if (refused) {
    (*done)(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                         "server is shutting down; the request was not processed"));
    return false;
  }
  // From here the request is accepted: it is answered, and counted out, once.
  *done = [this, done = std::move(*done)](grpc::Status status) {
    done(std::move(status));
    absl::MutexLock lock(&inflight_mu_);
    --inflight_;
  };
  if (!batcher_->ready()) {
    (*done)(grpc::Status(grpc::StatusCode::UNAVAILABLE, "model is not loaded or not serving"));
    return false;
  }
  return true;
}

void SamplerService::SubmitBatch(grpc::CallbackServerContext* context, const SampleBatch* batch,
                                 DynamicBatcher::Done on_result) {
  const std::chrono::system_clock::time_point deadline = context->deadline();
  batcher_->Submit(
      batch, std::move(on_result),
      // gRPC reports "no deadline" as the largest time_point.
      deadline == std::chrono::system_clock::time_point::max() ? absl::InfiniteFuture()
                                                               : absl::FromChrono(deadline),
      [context] { return context->IsCancelled(); });
}

void SamplerService::StartSample(RpcMethod method, grpc::CallbackServerContext* context,
                                 const v1::SampleRequest& request, ParsedSampleRequest* parsed,
                                 v1::SampleResponse* response,
                                 std::function<void(grpc::Status)> done) {
  if (!Admit(method, &parsed->batch, &done)) return;
  const DynamicBatcher::EngineInput input = batcher_->engine_input();
  absl::StatusOr<ParsedSampleRequest> p =
      ParseSampleRequest(request, input.shape, limits_, [this] { return DrawSeed(); }, regions_,
                         input.wire.has_value() ? &*input.wire : nullptr);
  if (!p.ok()) {
    done(ToGrpcStatus(p.status()));
    return;
  }
  *parsed = *std::move(p);
  SubmitBatch(context, &parsed->batch,
              [parsed, response, done = std::move(done)](absl::StatusOr<SampleResult> result) {
                if (!result.ok()) {
                  done(ToGrpcStatus(result.status()));
                  return;
                }
                done(ToGrpcStatus(FillSampleResponse(*parsed, *result, response)));
              });
}

grpc::ServerUnaryReactor* SamplerService::Verify(grpc::CallbackServerContext* context,
                                                 const v1::VerifyRequest* request,
                                                 v1::VerifyResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The parsed batch must outlive the batcher job; the callbacks own it.
  auto parsed = std::make_shared<ParsedVerifyRequest>();
  std::function<void(grpc::Status)> done = [reactor, parsed](grpc::Status status) {
    reactor->Finish(std::move(status));
  };
  if (!Admit(RpcMethod::kVerify, &parsed->batch, &done)) return reactor;
  absl::StatusOr<ParsedVerifyRequest> p =
      ParseVerifyRequest(*request, batcher_->shape(), limits_, [this] { return DrawSeed(); });
  if (!p.ok()) {
    done(ToGrpcStatus(p.status()));
    return reactor;
  }
  *parsed = *std::move(p);
  SubmitBatch(context, &parsed->batch,
              [parsed, response, done = std::move(done)](absl::StatusOr<SampleResult> result) {
                if (!result.ok()) {
                  done(ToGrpcStatus(result.status()));
                  return;
                }
                FillVerifyResponse(*parsed, *result, response);
                done(grpc::Status::OK);
              });
  return reactor;
}

grpc::ServerUnaryReactor* SamplerService::Sample(grpc::CallbackServerContext* context,
                                                 const v1::SampleRequest* request,
                                                 v1::SampleResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The parsed batch must outlive the batcher job; the callback owns it.
  auto parsed = std::make_shared<ParsedSampleRequest>();
  StartSample(RpcMethod::kSample, context, *request, parsed.get(), response,
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
  const absl::Time start = absl::Now();
  if (metrics_ != nullptr) metrics_->RequestStarted();
  auto finish = [&](grpc::Status status) {
    if (metrics_ != nullptr) {
      metrics_->RequestFinished(RpcMethod::kGetModelInfo, status.error_code(), 0, absl::Now() - start);
    }
    reactor->Finish(std::move(status));
  };
  if (!batcher_->ready()) {
    finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "model is not loaded or not serving"));
    return reactor;
  }
  const ModelShape shape = batcher_->shape();
  response->set_vocab_size(shape.vocab_size);
  response->set_hidden_size(shape.hidden_size);
  response->set_weight_dtype(ToWireDType(shape.weight_dtype));
  response->set_valid_vocab_size(shape.valid_vocab);
  response->set_backend(batcher_->backend_name());
  response->set_max_request_rows(limits_.max_request_rows);
  finish(grpc::Status::OK);
  return reactor;
}

namespace {

void DescribeRegion(const RegionDescription& d, v1::RegionInfo* out) {
  out->set_name(d.name);
  out->set_byte_size(d.byte_size);
  if (d.kind == RegionDescription::Kind::kSystemSharedMemory) {
    out->mutable_system()->set_key(d.key);
    out->mutable_system()->set_offset(d.offset);
  } else {
    out->mutable_cuda_ipc()->set_device_id(d.device_id);
    out->mutable_cuda_ipc()->set_offset(d.offset);
  }
}

absl::Status RegionsOff() {
  return absl::FailedPreconditionError("this server does not serve memory regions");
}

}  // namespace

// The region RPCs run on the gRPC thread: registering opens the memory
// (shm_open, or cudaIpcOpenMemHandle), a few system calls.
grpc::ServerUnaryReactor* SamplerService::RegisterRegion(grpc::CallbackServerContext* context,
                                                         const v1::RegisterRegionRequest* request,
                                                         v1::RegisterRegionResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status;
  if (regions_ == nullptr) {
    status = RegionsOff();
  } else if (request->has_system()) {
    status = regions_->RegisterSystemSharedMemory(request->name(), request->system().key(),
                                                  request->system().offset(), request->byte_size());
  } else if (request->has_cuda_ipc()) {
    status = regions_->RegisterCudaIpc(request->name(), request->cuda_ipc().ipc_handle(),
                                       request->cuda_ipc().device_id(), request->cuda_ipc().offset(),
                                       request->byte_size());
  } else {
    status = absl::InvalidArgumentError("RegisterRegionRequest needs system or cuda_ipc memory");
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* SamplerService::UnregisterRegion(grpc::CallbackServerContext* context,
                                                           const v1::UnregisterRegionRequest* request,
                                                           v1::UnregisterRegionResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(regions_ == nullptr ? RegionsOff() : regions_->Unregister(request->name())));
  return reactor;
}

grpc::ServerUnaryReactor* SamplerService::ListRegions(grpc::CallbackServerContext* context,
                                                      const v1::ListRegionsRequest* /*request*/,
                                                      v1::ListRegionsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (regions_ == nullptr) {
    reactor->Finish(ToGrpcStatus(RegionsOff()));
    return reactor;
  }
  for (const RegionDescription& d : regions_->List()) DescribeRegion(d, response->add_regions());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace flashsampler
