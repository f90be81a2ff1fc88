// LoopbackSampler: a grpc::Server on 127.0.0.1 (a port the kernel picks)
// serving one Sampler service in this process, and a stub to it, for tests of
// a service below the server binary. Header-only: its users link gRPC and
// the proto library already.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "flashsampler/v1/sampler.grpc.pb.h"

namespace flashsampler::testing {

struct LoopbackSampler {
  std::unique_ptr<grpc::Server> server;  // null when it could not start
  std::unique_ptr<v1::Sampler::Stub> stub;
};

// `service` must outlive the server; shut it down (server->Shutdown()) first.
inline LoopbackSampler StartLoopbackSampler(grpc::Service* service) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  LoopbackSampler loopback;
  loopback.server = builder.BuildAndStart();
  if (loopback.server != nullptr) {
    loopback.stub = v1::Sampler::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  }
  return loopback;
}

}  // namespace flashsampler::testing
