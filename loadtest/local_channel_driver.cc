#include "loadtest/local_channel_driver.h"

#include <chrono>
#include <memory>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"

namespace flashsampler::load {

LocalChannelDriver::LocalChannelDriver(std::string socket_path,
                                       LocalSamplerClient::Options client_options,
                                       std::vector<v1::SampleRequest> requests,
                                       DriverOptions options)
    : socket_path_(std::move(socket_path)),
      client_options_(client_options),
      requests_(std::move(requests)),
      options_(options) {}

StepResult LocalChannelDriver::RunClosedLoop(int concurrency) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point window_start = start + absl::ToChronoNanoseconds(options_.warmup);
  const Clock::time_point end = window_start + absl::ToChronoNanoseconds(options_.duration);
  StepRecorder recorder(window_start, end, options_.rows_per_request);
  std::vector<std::thread> threads;
  threads.reserve(concurrency);
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([this, &recorder, end] {
      std::unique_ptr<LocalSamplerClient> client;
      while (Clock::now() < end) {
        if (client == nullptr) {
          const Clock::time_point tried = Clock::now();
          absl::StatusOr<std::unique_ptr<LocalSamplerClient>> connected =
              LocalSamplerClient::Connect(socket_path_, client_options_);
          if (!connected.ok()) {
            recorder.Record(tried, Clock::now(), static_cast<grpc::StatusCode>(connected.status().code()));
            std::this_thread::sleep_for(std::chrono::milliseconds(1));  // no busy loop on a dead socket
            continue;
          }
          client = *std::move(connected);
        }
        // Sent after the connect: a request's latency never includes it.
        const Clock::time_point sent = Clock::now();
        const v1::SampleRequest& request =
            requests_[next_request_.fetch_add(1, std::memory_order_relaxed) % requests_.size()];
        absl::StatusOr<v1::SampleResponse> response = client->Sample(request, options_.timeout);
        recorder.Record(sent, Clock::now(), static_cast<grpc::StatusCode>(response.status().code()));
        // A connection-level failure (whatever its code: RESOURCE_EXHAUSTED
        // when the server is at its connection limit, a goodbye, a broken
        // socket) leaves the client failing every call at once: open a new
        // one, after a pause, so no thread spins on a refused connection.
        if (client->broken()) {
          client.reset();
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  StepResult result = recorder.Finish();
  result.concurrency = concurrency;
  return result;
}

}  // namespace flashsampler::load
