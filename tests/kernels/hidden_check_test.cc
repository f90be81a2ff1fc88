// kernels/cuda/hidden_check.h on the CPU: which report and ride arguments a
// checking launch takes (ReportAndRideValid, host code shared by the
// widening launcher and the fused sampler's argument check).
#include "kernels/cuda/hidden_check.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace flashsampler::kernels {
namespace {

// Words standing in for device and host memory; nothing is dereferenced.
struct Buffers {
  alignas(16) unsigned long long words[2] = {};
  alignas(16) unsigned int count = 0;
  alignas(16) uint32_t params[16] = {};
  alignas(16) uint32_t ride_src[16] = {};
  alignas(16) uint16_t rows[64] = {};
};

TEST(ReportAndRideValid, NeedsEveryReportPointer) {
  Buffers b;
  const FirstBadToHost report{&b.words[0], &b.count, &b.words[1]};
  EXPECT_TRUE(ReportAndRideValid(report, {}, {{b.rows, sizeof(b.rows)}}));
  FirstBadToHost missing = report;
  missing.first_bad = nullptr;
  EXPECT_FALSE(ReportAndRideValid(missing, {}, {}));
  missing = report;
  missing.blocks_done = nullptr;
  EXPECT_FALSE(ReportAndRideValid(missing, {}, {}));
  missing = report;
  missing.first_bad_host = nullptr;
  EXPECT_FALSE(ReportAndRideValid(missing, {}, {}));
}

TEST(ReportAndRideValid, TakesAWellFormedRideThatOverlapsNothing) {
  Buffers b;
  const FirstBadToHost report{&b.words[0], &b.count, &b.words[1]};
  const auto valid = [&](const RideAlongCopy& ride) {
    return ReportAndRideValid(report, ride, {{b.rows, sizeof(b.rows)}, {nullptr, 64}});
  };
  EXPECT_TRUE(valid({b.ride_src, b.params, sizeof(b.params)}));
  EXPECT_TRUE(valid({b.ride_src, b.params, 0}));  // no ride: the pointers do not matter
  EXPECT_TRUE(valid({nullptr, nullptr, 0}));
  // Malformed.
  EXPECT_FALSE(valid({nullptr, b.params, 4}));
  EXPECT_FALSE(valid({b.ride_src, nullptr, 4}));
  EXPECT_FALSE(valid({b.ride_src, b.params, 6}));
  EXPECT_FALSE(valid({reinterpret_cast<const char*>(b.ride_src) + 2, b.params, 4}));
  EXPECT_FALSE(valid({b.ride_src, reinterpret_cast<char*>(b.params) + 2, 4}));
  // Its dst over its src, the report's words, or a buffer of the launch
  // (one byte of overlap is enough; adjacent is fine).
  EXPECT_FALSE(valid({b.params, b.params + 2, 16}));
  EXPECT_FALSE(valid({b.ride_src, &b.words[0], 8}));
  EXPECT_FALSE(valid({b.ride_src, &b.count, 4}));
  EXPECT_FALSE(valid({b.ride_src, &b.words[1], 4}));
  EXPECT_FALSE(valid({b.ride_src, b.rows + 62, 8}));
  EXPECT_TRUE(valid({b.ride_src, b.params, 4 * 3}));
  EXPECT_TRUE(valid({b.params + 4, b.params, 16}));  // src right after dst
}

}  // namespace
}  // namespace flashsampler::kernels
