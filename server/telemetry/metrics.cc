#include "server/telemetry/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <array>
#include <atomic>
#include <exception>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/telemetry/metrics_http_server.h"

namespace flashsampler {
namespace {

// The `method` label: the gRPC methods, and "LocalSample" for a Sample
// request over the local channel (server/local/).
constexpr std::array<const char*, 5> kMethodNames = {"Sample", "SampleStream", "GetModelInfo",
                                                     "Verify", "LocalSample"};
constexpr std::array<const char*, 17> kCodeNames = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED"};

// The `code` label's index: the code itself, or UNKNOWN's for values outside the enum.
size_t CodeIndex(grpc::StatusCode code) {
  const int i = static_cast<int>(code);
  return i >= 0 && i < static_cast<int>(kCodeNames.size()) ? static_cast<size_t>(i) : 2;
}

// 50 us .. 10 s in 1-2.5-5 steps: fine where the service lives (sub-ms to ms),
// coarse where only overload goes.
prometheus::Histogram::BucketBoundaries DurationBuckets() {
  return {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
          50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0};
}

prometheus::Histogram::BucketBoundaries BatchRowBuckets(int64_t max_batch_rows) {
  prometheus::Histogram::BucketBoundaries b;
  for (int64_t r = 1; r < max_batch_rows; r *= 2) b.push_back(static_cast<double>(r));
  b.push_back(static_cast<double>(max_batch_rows));
  return b;
}

// Device memory, read from the engine when Prometheus scrapes (a gauge set
// from the worker would be stale, or cost a device call per launch).
class DeviceMemoryCollectable final : public prometheus::Collectable {
 public:
  void SetSource(std::function<std::vector<DeviceMemoryInfo>()> source) {
    absl::MutexLock lock(&mu_);
    source_ = std::move(source);
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    // Called under the lock, so SetSource(nullptr) waits for a scrape in
    // progress and the source's owner may go away right after it.
    std::vector<DeviceMemoryInfo> devices;
    {
      absl::MutexLock lock(&mu_);
      if (source_) devices = source_();
    }
    prometheus::MetricFamily used{"flashsampler_device_memory_used_bytes",
                                  "Device memory in use on each GPU the engine uses, in bytes.",
                                  prometheus::MetricType::Gauge, {}};
    prometheus::MetricFamily total{"flashsampler_device_memory_total_bytes",
                                   "Device memory of each GPU the engine uses, in bytes.",
                                   prometheus::MetricType::Gauge, {}};
    for (const DeviceMemoryInfo& d : devices) {
      prometheus::ClientMetric m;
      m.label = {{"device", absl::StrCat(d.device)}};
      m.gauge.value = static_cast<double>(d.used_bytes);
      used.metric.push_back(m);
      m.gauge.value = static_cast<double>(d.total_bytes);
      total.metric.push_back(m);
    }
    if (used.metric.empty()) return {};
    return {std::move(used), std::move(total)};
  }

