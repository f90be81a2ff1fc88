// HealthGate: SERVING only between EngineReady and Close, and never again
// after Close, in either order and from concurrent threads.
#include "server/api/health_gate.h"

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashsampler {
namespace {

using ::testing::ElementsAre;

class Published {
 public:
  std::function<void(bool)> Sink() {
    return [this](bool serving) {
      absl::MutexLock lock(&mu_);
      values_.push_back(serving);
    };
  }
  std::vector<bool> values() const {
    absl::MutexLock lock(&mu_);
    return values_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<bool> values_ ABSL_GUARDED_BY(mu_);
};

TEST(HealthGate, ServesOnceTheEngineIsReadyUntilClosed) {
  Published published;
  HealthGate gate(published.Sink());
  EXPECT_FALSE(gate.serving());
  gate.EngineReady();
  EXPECT_TRUE(gate.serving());
  gate.Close();
  EXPECT_FALSE(gate.serving());
  EXPECT_THAT(published.values(), ElementsAre(true, false));
}

// SIGTERM while the weights are still loading: the load finishing later
// must not turn the draining server back to SERVING.
TEST(HealthGate, AnEngineReadyAfterCloseStaysNotServing) {
  Published published;
  HealthGate gate(published.Sink());
  gate.Close();
  gate.EngineReady();
  EXPECT_FALSE(gate.serving());
  EXPECT_THAT(published.values(), ElementsAre(false));
}

TEST(HealthGate, ConcurrentReadyAndCloseEndNotServing) {
  for (int round = 0; round < 200; ++round) {
    Published published;
    HealthGate gate(published.Sink());
    std::thread ready([&] { gate.EngineReady(); });
    std::thread close([&] { gate.Close(); });
    ready.join();
    close.join();
    EXPECT_FALSE(gate.serving());
    const std::vector<bool> values = published.values();
    ASSERT_FALSE(values.empty());
    EXPECT_FALSE(values.back()) << "round " << round;
  }
}

}  // namespace
}  // namespace flashsampler
