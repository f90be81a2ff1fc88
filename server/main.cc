// flashsampler-server: serves the Sampler API over gRPC.
//
// Lifecycle: parse flags -> map the LM head (cheap: mmap, or the demo head) ->
// listen with health NOT_SERVING -> build the engine on a loader thread
// (widening / uploading weights) -> SERVING. SIGTERM or SIGINT: health goes
// NOT_SERVING, the server stops accepting, in-flight RPCs get
// --grace_period_s to finish (then are cancelled), the batcher drains, exit 0.
// SIGINT/SIGTERM are blocked in every thread of ours and taken by sigwait in
// one of them (StopSignalThread), so no work runs in signal context; a second
// signal more than a second after the first exits at once (code 1). With
// --health_address a second, plaintext server answers health only; both
// report the same status, and it stops last so probes see NOT_SERVING during
// the drain.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/status/statusor.h"
#include "server/security/authenticated_sampler_service.h"
#include "server/security/bearer_token_auth.h"
#include "server/engine/engine.h"
#include "server/api/health_gate.h"
#include "server/security/header_token_check.h"
#include "server/security/health_only_server.h"
#include "server/local/local_channel_server.h"
#include "server/model/lm_head.h"
#include "server/batching/dynamic_batcher.h"
#include "server/telemetry/metrics.h"
#include "server/api/sampler_service.h"
#include "server/security/security_config.h"
#include "server/security/token_file_watcher.h"
#include "server/server_config.h"

