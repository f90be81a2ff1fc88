#include "server/security/health_only_server.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/impl/server_builder_option.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flashsampler {
namespace {

// Builder plugins (server reflection registers one process-wide) would add
// services to this port; it must serve health alone.
class NoPluginsOption final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->clear();
  }
};

}  // namespace

grpc::ServerUnaryReactor* HealthOnlyServer::CheckService::Check(
    grpc::CallbackServerContext* context, const grpc::health::v1::HealthCheckRequest* request,
    grpc::health::v1::HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const std::string& name = request->service();
  if (!name.empty() && std::find(names_.begin(), names_.end(), name) == names_.end()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service"));
    return reactor;
  }
  response->set_status(serving_->load(std::memory_order_relaxed)
                           ? grpc::health::v1::HealthCheckResponse::SERVING
                           : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

absl::StatusOr<std::unique_ptr<HealthOnlyServer>> HealthOnlyServer::Start(
    const std::string& address, std::vector<std::string> service_names) {
  std::unique_ptr<HealthOnlyServer> health(new HealthOnlyServer(std::move(service_names)));
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<NoPluginsOption>());
  // No default health service here: CheckService is this server's health.
  builder.SetOption(std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
  // Without SO_REUSEPORT: a port already taken (say by a stale server) is an
  // error, not a silently shared listener.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &health->port_);
  builder.RegisterService(&health->service_);
  // Health requests are tiny; keep what this open port accepts small.
  builder.SetMaxReceiveMessageSize(4096);
  health->server_ = builder.BuildAndStart();
  if (health->server_ == nullptr || health->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("--health_address: cannot listen on ", address));
  }
  return health;
}

void HealthOnlyServer::Shutdown() {
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
}

}  // namespace flashsampler
