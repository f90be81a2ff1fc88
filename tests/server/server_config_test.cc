// ServerConfigFromFlags (server/server_config.h): the defaults form a valid
// configuration with the documented serving defaults, and a value out of
// range is refused with InvalidArgument naming its flag. Flags are process
// globals: every test restores what it changes (FlagSaver).
#include "server/server_config.h"

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(int64_t, cuda_fused_max_rows);
ABSL_DECLARE_FLAG(int64_t, cuda_upload_min_bytes);
ABSL_DECLARE_FLAG(bool, batch_invariant);
ABSL_DECLARE_FLAG(int64_t, max_batch_rows);
ABSL_DECLARE_FLAG(int64_t, max_request_rows);
ABSL_DECLARE_FLAG(int64_t, max_queue_rows);
ABSL_DECLARE_FLAG(std::string, backend);

namespace flashsampler {
namespace {

TEST(ServerConfig, DefaultsAreValid) {
  absl::FlagSaver saver;
  absl::StatusOr<ServerConfig> c = ServerConfigFromFlags();
  ASSERT_TRUE(c.ok()) << c.status();
  // The CUDA backend's fused kernel serves every batch the batcher can form
  // (--max_batch_rows <= 2^20), and the per-row split is opt-in.
  EXPECT_GE(c->cuda_fused_max_rows, int64_t{1} << 20);
  EXPECT_FALSE(c->batch_invariant);
  EXPECT_EQ(c->max_batch_rows, 256);
  // Payloads from 16 rows of D = 4096 bf16 start for the GPU on arrival.
  EXPECT_EQ(c->cuda_upload_min_bytes, int64_t{128} << 10);
}

TEST(ServerConfig, FlagsReachTheConfig) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_cuda_fused_max_rows, 128);
  absl::SetFlag(&FLAGS_max_batch_rows, 128);
  absl::SetFlag(&FLAGS_batch_invariant, true);
  absl::SetFlag(&FLAGS_cuda_upload_min_bytes, 0);
  absl::StatusOr<ServerConfig> c = ServerConfigFromFlags();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cuda_fused_max_rows, 128);
  EXPECT_EQ(c->max_batch_rows, 128);
  EXPECT_EQ(c->cuda_upload_min_bytes, 0);
  EXPECT_TRUE(c->batch_invariant);
}

// --batch_invariant with batches above --cuda_fused_max_rows (which take the
// materialized plain path, other roundings) is refused, naming both flags.
TEST(ServerConfig, BatchInvariantRefusesBatchesPastTheFusedKernel) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_batch_invariant, true);
  absl::SetFlag(&FLAGS_cuda_fused_max_rows, 128);
  absl::SetFlag(&FLAGS_max_batch_rows, 256);
  absl::StatusOr<ServerConfig> c = ServerConfigFromFlags();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("--batch_invariant"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("--cuda_fused_max_rows"), std::string::npos) << c.status();
  absl::SetFlag(&FLAGS_batch_invariant, false);
  EXPECT_TRUE(ServerConfigFromFlags().ok());
}

// Each bad value names its flag in an InvalidArgument.
TEST(ServerConfig, OutOfRangeValuesNameTheirFlag) {
  struct Case {
    const char* flag;
    void (*set)();
  };
  const Case cases[] = {
      {"--cuda_fused_max_rows", [] { absl::SetFlag(&FLAGS_cuda_fused_max_rows, -1); }},
      {"--cuda_upload_min_bytes", [] { absl::SetFlag(&FLAGS_cuda_upload_min_bytes, -1); }},
      {"--max_batch_rows", [] { absl::SetFlag(&FLAGS_max_batch_rows, 0); }},
      {"--max_batch_rows", [] { absl::SetFlag(&FLAGS_max_batch_rows, (int64_t{1} << 20) + 1); }},
      {"--max_request_rows", [] { absl::SetFlag(&FLAGS_max_request_rows, 0); }},
      {"--max_queue_rows", [] {
         absl::SetFlag(&FLAGS_max_request_rows, 64);
         absl::SetFlag(&FLAGS_max_queue_rows, 63);  // could never admit a 64-row request
       }},
      {"--backend", [] { absl::SetFlag(&FLAGS_backend, std::string("tpu")); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flag);
    absl::FlagSaver saver;
    c.set();
    const absl::StatusOr<ServerConfig> config = ServerConfigFromFlags();
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find(c.flag), std::string::npos) << config.status();
  }
}

}  // namespace
}  // namespace flashsampler
