// flashsampler-load: a load generator for flashsampler-server.
//
//   closed loop (a concurrency sweep; latency from each send):
//     flashsampler-load --address=HOST:PORT --concurrency=1,4,16,64 [--mode=unary|stream]
//   open loop (given --rate; latency from each intended send time):
//     flashsampler-load --address=HOST:PORT --rate=1000,2000 [--arrival=constant|poisson]
//   closed loop over the local channel (a server on this host with --local_socket):
//     flashsampler-load --address=HOST:PORT --local_socket=PATH [--transport=shm|cuda_ipc]
//
// Each step runs --warmup_s (discarded) then --duration_s; the table goes to
// stdout, --json_out / --csv_out write the report and latency histograms for
// loadtest/plot_load.py. TLS / mTLS / token: the flashsampler-cli flags.
// Exit status: 0 when every step ran (errors are in the report), 1 when the
// server cannot be reached before the run, 2 on usage errors.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/channel_security_flags.h"
#include "client/sampler_client.h"
#include "loadtest/load_driver.h"
#include "loadtest/load_report.h"
#include "loadtest/local_channel_driver.h"
#include "loadtest/region_transport.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "server address HOST:PORT");
ABSL_FLAG(std::string, transport, "grpc",
          "how hidden states and results travel: grpc (in the messages), shm (a registered POSIX "
          "shared-memory region; the server must be on this host) or cuda_ipc (a registered GPU "
          "buffer on --cuda_device; CUDA builds, server on this host)");
ABSL_FLAG(std::string, local_socket, "",
          "send the requests over the server's local channel at this Unix-domain socket path "
          "(its --local_socket) instead of gRPC: closed loop only, one request in flight per "
          "connection (--concurrency connections); --address still serves GetModelInfo and the "
          "region registration of --transport=shm|cuda_ipc");
ABSL_FLAG(int64_t, local_busy_poll_us, 0,
          "--local_socket: each connection busy-polls for its answer this long before it blocks "
          "(LocalSamplerClient::Options::busy_poll; 0: block at once)");
ABSL_FLAG(int32_t, cuda_device, 0, "--transport=cuda_ipc: the GPU holding the payloads");
ABSL_FLAG(int32_t, channels, 4, "gRPC channels (separate connections); requests go round-robin");
ABSL_FLAG(std::string, mode, "unary", "unary: one Sample call per request; stream: SampleStream");
ABSL_FLAG(std::string, concurrency, "1,4,16,64",
          "closed loop: comma-separated requests (streams) in flight, one step each");
ABSL_FLAG(std::string, rate, "",
          "open loop: comma-separated offered rates in requests/s, one step each "
          "(set: open loop; empty: closed loop)");
ABSL_FLAG(std::string, arrival, "constant", "open loop: constant or poisson inter-arrival times");
ABSL_FLAG(uint64_t, arrival_seed, 1, "open loop: seed of the Poisson schedule");
ABSL_FLAG(double, warmup_s, 1.0, "seconds per step before measuring (discarded)");
ABSL_FLAG(double, duration_s, 5.0, "measured seconds per step");
ABSL_FLAG(int64_t, rows, 1, "rows (B) per request");
ABSL_FLAG(double, temperature, 1.0, "sampling temperature of every row (0: greedy)");
ABSL_FLAG(std::string, dtype, "bf16", "wire dtype of the hidden states: bf16, fp16 or fp32");
ABSL_FLAG(int32_t, distinct_requests, 8, "distinct random payloads, sent round-robin");
ABSL_FLAG(uint64_t, data_seed, 1, "seed of the random hidden states");
ABSL_FLAG(double, timeout_s, 10.0, "per-request deadline in seconds");
ABSL_FLAG(int64_t, max_in_flight, 10000,
          "open loop: requests outstanding at most; further due requests count as not_sent");
ABSL_FLAG(int32_t, open_loop_streams, 16, "open loop, stream mode: streams the requests share");
ABSL_FLAG(int32_t, open_loop_senders, 4,
          "open loop, unary mode: threads sending the scheduled requests (request k by thread k mod N)");
ABSL_FLAG(std::string, json_out, "", "write the JSON report here");
ABSL_FLAG(std::string, csv_out, "", "write per-step latency histograms (CSV) here");