 private:
  mutable absl::Mutex mu_;
  std::function<std::vector<DeviceMemoryInfo>()> source_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

struct ServerMetrics::Impl {
  explicit Impl(int64_t max_batch_rows)
      : registry(std::make_shared<prometheus::Registry>()),
        device_memory(std::make_shared<DeviceMemoryCollectable>()),
        requests(prometheus::BuildCounter()
                     .Name("flashsampler_requests_total")
                     .Help("Finished requests (unary calls and stream messages) by method and gRPC status code.")
                     .Register(*registry)),
        rows(prometheus::BuildCounter()
                 .Name("flashsampler_rows_total")
                 .Help("Rows (hidden-state vectors) of successfully answered requests, by method.")
                 .Register(*registry)),
        request_duration(prometheus::BuildHistogram()
                             .Name("flashsampler_request_duration_seconds")
                             .Help("Time from receiving a request to answering it, by method.")
                             .Register(*registry)),
        queue_duration(prometheus::BuildHistogram()
                           .Name("flashsampler_queue_duration_seconds")
                           .Help("Time a request waited in the batcher queue before its first launch.")
                           .Register(*registry)
                           .Add({}, DurationBuckets())),
        compute_duration(prometheus::BuildHistogram()
                             .Name("flashsampler_compute_duration_seconds")
                             .Help("Duration of one engine launch (one coalesced batch).")
                             .Register(*registry)
                             .Add({}, DurationBuckets())),
        batch_rows(prometheus::BuildHistogram()
                       .Name("flashsampler_batch_rows")
                       .Help("Rows per engine launch, after coalescing concurrent requests.")
                       .Register(*registry)
                       .Add({}, BatchRowBuckets(max_batch_rows))),
        launches(prometheus::BuildCounter()
                     .Name("flashsampler_launches_total")
                     .Help("Engine launches by kernel path (cpu, fused, materialized, fused_controlled, "
                           "fused_controlled_fallback: fused controlled, then materialized for rows it "
                           "handed back or, with --batch_invariant, did not serve; controlled, sharded; "
                           "error for failed launches).")
                     .Register(*registry)),
        queue_rows(prometheus::BuildGauge()
                       .Name("flashsampler_queue_rows")
                       .Help("Rows waiting in the batcher queue for a launch.")
                       .Register(*registry)
                       .Add({})),
        queue_capacity_rows(prometheus::BuildGauge()
                                .Name("flashsampler_queue_capacity_rows")
                                .Help("Rows the batcher queue admits (--max_queue_rows); beyond it requests get RESOURCE_EXHAUSTED.")
                                .Register(*registry)
                                .Add({})),
        uploads(prometheus::BuildCounter()
                    .Name("flashsampler_uploads_total")
                    .Help("Runs of hidden states copied to the GPU as their request was admitted, while "
                          "the launch before them ran (--cuda_upload_min_bytes).")
                    .Register(*registry)
                    .Add({})),
        uploaded_bytes(prometheus::BuildCounter()
                           .Name("flashsampler_uploaded_bytes_total")
                           .Help("Bytes of the runs in flashsampler_uploads_total.")
                           .Register(*registry)
                           .Add({})),
        serving(prometheus::BuildGauge()
                    .Name("flashsampler_serving")
                    .Help("1 while health reports SERVING (engine loaded and healthy, not draining), else 0.")
                    .Register(*registry)
                    .Add({})),
        inflight(prometheus::BuildGauge()
                     .Name("flashsampler_inflight_requests")
                     .Help("Requests received and not yet answered.")
                     .Register(*registry)
                     .Add({})),
        model_info(prometheus::BuildGauge()
                       .Name("flashsampler_model_info")
                       .Help("The served LM head; always 1, the labels carry the information.")
                       .Register(*registry)) {
    for (size_t m = 0; m < kMethodNames.size(); ++m) {
      const prometheus::Labels labels = {{"method", kMethodNames[m]}};
      rows_by_method[m] = &rows.Add(labels);
      duration_by_method[m] = &request_duration.Add(labels, DurationBuckets());
    }
  }

