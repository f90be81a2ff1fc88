#include "server/api/sampler_service.h"

#include <chrono>
#include <memory>
#include <vector>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/api/status_mapping.h"
#include "server/api/wire_upload.h"

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
// finds the reactor alive. The reactor is the SampleCall of each message in
// turn, so a message allocates nothing of its own: the parsed request's
// buffers are reused from the previous message.
//
// Draining (SIGTERM): an idle stream (a read pending, nothing in flight) is
// finished at once with UNAVAILABLE, which gRPC allows with a read pending
// (that read then completes with ok = false); a busy stream is finished the
// same way right after its current response is written. So open streams never
// hold the drain until the grace period.
class SampleStreamReactor final
    : public grpc::ServerBidiReactor<v1::SampleRequest, v1::SampleResponse>,
      public SampleCall {
 public:
  SampleStreamReactor(SamplerService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    response = &response_;
    method = RpcMethod::kSampleStream;
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
    service_->StartSample(SamplerService::ScopeOf(context_), request_, this);
  }

  // The message's answer (SampleCall): its response, or the error that ends
  // the stream.
  void Answer(grpc::Status status) override {
    if (!status.ok()) {
      MarkFinished();
      Finish(status);
      return;
    }
    StartWrite(&response_);
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
  refusing_.store(true);
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
  absl::MutexLock lock(&idle_mu_);
  auto idle = [this] { return inflight_.load() == 0; };
  return idle_mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

SamplerService::SamplerService(DynamicBatcher* batcher, RequestLimits limits,
                               ServerMetrics* metrics, MemoryRegions* regions)
    : batcher_(batcher), limits_(limits), metrics_(metrics), regions_(regions) {}

uint64_t SamplerService::DrawSeed() {
  absl::MutexLock lock(&seed_mu_);
  return absl::Uniform<uint64_t>(seed_gen_);
}

grpc::Status SamplerService::Admit(bool* in_flight) {
  if (metrics_ != nullptr) metrics_->RequestStarted();
  inflight_.fetch_add(1);
  *in_flight = true;
  if (refusing_.load()) {
    *in_flight = false;
    Finished();  // draining: not counted, the drain need not wait for it
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "server is shutting down; the request was not processed");
  }
  // From here the request is counted in flight until its answer is sent,
  // refused or not.
  if (!batcher_->ready()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "model is not loaded or not serving");
  }
  return grpc::Status::OK;
}

void SamplerService::Refused(RpcMethod method, absl::Time start, grpc::StatusCode code) {
  Answering(method, start, 0, code);
}

void SamplerService::Answering(RpcMethod method, absl::Time start, int64_t rows,
                               grpc::StatusCode code) {
  if (metrics_ != nullptr) metrics_->RequestFinished(method, code, rows, absl::Now() - start);
}

void SamplerService::Finished() {
  // The last answer of a drain wakes WaitUntilIdle: taking idle_mu_ makes it
  // re-evaluate its condition. Outside a drain nobody waits, so no lock.
  if (inflight_.fetch_sub(1) == 1 && refusing_.load()) {
    absl::MutexLock lock(&idle_mu_);
  }
}

void SamplerService::AnswerSample(SampleCall* call, grpc::Status status) {
  Answering(call->method, call->start, call->parsed.batch.rows, status.error_code());
  // The response is built and the batcher is done with the batch: a stream's
  // or a local connection's request lets go of its regions, staging and
  // uploads now (an unregistered region closes), not at its next message.
  ClearParsedSampleRequest(&call->parsed);
  call->Answer(std::move(status));  // may delete `call` (a unary call)
  Finished();
}

SamplerService::CallScope SamplerService::ScopeOf(grpc::CallbackServerContext* context) {
  const std::chrono::system_clock::time_point deadline = context->deadline();
  CallScope scope;
  // gRPC reports "no deadline" as the largest time_point.
  if (deadline != std::chrono::system_clock::time_point::max()) scope.deadline = absl::FromChrono(deadline);
  scope.cancelled = [context] { return context->IsCancelled(); };  // one pointer: kept inline
  return scope;
}

void SamplerService::SubmitBatch(CallScope scope, const SampleBatch* batch,
                                 DynamicBatcher::Done on_result, std::function<void()> admitted) {
  batcher_->Submit(batch, std::move(on_result), scope.deadline, std::move(scope.cancelled),
                   std::move(admitted));
}