namespace {

namespace v1 = flashsampler::v1;
namespace load = flashsampler::load;

int Usage(const std::string& message) {
  std::fprintf(stderr, "flashsampler-load: %s\n", message.c_str());
  return 2;
}

// Comma-separated numbers; `parse` is absl::SimpleAtoi or absl::SimpleAtod.
template <typename T, typename Parse>
absl::StatusOr<std::vector<T>> ParseList(const std::string& flag, const std::string& text, Parse parse) {
  std::vector<T> values;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    T v;
    if (!parse(item, &v)) {
      return absl::InvalidArgumentError("--" + flag + ": not a number: " + std::string(item));
    }
    values.push_back(v);
  }
  if (values.empty()) return absl::InvalidArgumentError("--" + flag + " is empty");
  return values;
}

std::vector<v1::SampleRequest> MakeRequests(int64_t hidden, v1::DType dtype) {
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  std::mt19937_64 gen(absl::GetFlag(FLAGS_data_seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<v1::SampleRequest> requests(std::max(1, absl::GetFlag(FLAGS_distinct_requests)));
  uint64_t seed = 0;
  for (v1::SampleRequest& r : requests) {
    std::vector<float> values(static_cast<size_t>(rows * hidden));
    for (float& v : values) v = normal(gen);
    *r.mutable_hidden_states() = flashsampler::MakeHiddenStates(values, rows, hidden, dtype);
    v1::SamplingParams* p = r.add_params();
    p->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
    p->set_seed(++seed);
  }
  return requests;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Load generator for flashsampler-server.\n"
      "  flashsampler-load --address=HOST:PORT [--concurrency=1,4,16,64 | --rate=R1,R2 "
      "[--arrival=poisson]] [--mode=unary|stream] [--json_out=F] [--csv_out=F]");
  absl::ParseCommandLine(argc, argv);

  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "unary" && mode != "stream") return Usage("--mode must be unary or stream");
  const std::string dtype_name = absl::GetFlag(FLAGS_dtype);
  v1::DType dtype;
  if (dtype_name == "bf16") dtype = v1::DTYPE_BF16;
  else if (dtype_name == "fp16") dtype = v1::DTYPE_FP16;
  else if (dtype_name == "fp32") dtype = v1::DTYPE_FP32;
  else return Usage("--dtype must be bf16, fp16 or fp32");
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport != "grpc" && transport != "shm" && transport != "cuda_ipc") {
    return Usage("--transport must be grpc, shm or cuda_ipc");
  }
  const bool open_loop = !absl::GetFlag(FLAGS_rate).empty();
  const std::string local_socket = absl::GetFlag(FLAGS_local_socket);
  if (!local_socket.empty() && open_loop) return Usage("--local_socket runs closed loops only (no --rate)");
  if (absl::GetFlag(FLAGS_local_busy_poll_us) < 0 || absl::GetFlag(FLAGS_local_busy_poll_us) > 10000000) {
    return Usage("--local_busy_poll_us must be in [0, 10000000]");
  }
  std::vector<int> concurrency;
  std::vector<double> rates;
  if (open_loop) {
    auto parsed = ParseList<double>("rate", absl::GetFlag(FLAGS_rate),
                                   [](absl::string_view s, double* v) { return absl::SimpleAtod(s, v); });
    if (!parsed.ok()) return Usage(std::string(parsed.status().message()));
    rates = *parsed;
    for (double r : rates) if (!(r > 0 && r <= 1e7)) return Usage("--rate values must be in (0, 1e7]");
  } else {
    auto parsed = ParseList<int>("concurrency", absl::GetFlag(FLAGS_concurrency),
                                 [](absl::string_view s, int* v) { return absl::SimpleAtoi(s, v); });
    if (!parsed.ok()) return Usage(std::string(parsed.status().message()));
    concurrency = *parsed;
    for (int c : concurrency) if (c < 1 || c > 100000) return Usage("--concurrency values must be in [1, 100000]");
  }
  absl::StatusOr<load::Arrival> arrival = load::ParseArrival(absl::GetFlag(FLAGS_arrival));
  if (!arrival.ok()) return Usage(std::string(arrival.status().message()));
  const int channels = absl::GetFlag(FLAGS_channels);
  const double warmup_s = absl::GetFlag(FLAGS_warmup_s);
  const double duration_s = absl::GetFlag(FLAGS_duration_s);
  if (channels < 1 || channels > 1024) return Usage("--channels must be in [1, 1024]");
  if (!(warmup_s >= 0) || !(duration_s > 0)) return Usage("--warmup_s must be >= 0 and --duration_s > 0");
  if (absl::GetFlag(FLAGS_rows) < 1) return Usage("--rows must be >= 1");
  if (!(absl::GetFlag(FLAGS_timeout_s) > 0)) return Usage("--timeout_s must be > 0");
  if (absl::GetFlag(FLAGS_max_in_flight) < 1) return Usage("--max_in_flight must be >= 1");
  if (absl::GetFlag(FLAGS_open_loop_streams) < 1) return Usage("--open_loop_streams must be >= 1");
  if (absl::GetFlag(FLAGS_open_loop_senders) < 1 || absl::GetFlag(FLAGS_open_loop_senders) > 256) {
    return Usage("--open_loop_senders must be in [1, 256]");
  }

  const flashsampler::ChannelSecurityOptions security_options =
      flashsampler::ChannelSecurityOptionsFromFlags();
  absl::StatusOr<flashsampler::ChannelSecurity> security =
      flashsampler::LoadChannelSecurity(security_options);
  if (!security.ok()) return Usage(std::string(security.status().message()));
  const std::string address = absl::GetFlag(FLAGS_address);

  flashsampler::SamplerClient probe(address, *security);
  absl::StatusOr<v1::ModelInfo> info = probe.GetModelInfo(absl::Seconds(10));
  if (!info.ok()) {
    std::fprintf(stderr, "flashsampler-load: GetModelInfo on %s: %s\n", address.c_str(),
                 info.status().ToString().c_str());
    return 1;
  }

  std::vector<std::unique_ptr<v1::Sampler::Stub>> stubs;
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments args;
    // A subchannel pool per channel: separate connections, not one shared one.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    stubs.push_back(v1::Sampler::NewStub(flashsampler::MakeSecureChannel(address, *security, args)));
  }
  load::DriverOptions options;
  options.stream = mode == "stream";
  options.warmup = absl::Seconds(warmup_s);
  options.duration = absl::Seconds(duration_s);
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  options.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  options.open_loop_streams = absl::GetFlag(FLAGS_open_loop_streams);
  options.open_loop_senders = absl::GetFlag(FLAGS_open_loop_senders);
  options.arrival = *arrival;
  options.arrival_seed = absl::GetFlag(FLAGS_arrival_seed);
  options.rows_per_request = absl::GetFlag(FLAGS_rows);
  std::vector<v1::SampleRequest> requests = MakeRequests(info->hidden_size(), dtype);
  std::unique_ptr<load::RegionTransport> region;  // unregisters when main returns
  if (transport != "grpc") {
    absl::StatusOr<std::unique_ptr<load::RegionTransport>> made =
        load::RegionTransport::Create(transport, &probe, absl::GetFlag(FLAGS_cuda_device), &requests);
    if (!made.ok()) {
      std::fprintf(stderr, "flashsampler-load: --transport=%s: %s\n", transport.c_str(),
                   made.status().ToString().c_str());
      return 1;
    }
    region = *std::move(made);
  }
  std::unique_ptr<load::LocalChannelDriver> local_driver;
  if (!local_socket.empty()) {
    flashsampler::LocalSamplerClient::Options client_options;
    client_options.busy_poll = absl::Microseconds(absl::GetFlag(FLAGS_local_busy_poll_us));
    local_driver =
        std::make_unique<load::LocalChannelDriver>(local_socket, client_options, requests, options);
  }
  load::LoadDriver driver(std::move(stubs), *security, std::move(requests), options);

  load::RunDescription run;
  run.date_utc = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  run.address = address;
  run.loop = open_loop ? "open" : "closed";
  run.mode = local_driver != nullptr ? "local" : mode;
  run.transport = transport;
  run.arrival = open_loop ? absl::GetFlag(FLAGS_arrival) : "";
  run.channels = channels;
  run.rows_per_request = options.rows_per_request;
  run.temperature = absl::GetFlag(FLAGS_temperature);
  run.warmup_s = warmup_s;
  run.duration_s = duration_s;
  run.tls = !security_options.tls_ca.empty() || !security_options.tls_cert.empty();
  run.auth_token = !security_options.auth_token_file.empty();
  run.vocab_size = info->vocab_size();
  run.hidden_size = info->hidden_size();
  run.backend = info->backend();

  std::vector<load::StepResult> steps;
  if (open_loop) {
    for (double rate : rates) steps.push_back(driver.RunOpenLoop(rate));
  } else {
    for (int c : concurrency) {
      steps.push_back(local_driver != nullptr ? local_driver->RunClosedLoop(c) : driver.RunClosedLoop(c));
    }
  }
  std::printf("%s", load::ReportTable(run, steps).c_str());

  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    absl::Status written = load::WriteTextFile(json_out, load::ReportJson(run, steps));
    if (!written.ok()) return Usage(std::string(written.message()));
  }
  const std::string csv_out = absl::GetFlag(FLAGS_csv_out);
  if (!csv_out.empty()) {
    absl::Status written = load::WriteTextFile(csv_out, load::HistogramCsv(steps));
    if (!written.ok()) return Usage(std::string(written.message()));
  }
  return 0;
}
