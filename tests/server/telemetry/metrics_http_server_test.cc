// MetricsHttpServer: serves GET /metrics with the body callback's text, 404s
// other paths, keeps serving after a client that connects and sends nothing
// (its receive timeout drops it), and stops cleanly; port 0 picks a free port.
#include "server/telemetry/metrics_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/http_get.h"

namespace flashsampler {
namespace {

TEST(MetricsHttpServer, ServesTheBodyAtMetricsAndNothingElse) {
  std::atomic<int> scrapes{0};
  MetricsHttpServer server([&] { return absl::StrCat("flashsampler_scrapes ", ++scrapes, "\n"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  absl::StatusOr<std::string> first = testing::HttpGet(address, "/metrics");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "flashsampler_scrapes 1\n");
  EXPECT_EQ(*testing::HttpGet(address, "/metrics"), "flashsampler_scrapes 2\n");
  EXPECT_FALSE(testing::HttpGet(address, "/other").ok());
  EXPECT_EQ(scrapes.load(), 2);  // a 404 does not build the body
}

TEST(MetricsHttpServer, ASilentClientDoesNotStopLaterScrapes) {
  MetricsHttpServer server([] { return std::string("up 1\n"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(silent, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  // The silent connection is dropped after the receive timeout; the scrape
  // queued behind it is then answered.
  absl::StatusOr<std::string> body = testing::HttpGet(absl::StrCat("127.0.0.1:", *port), "/metrics");
  close(silent);
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, "up 1\n");
}

TEST(MetricsHttpServer, RefusesAnAddressWithoutPortAndAPortInUse) {
  MetricsHttpServer a([] { return std::string(); });
  EXPECT_EQ(a.Start("127.0.0.1").status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<int> port = a.Start("127.0.0.1:0");
  ASSERT_TRUE(port.ok());
  MetricsHttpServer b([] { return std::string(); });
  EXPECT_EQ(b.Start(absl::StrCat("127.0.0.1:", *port)).status().code(),
            absl::StatusCode::kUnavailable);
  a.Stop();
  a.Stop();  // idempotent
}

}  // namespace
}  // namespace flashsampler
