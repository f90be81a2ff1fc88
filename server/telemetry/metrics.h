// ServerMetrics: what the server tells operators, as Prometheus metrics
// (prometheus-cpp's metric types and text format), served on a separate HTTP
// address at /metrics by MetricsHttpServer.
//
// Families (prefix flashsampler_, base units, bounded label values only):
//   requests_total{method,code}          counter, one per finished RPC / stream message
//   rows_total{method}                   counter, rows of successfully answered requests
//   request_duration_seconds{method}     histogram, receipt to answer
//   queue_duration_seconds               histogram, admission to first launch
//   compute_duration_seconds             histogram, one Engine::Sample launch
//   batch_rows                           histogram, rows per launch (coalescing)
//   queue_rows                           gauge, rows waiting for a launch
//   queue_capacity_rows                  gauge, rows the queue admits (--max_queue_rows)
//   uploads_total                        counter, hidden-state runs copied to the GPU on arrival
//   uploaded_bytes_total                 counter, their bytes (--cuda_upload_min_bytes)
//   serving                              gauge, 1 while health reports SERVING
//   inflight_requests                    gauge, requests received and not yet answered
//   device_memory_used_bytes{device}     gauge, read from the engine at scrape time
//   device_memory_total_bytes{device}    gauge (CUDA engine; the CPU engine reports none)
//   model_info{backend,dtype,vocab_size,valid_vocab,hidden_size,shards}  gauge = 1
// Duration buckets run from 50 us to 10 s; batch_rows buckets are the powers
// of two up to max_batch_rows.
//
// Thread safety: every method may be called from any thread at any time
// (prometheus-cpp metrics are atomic; families lock internally).
// Outcomes: Serve returns the bound port, or Unavailable when the address
// cannot be bound; everything else cannot fail.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/status.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"

namespace flashsampler {

// What a request came as: a gRPC method, or a Sample request over the local
// channel (server/local/local_channel_server.h).
enum class RpcMethod { kSample, kSampleStream, kGetModelInfo, kVerify, kLocalSample };

class ServerMetrics {
 public:
  explicit ServerMetrics(int64_t max_batch_rows);
  ~ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // The service: a request was received / answered with `code`; `rows` are
  // counted only for OK answers.
  void RequestStarted();
  void RequestFinished(RpcMethod method, grpc::StatusCode code, int64_t rows,
                       absl::Duration elapsed);

  // The batcher.
  void RecordQueueWait(double seconds);
  // One engine launch: its rows, duration and kernel path (LaunchPathName, or
  // "error" for a failed launch).
  void RecordLaunch(int64_t rows, double compute_seconds, const std::string& path);
  void SetQueueRows(int64_t rows);
  // Runs of an admitted request's hidden states started for the GPU on
  // arrival (server/api/wire_upload.h), and their bytes.
  void RecordUploads(int64_t runs, int64_t bytes);
  void SetQueueCapacityRows(int64_t rows);

  // Mirrors the health status (main: loaded, device failure, drain).
  void SetServing(bool serving);

  // The model, once the engine is loaded (`shards`: devices holding W).
  void SetModelInfo(const ModelShape& shape, const std::string& backend, int shards);
  // Called at every scrape for the device memory gauges.
  void SetDeviceMemorySource(std::function<std::vector<DeviceMemoryInfo>()> source);

  // Starts the HTTP endpoint (/metrics) on HOST:PORT (port 0: a free one) and
  // returns the bound port. At most once.
  absl::StatusOr<int> Serve(const std::string& address);

  // The text exposition /metrics returns (for tests and logs).
  std::string Scrape() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The gRPC code's canonical name ("OK", "RESOURCE_EXHAUSTED", ...): the `code`
// label's values; "UNKNOWN" for values outside the enum.
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace flashsampler
