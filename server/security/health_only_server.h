// HealthOnlyServer: the plaintext health-only listener (--health_address), a
// second gRPC server that serves grpc.health.v1.Health/Check and nothing else
// (no Sampler, no reflection), so Kubernetes probes can reach a server whose
// main port requires TLS or mTLS.
//
// Its status is set by main together with the main server's health, so both
// ports report the same. Check answers SERVING or NOT_SERVING for "" and the
// names given at start, NOT_FOUND for any other service; Watch is not offered
// (UNIMPLEMENTED): gRPC probes use Check. SetServing and Check may race
// freely (one atomic); Start and Shutdown are for main only.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace flashsampler {

class HealthOnlyServer {
 public:
  // Listens on `address` (port 0: a free port) with status NOT_SERVING.
  // Unavailable when it cannot listen.
  static absl::StatusOr<std::unique_ptr<HealthOnlyServer>> Start(
      const std::string& address, std::vector<std::string> service_names);

  int port() const { return port_; }
  void SetServing(bool serving) { serving_.store(serving, std::memory_order_relaxed); }
  // Stops at once; pending checks are cancelled.
  void Shutdown();

 private:
  class CheckService final : public grpc::health::v1::Health::CallbackService {
   public:
    CheckService(const std::atomic<bool>* serving, std::vector<std::string> names)
        : serving_(serving), names_(std::move(names)) {}
    grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                    const grpc::health::v1::HealthCheckRequest* request,
                                    grpc::health::v1::HealthCheckResponse* response) override;

   private:
    const std::atomic<bool>* const serving_;
    const std::vector<std::string> names_;
  };

  explicit HealthOnlyServer(std::vector<std::string> service_names)
      : service_(&serving_, std::move(service_names)) {}

  std::atomic<bool> serving_{false};
  CheckService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace flashsampler
