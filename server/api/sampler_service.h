// SamplerService: the flashsampler.v1.Sampler gRPC service (callback API).
//
// Each RPC is validated on the gRPC thread (ParseSampleRequest, or
// ParseVerifyRequest for Verify, whose rows the batcher treats like Sample
// rows and whose response the verify finalizer assembles), handed to the
// DynamicBatcher with the call's deadline and cancellation, and finished from
// the batcher's callback, so no gRPC thread blocks on compute. SampleStream handles one request at a time per stream,
// which keeps responses in request order; a request that fails, whatever the
// reason (invalid, queue full, deadline, engine error), ends the stream with
// its status. Errors are mapped to gRPC codes once, by ToGrpcStatus.
// On shutdown, BeginDrain closes open streams (UNAVAILABLE) as soon as they are
// idle, so the drain waits only for real work.
//
// Every finished request (unary call, stream message or Verify) is counted in
// ServerMetrics by method and status code (Verify's rows: its positions).
//
// A Sample request costs no lock of the service's and no heap allocation of
// its own on the way in and out (the in-flight count is atomic; the batcher
// callback captures two pointers, which std::function stores inline): a
// stream message is the hot path, thousands a second per core.
//
// Thread safety: gRPC calls the methods concurrently; the service holds
// immutable configuration, the batcher, the metrics, a mutex-guarded seed
// generator, an atomic in-flight count and a mutex-guarded registry of open
// streams.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "flashsampler/v1/sampler.grpc.pb.h"
#include "server/api/request_parser.h"
#include "server/api/verify_request.h"
#include "server/batching/dynamic_batcher.h"
#include "server/regions/memory_regions.h"
#include "server/telemetry/metrics.h"

namespace flashsampler {

class SampleStreamReactor;

// One Sample request (a unary call, or one message of a stream) from
// admission to answer. Its owner keeps it alive until Answer has run: the
// unary call deletes it there; a stream reactor is one and reuses it (and
// `parsed`'s buffers) for every message, one at a time.
class SampleCall {
 public:
  virtual ~SampleCall() = default;
  // Exactly once per StartSample: OK when `response` holds the answer, else
  // the error that ends the call.
  virtual void Answer(grpc::Status status) = 0;

  ParsedSampleRequest parsed;
  v1::SampleResponse* response = nullptr;
  RpcMethod method = RpcMethod::kSample;
  absl::Time start;  // receipt, for the duration metric
};

class SamplerService final : public v1::Sampler::CallbackService {
 public:
  // `metrics` may be null (nothing is recorded). `regions` may be null: the
  // region RPCs then answer FAILED_PRECONDITION, as do requests naming one.
  SamplerService(DynamicBatcher* batcher, RequestLimits limits, ServerMetrics* metrics,
                 MemoryRegions* regions = nullptr);

  grpc::ServerUnaryReactor* Sample(grpc::CallbackServerContext* context,
                                   const v1::SampleRequest* request,
                                   v1::SampleResponse* response) override;
  grpc::ServerBidiReactor<v1::SampleRequest, v1::SampleResponse>* SampleStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context,
                                   const v1::VerifyRequest* request,
                                   v1::VerifyResponse* response) override;
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* context,
                                           const v1::RegisterRegionRequest* request,
                                           v1::RegisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* context,
                                             const v1::UnregisterRegionRequest* request,
                                             v1::UnregisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* context,
                                        const v1::ListRegionsRequest* request,
                                        v1::ListRegionsResponse* response) override;

  // Shutdown, first step: new Sample / Verify requests (unary or stream messages) are
  // refused with UNAVAILABLE, idle streams are finished now with UNAVAILABLE,
  // busy ones right after their current response, and new streams are
  // refused, so Server::Shutdown only waits for real work. Requests already
  // accepted are answered normally.
  void BeginDrain();
  // Waits until no accepted Sample request is unanswered, or `deadline`;
  // true when idle.
  bool WaitUntilIdle(absl::Time deadline);

  // The stream reactors' registry (for BeginDrain). RegisterStream returns
  // false once draining has begun.
  bool RegisterStream(SampleStreamReactor* stream);
  void UnregisterStream(SampleStreamReactor* stream);

  // What the batcher needs to know of a request's caller: its deadline
  // (InfiniteFuture: none) and a cheap, thread-safe probe that says whether
  // the caller went away (null: never). A gRPC call's come from its
  // context; the local channel's from its frame and its connection.
  struct CallScope {
    absl::Time deadline = absl::InfiniteFuture();
    std::function<bool()> cancelled;
  };
  static CallScope ScopeOf(grpc::CallbackServerContext* context);

  // Validates `request` and, when valid and the model is loaded, queues it;
  // `call->Answer` gets the status, with `call->response` filled when OK.
  // `call->method` labels the request in the metrics. `request` must stay
  // alive and unchanged until `call->Answer` has run. Exposed for the stream
  // reactor and the local channel (server/local/).
  void StartSample(CallScope scope, const v1::SampleRequest& request, SampleCall* call);

 private:
  uint64_t DrawSeed();
  // Admission shared by Sample, stream messages and Verify: counts the
  // request as started in the metrics and in flight. Returns OK when it is
  // accepted, else the refusal (UNAVAILABLE: draining, or the model is not
  // loaded), which the caller answers with Refused. When `*in_flight` is
  // set (accepted, or refused for the model), Finished must follow the
  // answer exactly once; a refusal by the drain is not waited for.
  grpc::Status Admit(bool* in_flight);
  // The answer of a refused request: the metrics only.
  void Refused(RpcMethod method, absl::Time start, grpc::StatusCode code);
  // Around the answer of an accepted request: Answering records the metrics
  // (`rows` counted when OK) before the reply leaves, Finished counts it out
  // of flight after, so WaitUntilIdle returns only once every reply is sent.
  void Answering(RpcMethod method, absl::Time start, int64_t rows, grpc::StatusCode code);
  void Finished();
  // Answers `call` (an accepted request) with `status`.
  void AnswerSample(SampleCall* call, grpc::Status status);
  // Hands a parsed batch to the batcher with the call's deadline and
  // cancellation (and `admitted`: DynamicBatcher::Submit's).
  void SubmitBatch(CallScope scope, const SampleBatch* batch, DynamicBatcher::Done on_result,
                   std::function<void()> admitted = nullptr);

  DynamicBatcher* const batcher_;
  const RequestLimits limits_;
  ServerMetrics* const metrics_;
  MemoryRegions* const regions_;
  absl::Mutex seed_mu_;
  absl::BitGen seed_gen_ ABSL_GUARDED_BY(seed_mu_);
  // Accepted, unanswered requests, and whether BeginDrain was called. Both
  // sequentially consistent: Admit increments, then reads refusing_; BeginDrain
  // sets refusing_, then WaitUntilIdle reads the count; so a request is either
  // refused or counted by the drain. idle_mu_ only lets WaitUntilIdle sleep:
  // Finished takes it when the count drops to 0 during a drain.
  std::atomic<int64_t> inflight_{0};
  std::atomic<bool> refusing_{false};
  absl::Mutex idle_mu_;
  absl::Mutex streams_mu_;
  absl::flat_hash_set<SampleStreamReactor*> streams_ ABSL_GUARDED_BY(streams_mu_);
  bool draining_ ABSL_GUARDED_BY(streams_mu_) = false;
};

}  // namespace flashsampler