namespace {

constexpr char kServiceName[] = "flashsampler.v1.Sampler";

// How long gRPC's Shutdown may wait once our own calls are drained.
constexpr std::chrono::milliseconds kCloseMargin{250};

// The main server's health, the health-only port's when there is one, and
// the flashsampler_serving gauge.
void SetHealth(grpc::Server* server, flashsampler::HealthOnlyServer* health_port,
               flashsampler::ServerMetrics* metrics, bool serving) {
  metrics->SetServing(serving);
  if (health_port != nullptr) health_port->SetServing(serving);
  grpc::HealthCheckServiceInterface* health = server ? server->GetHealthCheckService() : nullptr;
  if (health == nullptr) return;
  health->SetServingStatus(kServiceName, serving);
  health->SetServingStatus("", serving);
}

// Stop requests. One thread (StopSignalThread) takes every SIGINT/SIGTERM
// with sigwait for the life of the process, and the handler below passes it
// a signal that reached another thread (see main). The first stop request,
// a signal or the loader's failure, wakes main, which drains; a signal more
// than a second after the first ends the process at once. Globals: the
// signal thread outlives main's locals.
pthread_t g_signal_thread;
absl::Notification g_stop_requested;
std::atomic<int> g_stop_signal{0};  // the first stop's signal; 0: the engine failed to load
std::atomic<int64_t> g_stop_time_ns{0};

extern "C" void ForwardStopSignal(int signal_number) { pthread_kill(g_signal_thread, signal_number); }

void RequestStop(int signal_number) {
  int none = 0;
  if (!g_stop_signal.compare_exchange_strong(none, signal_number == 0 ? -1 : signal_number)) return;
  g_stop_time_ns.store(absl::GetCurrentTimeNanos());
  g_stop_requested.Notify();
}

// A repeat within a second of the first stop is the same stop sent twice (a
// supervisor such as timeout(1) signals the process and its group at once),
// not an operator's second signal.
constexpr int64_t kRepeatWindowNs = 1'000'000'000;

void StopSignalThread(sigset_t stop_signals) {
  for (;;) {
    int signal_number = 0;
    if (sigwait(&stop_signals, &signal_number) != 0) continue;
    if (!g_stop_requested.HasBeenNotified()) {
      RequestStop(signal_number);
      continue;
    }
    if (absl::GetCurrentTimeNanos() - g_stop_time_ns.load() < kRepeatWindowNs) continue;
    std::fprintf(stderr, "flashsampler-server: second signal, exiting without draining\n");
    std::_Exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  using flashsampler::LmHead;
  absl::SetProgramUsageMessage(
      "Serves exact LM-head sampling over gRPC.\n"
      "  flashsampler-server --address=HOST:PORT [--weights=FILE_OR_DIR] [--backend=auto|cpu|cuda]");
  absl::ParseCommandLine(argc, argv);

  // Request buffers are MiBs (a decode step of 256 rows x D = 4096 is 2 MiB
  // on the wire and 4 MiB widened), allocated and freed per request on the
  // gRPC threads. glibc's defaults hand such blocks back to the kernel
  // (munmap, or trimming a thread arena's heap), so every request faulted its
  // pages in again, zeroed: ~15% of the server's CPU at 256-row requests.
  // Fixed thresholds keep them in the heap for reuse; what is held is bounded
  // by the peak of requests in flight. (This also turns off glibc's dynamic
  // mmap threshold, which would only ever grow.)
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  // absl::Mutex's deadlock detection (on in Debian's Abseil build) walks a
  // lock graph on every Lock; our lock order is fixed and documented
  // (server/README-dev.md), and TSan checks it in the sanitizer builds.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  // Before any thread of ours exists, so that every one inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // Threads that libraries start before main (OpenBLAS's pool, at load) do
  // not block them. With the default action, a SIGTERM the kernel hands to
  // such a thread (it may, when main is not the first willing taker) killed
  // the process without a drain: seen once in a CI run under stress-ng. A
  // handler makes the signal harmless wherever it lands: it passes it on to
  // the stop-signal thread, which takes it with sigwait (pthread_kill is
  // async-signal-safe).
  std::thread signal_thread(StopSignalThread, stop_signals);
  g_signal_thread = signal_thread.native_handle();
  signal_thread.detach();
  struct sigaction forward = {};
  forward.sa_handler = ForwardStopSignal;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = SA_RESTART;
  sigaction(SIGINT, &forward, nullptr);
  sigaction(SIGTERM, &forward, nullptr);

  absl::StatusOr<flashsampler::ServerConfig> config = flashsampler::ServerConfigFromFlags();
  if (!config.ok()) {
    std::fprintf(stderr, "flashsampler-server: %s\n", config.status().ToString().c_str());
    return 2;
  }
  // Metrics: always recorded, served over HTTP only with --metrics_address.
  // Its line comes before the gRPC "listening on" line (tests read both).
  flashsampler::ServerMetrics metrics(config->max_batch_rows);
  metrics.SetQueueCapacityRows(config->max_queue_rows);
  if (!config->metrics_address.empty()) {
    absl::StatusOr<int> metrics_port = metrics.Serve(config->metrics_address);
    if (!metrics_port.ok()) {
      std::fprintf(stderr, "flashsampler-server: %s\n", metrics_port.status().ToString().c_str());
      return 1;
    }
    std::printf("flashsampler-server metrics on %s:%d/metrics\n",
                config->metrics_address.substr(0, config->metrics_address.rfind(':')).c_str(),
                *metrics_port);
  }

  absl::StatusOr<flashsampler::SecurityConfig> security =
      flashsampler::LoadSecurityConfig(flashsampler::SecurityOptionsFromFlags());
  if (!security.ok()) {
    std::fprintf(stderr, "flashsampler-server: %s\n", security.status().ToString().c_str());
    return 2;
  }

  absl::StatusOr<LmHead> head = config->weights.empty()
                                    ? LmHead::Demo(config->demo_vocab, config->demo_hidden,
                                                   config->demo_seed)
                                    : LmHead::Load(config->weights, config->tensor);
  if (!head.ok()) {
    std::fprintf(stderr, "flashsampler-server: cannot load the LM head: %s\n",
                 head.status().ToString().c_str());
    return 1;
  }
  const int64_t hidden = head->hidden_size();
  std::fprintf(stderr, "flashsampler-server: LM head %s [%lld, %lld] %s\n", head->source().c_str(),
               static_cast<long long>(head->vocab_size()), static_cast<long long>(hidden),
               flashsampler::WeightDTypeName(head->dtype()));

  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<flashsampler::HealthOnlyServer> health_server;
  flashsampler::BatcherOptions batching{config->max_batch_rows,
                                        absl::Microseconds(config->max_queue_delay_us),
                                        config->max_queue_rows, config->completion_threads};
  // The idle poll pays off where the launch waits on a GPU; on the CPU
  // backend the polling core is one its workers would rather have.
  const bool gpu_backend = config->backend == "cuda" ||
                           (config->backend == "auto" && flashsampler::CudaBackendAvailable());
  batching.idle_spin = absl::Microseconds(
      config->idle_spin_us >= 0 ? config->idle_spin_us : (gpu_backend ? 1000 : 0));
  // SERVING once the engine is loaded, NOT_SERVING for good after a drain
  // starts or the engine fails, whatever order those come in.
  flashsampler::HealthGate health_gate([&server, &health_server, &metrics](bool serving) {
    SetHealth(server.get(), health_server.get(), &metrics, serving);
  });
  flashsampler::DynamicBatcher batcher(batching, &metrics, [&health_gate] {
    std::fprintf(stderr, "flashsampler-server: backend failed; health is now NOT_SERVING\n");
    health_gate.Close();
  });
  metrics.SetDeviceMemorySource([&batcher] { return batcher.DeviceMemory(); });
  // Scrapes may come until `metrics` goes: unhook the batcher before it is destroyed.
  absl::Cleanup unhook_batcher = [&metrics] { metrics.SetDeviceMemorySource(nullptr); };
  flashsampler::RequestLimits limits{config->max_request_rows};  // per request; launches are split
  flashsampler::MemoryRegions regions(
      flashsampler::MemoryRegionsOptions{config->max_regions, config->shm_device_reads,
                                         config->shm_device_reads_max_bytes});
  flashsampler::SamplerService service(&batcher, limits, &metrics, &regions);
  std::unique_ptr<flashsampler::BearerTokenAuth> token_auth;
  std::unique_ptr<flashsampler::AuthenticatedSamplerService> authenticated_service;
  std::unique_ptr<flashsampler::TokenFileWatcher> token_watcher;  // stops before token_auth goes
  if (security->auth_token.has_value()) {
    token_auth = std::make_unique<flashsampler::BearerTokenAuth>(*security->auth_token);
    authenticated_service =
        std::make_unique<flashsampler::AuthenticatedSamplerService>(&service, token_auth.get());
    if (security->credentials_refresh > absl::ZeroDuration()) {
      token_watcher = std::make_unique<flashsampler::TokenFileWatcher>(
          security->auth_token_file, token_auth.get(), security->credentials_refresh, *security->auth_token);
    }
  }
  // gRPC's threads use the services and the token check (HeaderTokenCheck
  // holds token_auth) until the server is gone, and they were declared
  // after it: on every return from here on, the server goes first.
  absl::Cleanup server_goes_first = [&server] { server.reset(); };

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // gRPC replaces the socket file of a unix: address it binds, which would cut
  // off a server already listening there: that case is refused first.
  if (absl::StartsWith(config->address, "unix:") &&
      flashsampler::UnixSocketServed(config->address.substr(5))) {
    std::fprintf(stderr, "flashsampler-server: another process listens on %s\n", config->address.c_str());
    return 1;
  }
  grpc::ServerBuilder builder;
  // A TCP port another process listens on is an error (gRPC shares it by
  // default, SO_REUSEPORT, and the kernel would split the connections).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  // On a TLS port the token is also checked on the headers of every call but
  // health's, before gRPC buffers its message (server/security/header_token_check.h).
  if (token_auth != nullptr && security->tls) {
    security->credentials->SetAuthMetadataProcessor(
        std::make_shared<flashsampler::HeaderTokenCheck>(token_auth.get()));
  }
  builder.AddListeningPort(config->address, security->credentials, &port);
  if (authenticated_service != nullptr) {
    builder.RegisterService(authenticated_service.get());
  } else {
    builder.RegisterService(&service);
  }
  // The largest valid request: B x D fp32 values, up to B params entries of
  // ~32 bytes each plus their sampling controls (an allowed-token bitmask of
  // ceil(V / 32) words and 64 KiB of token lists per row), and 1 MiB for the
  // rest of the message.
  const int64_t control_bytes = (head->vocab_size() + 31) / 32 * 4 + (64 << 10);
  const int64_t max_message =
      config->max_request_rows * (hidden * 4 + 32 + control_bytes) + (1 << 20);
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(max_message, INT_MAX)));
  server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "flashsampler-server: cannot listen on %s\n", config->address.c_str());
    return 1;
  }
  int health_port = 0;
  if (!security->health_address.empty()) {
    auto started = flashsampler::HealthOnlyServer::Start(security->health_address, {kServiceName});
    if (!started.ok()) {
      std::fprintf(stderr, "flashsampler-server: %s\n", started.status().ToString().c_str());
      server->Shutdown();
      return 1;
    }
    health_server = *std::move(started);
    health_port = health_server->port();
  }
  SetHealth(server.get(), health_server.get(), &metrics, false);
  std::fprintf(stderr, "flashsampler-server: security: %s\n", security->Describe().c_str());
  // A Unix domain socket (unix:PATH, unix-abstract:NAME) is its own address;
  // for HOST:PORT, the port actually bound (port 0 picks one).
  const bool unix_socket = absl::StartsWith(config->address, "unix:") ||
                           absl::StartsWith(config->address, "unix-abstract:");
  const std::string listening =
      unix_socket ? config->address
                  : absl::StrCat(config->address.substr(0, config->address.rfind(':')), ":", port);
  // Both lines in one write: tests read them from a pipe.
  std::printf("flashsampler-server listening on %s\n", listening.c_str());
  if (health_server != nullptr) {
    const std::string& health = security->health_address;
    std::printf("flashsampler-server health listening on %s:%d\n",
                health.substr(0, health.rfind(':')).c_str(), health_port);
  }
  std::fflush(stdout);
  // The local channel: the same requests on a Unix-domain socket, for
  // engines on this host. Its bound on a frame is gRPC's on a message.
  std::unique_ptr<flashsampler::LocalChannelServer> local_channel;
  if (!config->local_socket.empty()) {
    flashsampler::LocalChannelOptions local_options;
    local_options.path = config->local_socket;
    local_options.max_connections = config->max_local_connections;
    local_options.idle_poll = batching.idle_spin;
    local_options.max_request_bytes = static_cast<uint32_t>(std::min<int64_t>(max_message, INT_MAX));
    absl::StatusOr<std::unique_ptr<flashsampler::LocalChannelServer>> started =
        flashsampler::LocalChannelServer::Start(std::move(local_options), &service);
    if (!started.ok()) {
      std::fprintf(stderr, "flashsampler-server: %s\n", started.status().ToString().c_str());
      server->Shutdown();
      if (health_server != nullptr) health_server->Shutdown();
      return 1;
    }
    local_channel = *std::move(started);
    std::fprintf(stderr, "flashsampler-server: local channel on %s\n", local_channel->path().c_str());
  }

  std::atomic<bool> load_failed{false};
  std::thread loader([&] {
    flashsampler::EngineOptions options;
    options.valid_vocab = config->valid_vocab;
    options.max_batch_rows = config->max_batch_rows;  // the batcher never launches more
    options.cuda.fused_max_rows = config->cuda_fused_max_rows;
    options.cuda.upload_min_bytes = config->cuda_upload_min_bytes;
    options.cuda.fused_controls = config->cuda_fused_controls;
    options.cuda.batch_invariant = config->batch_invariant;
    options.cuda.devices = config->devices;
    options.cuda.shard_split = config->shard_split;
    options.cuda.shard_merge = config->shard_merge == "group_gumbel"
                                   ? flashsampler::ShardMergeMode::kGroupGumbel
                                   : flashsampler::ShardMergeMode::kExact;
    options.cuda.shard_exchange = config->shard_exchange == "peer"
                                      ? flashsampler::ShardExchange::kPeerWrite
                                      : flashsampler::ShardExchange::kNcclAllGather;
    options.cuda.shard_timeout_s = config->shard_timeout_s;
    if (options.cuda.devices.empty() && config->backend != "cpu") {
      // --devices unset: every visible GPU, or the first one when this build
      // cannot shard (a clear message, not a failure).
      const int visible = flashsampler::VisibleCudaDeviceCount();
      const int usable = flashsampler::CudaShardingAvailable() ? visible : std::min(visible, 1);
      for (int d = 0; d < usable; ++d) options.cuda.devices.push_back(d);
      if (usable < visible) {
        std::fprintf(stderr,
                     "flashsampler-server: %d GPUs visible but this build has no NCCL "
                     "(FLASHSAMPLER_NCCL): serving on GPU 0 only\n",
                     visible);
      }
    }
    if (!options.cuda.shard_split.empty() &&
        options.cuda.shard_split.size() != options.cuda.devices.size()) {
      std::fprintf(stderr,
                   "flashsampler-server: --shard_split has %zu entries but %zu GPUs serve; give "
                   "one entry per GPU (or name the GPUs with --devices)\n",
                   options.cuda.shard_split.size(), options.cuda.devices.size());
      load_failed = true;
      RequestStop(0);
      return;
    }
    if (options.cuda.devices.size() > 1) {
      std::fprintf(stderr,
                   "flashsampler-server: sharding the LM head over %zu GPUs; batches with "
                   "sampling controls or draft tokens gather the logits on GPU 0\n",
                   options.cuda.devices.size());
    }
    options.cpu.num_threads = config->threads;
    options.cpu.tile_rows = config->tile_rows;
    absl::StatusOr<std::unique_ptr<flashsampler::Engine>> engine =
        flashsampler::MakeEngine(config->backend, *std::move(head), options);
    if (!engine.ok()) {
      std::fprintf(stderr, "flashsampler-server: cannot start the %s backend: %s\n",
                   config->backend.c_str(), engine.status().ToString().c_str());
      load_failed = true;
      RequestStop(0);
      return;
    }
    const std::string backend = (*engine)->backend_name();
    // shards: the GPUs holding W (1 for the CPU backend).
    const int shards = std::max<int>(1, static_cast<int>((*engine)->DeviceMemory().size()));
    metrics.SetModelInfo((*engine)->shape(), backend, shards);
    if (backend == "cuda") {
      // The single-GPU engine reads CUDA IPC hidden states in place, and
      // writes results into CUDA IPC output regions there.
      const std::vector<int>& devices = options.cuda.devices;
      const bool in_place = devices.size() == 1 && (*engine)->reads_wire_hidden(devices[0]) &&
                            (*engine)->writes_device_outputs(devices[0]);
      regions.SetCudaDevices(devices, in_place ? devices[0] : -1);
    }
    batcher.SetEngine(*std::move(engine));
    health_gate.EngineReady();
    std::string where;
    if (backend == "cuda" && shards > 1) {
      for (int d : options.cuda.devices) where += (where.empty() ? " (GPUs " : ",") + std::to_string(d);
      where += ", vocabulary sharded, " + config->shard_merge + " merge, " +
               config->shard_exchange + " exchange)";
    }
    std::fprintf(stderr, "flashsampler-server: serving on the %s backend%s\n", backend.c_str(),
                 where.c_str());
  });

  // A second SIGINT/SIGTERM during the drain ends the process at once
  // (StopSignalThread).
  g_stop_requested.WaitForNotification();
  const int stop_signal = g_stop_signal.load();
  std::fprintf(stderr, "flashsampler-server: %s, draining (grace %.1f s)\n",
               stop_signal == SIGINT ? "SIGINT" : stop_signal == SIGTERM ? "SIGTERM" : "the engine did not load",
               config->grace_period_s);
  health_gate.Close();
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(config->grace_period_s * 1000));
  // New requests get UNAVAILABLE from here; idle streams close now, busy ones
  // after their answer.
  service.BeginDrain();
  if (local_channel != nullptr) local_channel->BeginDrain();
  // Accepted requests finish, then a lame-duck pause in which callers still
  // get a clear UNAVAILABLE, and only then the listener closes: a call that
  // reaches gRPC in the instant of Shutdown is cancelled by gRPC itself
  // (CANCELLED, never processed), which the pause makes unlikely for clients
  // that stop or back off on UNAVAILABLE.
  const absl::Time drain_deadline = absl::FromChrono(deadline);
  service.WaitUntilIdle(drain_deadline);
  absl::SleepFor(std::min(absl::Milliseconds(config->lame_duck_ms), drain_deadline - absl::Now()));
  // Our own calls are done (or out of time); what may still be open is
  // gRPC's (a health Watch, reflection) and idle connections. With a far
  // deadline gRPC's graceful close waits ~5 s for an idle client that does
  // not answer its GOAWAY ping (measured: SigtermClosesAnIdleStreamAtOnce,
  // 5.2-5.6 s); a near one closes at once (0.4-0.5 s), and by then only
  // calls that take no time (model info, regions) can be in flight.
  server->Shutdown(std::min(deadline, std::chrono::system_clock::now() + kCloseMargin));
  server->Wait();
  // Only now: a weight upload in progress cannot be interrupted, but it must
  // not delay closing the listener and draining the calls above.
  loader.join();
  batcher.Stop();
  // Every request is answered now; the local channel's connections close.
  if (local_channel != nullptr) local_channel->Stop();
  if (health_server != nullptr) health_server->Shutdown();
  std::fprintf(stderr, "flashsampler-server: stopped\n");
  return load_failed ? 1 : 0;
}