void SamplerService::StartSample(CallScope scope, const v1::SampleRequest& request,
                                 SampleCall* call) {
  call->start = absl::Now();
  bool in_flight = false;
  if (grpc::Status refusal = Admit(&in_flight); !refusal.ok()) {
    Refused(call->method, call->start, refusal.error_code());
    call->Answer(std::move(refusal));  // may delete `call`
    if (in_flight) Finished();
    return;
  }
  const DynamicBatcher::EngineInput input = batcher_->engine_input();
  // An engine that takes fp32: rows in the weights' 16-bit dtype stay in the
  // message (alive until the answer) and the batcher widens them.
  if (absl::Status s = ParseSampleRequestInto(request, input.shape, limits_, [this] { return DrawSeed(); },
                                              regions_, input.wire.has_value() ? &*input.wire : nullptr,
                                              &call->parsed, /*widen_in_batcher=*/!input.wire.has_value());
      !s.ok()) {
    AnswerSample(call, ToGrpcStatus(s));
    return;
  }
  // An engine that copies to its GPU from request threads (the CUDA engine)
  // gets the admitted request's large pinned runs started here, before the
  // request joins the queue (server/api/wire_upload.h), when a launch is
  // running: the request waits for it, and its copy overlaps that kernel. A
  // request admitted while the engine is idle is launched at once, its copy
  // in the launch's one batched copy (an upload there would only add its
  // calls and a cross-stream wait).
  std::function<void()> admitted;
  if (input.wire.has_value() && input.wire->upload != nullptr &&
      HasWireUploadCandidates(*input.wire->upload, input.shape.hidden_size, call->parsed.batch)) {
    // Two pointers (inline in the std::function); the engine, once set, is
    // the batcher's for good, so its input is the same when this runs.
    admitted = [this, call] {
      if (!batcher_->launch_running()) return;
      const DynamicBatcher::EngineInput engine = batcher_->engine_input();
      const WireUploads started =
          StartWireUploads(*engine.wire->upload, engine.shape.hidden_size, &call->parsed.batch);
      if (metrics_ != nullptr && started.runs > 0) metrics_->RecordUploads(started.runs, started.bytes);
    };
  }
  // Two pointers: std::function keeps them inline, no allocation.
  SubmitBatch(std::move(scope), &call->parsed.batch, [this, call](absl::StatusOr<SampleResult> result) {
    if (!result.ok()) {
      AnswerSample(call, ToGrpcStatus(result.status()));
      return;
    }
    AnswerSample(call, ToGrpcStatus(FillSampleResponse(call->parsed, *result, call->response)));
  }, std::move(admitted));
}

grpc::ServerUnaryReactor* SamplerService::Verify(grpc::CallbackServerContext* context,
                                                 const v1::VerifyRequest* request,
                                                 v1::VerifyResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  bool in_flight = false;
  if (grpc::Status refusal = Admit(&in_flight); !refusal.ok()) {
    Refused(RpcMethod::kVerify, start, refusal.error_code());
    reactor->Finish(std::move(refusal));
    if (in_flight) Finished();
    return reactor;
  }
  // The parsed batch must outlive the batcher job; the callback owns it.
  auto parsed = std::make_shared<ParsedVerifyRequest>();
  auto answer = [this, reactor, start](int64_t rows, grpc::Status status) {
    Answering(RpcMethod::kVerify, start, rows, status.error_code());
    reactor->Finish(std::move(status));
    Finished();
  };
  absl::StatusOr<ParsedVerifyRequest> p =
      ParseVerifyRequest(*request, batcher_->shape(), limits_, [this] { return DrawSeed(); });
  if (!p.ok()) {
    answer(0, ToGrpcStatus(p.status()));
    return reactor;
  }
  *parsed = *std::move(p);
  SubmitBatch(ScopeOf(context), &parsed->batch,
              [parsed, response, answer](absl::StatusOr<SampleResult> result) {
                if (!result.ok()) {
                  answer(parsed->batch.rows, ToGrpcStatus(result.status()));
                  return;
                }
                FillVerifyResponse(*parsed, *result, response);
                answer(parsed->batch.rows, grpc::Status::OK);
              });
  return reactor;
}

namespace {

// A unary Sample call: owns its parsed request until the answer, then goes.
class UnarySampleCall final : public SampleCall {
 public:
  UnarySampleCall(grpc::ServerUnaryReactor* reactor, v1::SampleResponse* out) : reactor_(reactor) {
    response = out;
    method = RpcMethod::kSample;
  }
  void Answer(grpc::Status status) override {
    reactor_->Finish(std::move(status));
    delete this;
  }

 private:
  grpc::ServerUnaryReactor* const reactor_;
};

}  // namespace

grpc::ServerUnaryReactor* SamplerService::Sample(grpc::CallbackServerContext* context,
                                                 const v1::SampleRequest* request,
                                                 v1::SampleResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  StartSample(ScopeOf(context), *request, new UnarySampleCall(reactor, response));
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
  out->set_read_in_place(d.read_in_place);
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
  } else if (!batcher_->ready()) {
    // The regions learn the engine's GPUs when it is loaded: before that a
    // shared-memory region would never be mapped for the GPU to read in
    // place, and a CUDA IPC one would be refused as on a device the engine
    // does not use. Both are for later, as is any request.
    status = absl::UnavailableError(
        "the server is not serving (its LM head is still loading, or its engine failed); "
        "register regions once health reports SERVING");
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
