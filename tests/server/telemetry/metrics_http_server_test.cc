// MetricsHttpServer: serves GET /metrics with the body callback's text, 404s
// other paths, keeps serving after a client that connects and sends nothing
// (its receive timeout drops it), and stops cleanly; port 0 picks a free port.
#include "server/telemetry/metrics_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
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

// A client that trickles its request a byte at a time (each within the
// per-read wait) is dropped once the request has taken 2 s, before it could
// complete it 20 s later: the connection is closed without an answer, and a
// scrape after it is answered.
TEST(MetricsHttpServer, AClientThatTricklesItsRequestIsDropped) {
  MetricsHttpServer server([] { return std::string("up 1\n"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  const int slow = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(slow, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string head = "GET /metrics HTTP/1.0\r\nX-Pad: ";
  ASSERT_EQ(send(slow, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  bool closed = false;
  for (int i = 0; i < 400 && !closed; ++i) {  // one byte every 50 ms: 20 s
    pollfd p{slow, POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {  // the server closed it (or, wrongly, answered)
      char byte;
      closed = recv(slow, &byte, 1, 0) <= 0;
      break;
    }
    if (send(slow, "a", 1, MSG_NOSIGNAL) != 1) closed = true;
  }
  if (!closed) {
    send(slow, "\r\n\r\n", 4, MSG_NOSIGNAL);  // the request, complete at last
  }
  close(slow);
  EXPECT_TRUE(closed) << "the server waited for a request trickled over 20 s, or answered part of one";
  absl::StatusOr<std::string> body = testing::HttpGet(absl::StrCat("127.0.0.1:", *port), "/metrics");
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