  std::shared_ptr<prometheus::Registry> registry;
  std::shared_ptr<DeviceMemoryCollectable> device_memory;
  prometheus::Family<prometheus::Counter>& requests;
  prometheus::Family<prometheus::Counter>& rows;
  prometheus::Family<prometheus::Histogram>& request_duration;
  prometheus::Histogram& queue_duration;
  prometheus::Histogram& compute_duration;
  prometheus::Histogram& batch_rows;
  prometheus::Family<prometheus::Counter>& launches;
  prometheus::Gauge& queue_rows;
  prometheus::Gauge& queue_capacity_rows;
  prometheus::Counter& uploads;
  prometheus::Counter& uploaded_bytes;
  prometheus::Gauge& serving;
  prometheus::Gauge& inflight;
  prometheus::Family<prometheus::Gauge>& model_info;
  std::array<prometheus::Counter*, kMethodNames.size()> rows_by_method{};
  // requests_total's series by (method, code), created on first use (so the
  // exposition lists only codes that happened): Family::Add builds a label
  // map, hashes it and takes the family's lock, per request before.
  std::array<std::atomic<prometheus::Counter*>, kMethodNames.size() * kCodeNames.size()>
      requests_by_code{};
  std::array<prometheus::Histogram*, kMethodNames.size()> duration_by_method{};
  std::unique_ptr<MetricsHttpServer> http;  // last: stops serving before the rest goes
};

ServerMetrics::ServerMetrics(int64_t max_batch_rows)
    : impl_(std::make_unique<Impl>(max_batch_rows)) {}

ServerMetrics::~ServerMetrics() = default;

void ServerMetrics::RequestStarted() { impl_->inflight.Increment(); }

void ServerMetrics::RequestFinished(RpcMethod method, grpc::StatusCode code, int64_t rows,
                                    absl::Duration elapsed) {
  const auto m = static_cast<size_t>(method);
  impl_->inflight.Decrement();
  const size_t c = CodeIndex(code);
  std::atomic<prometheus::Counter*>& slot = impl_->requests_by_code[m * kCodeNames.size() + c];
  prometheus::Counter* counter = slot.load(std::memory_order_acquire);
  if (counter == nullptr) {
    // Racing first uses get the same series from the family.
    counter = &impl_->requests.Add({{"method", kMethodNames[m]}, {"code", kCodeNames[c]}});
    slot.store(counter, std::memory_order_release);
  }
  counter->Increment();
  if (code == grpc::StatusCode::OK) impl_->rows_by_method[m]->Increment(static_cast<double>(rows));
  impl_->duration_by_method[m]->Observe(absl::ToDoubleSeconds(elapsed));
}

void ServerMetrics::RecordQueueWait(double seconds) { impl_->queue_duration.Observe(seconds); }

void ServerMetrics::RecordLaunch(int64_t rows, double compute_seconds, const std::string& path) {
  impl_->batch_rows.Observe(static_cast<double>(rows));
  impl_->compute_duration.Observe(compute_seconds);
  impl_->launches.Add({{"path", path}}).Increment();
}

void ServerMetrics::SetQueueRows(int64_t rows) { impl_->queue_rows.Set(static_cast<double>(rows)); }

void ServerMetrics::RecordUploads(int64_t runs, int64_t bytes) {
  impl_->uploads.Increment(static_cast<double>(runs));
  impl_->uploaded_bytes.Increment(static_cast<double>(bytes));
}

void ServerMetrics::SetQueueCapacityRows(int64_t rows) {
  impl_->queue_capacity_rows.Set(static_cast<double>(rows));
}

void ServerMetrics::SetServing(bool serving) { impl_->serving.Set(serving ? 1.0 : 0.0); }

void ServerMetrics::SetModelInfo(const ModelShape& shape, const std::string& backend, int shards) {
  impl_->model_info
      .Add({{"backend", backend},
            {"dtype", WeightDTypeName(shape.weight_dtype)},
            {"vocab_size", absl::StrCat(shape.vocab_size)},
            {"valid_vocab", absl::StrCat(shape.valid_vocab)},
            {"hidden_size", absl::StrCat(shape.hidden_size)},
            {"shards", absl::StrCat(shards)}})
      .Set(1);
}

void ServerMetrics::SetDeviceMemorySource(std::function<std::vector<DeviceMemoryInfo>()> source) {
  impl_->device_memory->SetSource(std::move(source));
}

absl::StatusOr<int> ServerMetrics::Serve(const std::string& address) {
  if (impl_->http != nullptr) return absl::FailedPreconditionError("metrics already served");
  auto http = std::make_unique<MetricsHttpServer>([this] { return Scrape(); });
  absl::StatusOr<int> port = http->Start(address);
  if (port.ok()) impl_->http = std::move(http);
  return port;
}

std::string ServerMetrics::Scrape() const {
  std::vector<prometheus::MetricFamily> families = impl_->registry->Collect();
  for (prometheus::MetricFamily& f : impl_->device_memory->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

const char* GrpcCodeName(grpc::StatusCode code) { return kCodeNames[CodeIndex(code)]; }

}  // namespace flashsampler
