// HealthGate: the serving health that probes and load balancers see, decided
// in one place. NOT_SERVING until the engine is loaded (EngineReady), SERVING
// from then on, and NOT_SERVING for good once the server drains (SIGTERM) or
// the engine fails (Close). Whatever order those happen in, a closed gate
// never publishes SERVING again: a SIGTERM that arrives while the weights are
// still loading keeps the server NOT_SERVING through its drain.
//
// Thread safety: every method may be called from any thread (the loader, the
// batcher's failure hook, the signal path); `publish` runs under the gate's
// lock, so publications never interleave.
// Outcomes: EngineReady publishes true unless the gate is closed; Close
// publishes false (every time it is called).
#pragma once

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace flashsampler {

class HealthGate {
 public:
  // `publish(serving)` sets every health surface (gRPC health service, the
  // plaintext health port, the serving metric).
  explicit HealthGate(std::function<void(bool)> publish);

  void EngineReady();
  void Close();
  bool serving() const;

 private:
  const std::function<void(bool)> publish_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace flashsampler
