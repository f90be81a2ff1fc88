#include "server/api/health_gate.h"

#include <utility>

namespace flashsampler {

HealthGate::HealthGate(std::function<void(bool)> publish) : publish_(std::move(publish)) {}

void HealthGate::EngineReady() {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  serving_ = true;
  publish_(true);
}

void HealthGate::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  serving_ = false;
  publish_(false);
}

bool HealthGate::serving() const {
  absl::MutexLock lock(&mu_);
  return serving_;
}

}  // namespace flashsampler
