// End to end: a short, bounded flashsampler-load run against the real server
// on the CPU backend over loopback, in each loop and mode. Only correctness is
// checked (requests answered, no errors, a well-formed report): CI never
// asserts timings.
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/scoped_temp_dir.h"
#include "client/sampler_client.h"
#include "tests/e2e/server_process.h"

namespace flashsampler {
namespace {

using testing::ScopedTempDir;
using testing::ServerProcess;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class LoadE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir("load_e2e");
    std::ofstream(dir_->Path("token")) << "load-test-token\n";
    server_ = new ServerProcess({"--backend=cpu", "--demo_vocab=4096", "--demo_hidden=256",
                                 "--threads=2", "--auth_token_file=" + dir_->Path("token")});
    const absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }

  // Runs flashsampler-load with `flags` (each step: 0.2 s warm-up + 1 s) and
  // returns its JSON report.
  static nlohmann::json RunLoad(const std::string& flags) {
    const std::string json = dir_->Path("report.json");
    const std::string csv = dir_->Path("report.csv");
    const std::string command = absl::StrCat(
        FLASHSAMPLER_LOAD_BIN, " --address=", server_->address(), " --auth_token_file=",
        dir_->Path("token"), " --warmup_s=0.2 --duration_s=1 --channels=2 --json_out=", json,
        " --csv_out=", csv, " ", flags);
    const int status = std::system(command.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command;
    const std::string histogram = ReadFile(csv);
    EXPECT_EQ(histogram.rfind("step,concurrency,target_rps,lower_us,upper_us,count\n", 0), 0u)
        << histogram;
    return nlohmann::json::parse(ReadFile(json), nullptr, /*allow_exceptions=*/false);
  }

  static void ExpectAnsweredWithoutErrors(const nlohmann::json& report, size_t steps) {
    ASSERT_TRUE(report.is_object());
    EXPECT_EQ(report["model"]["backend"], "cpu");
    EXPECT_EQ(report["auth_token"], true);
    ASSERT_EQ(report["steps"].size(), steps);
    for (const nlohmann::json& step : report["steps"]) {
      EXPECT_GT(step["requests"].get<int64_t>(), 0) << step;
      EXPECT_EQ(step["ok"], step["requests"]) << step;
      EXPECT_TRUE(step["errors"].empty()) << step;
      EXPECT_EQ(step["not_sent"], 0) << step;
      EXPECT_EQ(step["latency_us"]["count"], step["ok"]) << step;
      EXPECT_LE(step["latency_us"]["p50"].get<double>(), step["latency_us"]["max"].get<double>());
    }
  }

  static ScopedTempDir* dir_;
  static ServerProcess* server_;
};

ScopedTempDir* LoadE2E::dir_ = nullptr;
ServerProcess* LoadE2E::server_ = nullptr;

TEST_F(LoadE2E, ClosedLoopUnarySweep) {
  const nlohmann::json report = RunLoad("--concurrency=1,4 --mode=unary --rows=2");
  ExpectAnsweredWithoutErrors(report, 2);
  EXPECT_EQ(report["loop"], "closed");
  EXPECT_EQ(report["steps"][1]["concurrency"], 4);
}

TEST_F(LoadE2E, ClosedLoopStreams) {
  ExpectAnsweredWithoutErrors(RunLoad("--concurrency=4 --mode=stream"), 1);
}

TEST_F(LoadE2E, OpenLoopPoissonUnary) {
  const nlohmann::json report = RunLoad("--rate=100 --arrival=poisson --mode=unary --temperature=0");
  ExpectAnsweredWithoutErrors(report, 1);
  EXPECT_EQ(report["loop"], "open");
  EXPECT_EQ(report["steps"][0]["target_rps"], 100.0);
}

TEST_F(LoadE2E, OpenLoopConstantStreams) {
  ExpectAnsweredWithoutErrors(RunLoad("--rate=100 --mode=stream --open_loop_streams=3"), 1);
}

TEST_F(LoadE2E, ThroughASharedMemoryRegion) {
  const nlohmann::json report = RunLoad("--concurrency=1,4 --mode=stream --rows=4 --transport=shm");
  ExpectAnsweredWithoutErrors(report, 2);
  EXPECT_EQ(report["transport"], "shm");
  // The load generator registered its region through the token-checked
  // service, and removed it when it finished.
  ChannelSecurity security;
  security.authorization = "Bearer load-test-token";
  SamplerClient client(server_->address(), security);
  absl::StatusOr<v1::ListRegionsResponse> regions = client.ListRegions();
  ASSERT_TRUE(regions.ok()) << regions.status();
  EXPECT_EQ(regions->regions_size(), 0);
}

}  // namespace
}  // namespace flashsampler
