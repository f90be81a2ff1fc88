#include "server/telemetry/metrics_http_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace flashsampler {
namespace {

constexpr size_t kMaxRequestBytes = 8 << 10;

void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;  // the scraper went away; nothing to do
    sent += static_cast<size_t>(n);
  }
}

std::string Response(const char* status, const char* content_type, const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

MetricsHttpServer::MetricsHttpServer(std::function<std::string()> body) : body_(std::move(body)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::StatusOr<int> MetricsHttpServer::Start(const std::string& address) {
  if (listen_fd_ >= 0) return absl::FailedPreconditionError("metrics endpoint already started");
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", address, "' has no port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve metrics address '", address, "': ",
                                               gai_strerror(rc)));
  }
  int fd = -1;
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 16) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ": ", last_error));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  const int bound_port = ntohs(bound.ss_family == AF_INET6
                                   ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                   : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe2(wake_pipe_, O_CLOEXEC) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("metrics endpoint: pipe: ", std::strerror(errno)));
  }
  listen_fd_ = fd;
  thread_ = std::thread([this] { Loop(); });
  return bound_port;
}

void MetricsHttpServer::Stop() {
  if (listen_fd_ < 0) return;
  const char byte = 0;
  (void)!write(wake_pipe_[1], &byte, 1);
  thread_.join();
  close(listen_fd_);
  close(wake_pipe_[0]);
  close(wake_pipe_[1]);
  listen_fd_ = -1;
}

void MetricsHttpServer::Loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;  // Stop()
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int connection = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) {
      // Out of descriptors or memory: the client waits in the backlog. Wait
      // 10 ms (or for Stop) before trying again instead of spinning.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        pollfd wake{wake_pipe_[0], POLLIN, 0};
        if (poll(&wake, 1, 10) > 0) return;  // Stop()
      }
      continue;
    }
    Answer(connection);
    close(connection);
  }
}

void MetricsHttpServer::Answer(int connection) {
  // A scraper sends its request at once; one whose request is not complete
  // within 2 s in all is dropped, however it trickles its bytes (each recv
  // waits only for what is left of the 2 s). Sends wait at most 2 s each.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  const timeval send_timeout{2, 0};
  setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
  std::string request;
  char buffer[1024];
  while (request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return;
    const timeval receive_timeout = absl::ToTimeval(std::max(left, absl::Milliseconds(1)));
    setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &receive_timeout, sizeof receive_timeout);
    const ssize_t n = recv(connection, buffer, sizeof buffer, 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<size_t>(n));
    if (request.size() > kMaxRequestBytes) {
      SendAll(connection, Response("431 Request Header Fields Too Large", "text/plain", "too large\n"));
      return;
    }
  }
  const std::string line = request.substr(0, request.find_first_of("\r\n"));
  if (!absl::StartsWith(line, "GET ") && !absl::StartsWith(line, "HEAD ")) {
    SendAll(connection, Response("405 Method Not Allowed", "text/plain", "only GET\n"));
    return;
  }
  const size_t path_begin = line.find(' ') + 1;
  const std::string path = line.substr(path_begin, line.find(' ', path_begin) - path_begin);
  if (path != "/metrics" && !absl::StartsWith(path, "/metrics?")) {
    SendAll(connection, Response("404 Not Found", "text/plain", "metrics are at /metrics\n"));
    return;
  }
  std::string response = Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body_());
  if (absl::StartsWith(line, "HEAD ")) response = response.substr(0, response.find("\r\n\r\n") + 4);
  SendAll(connection, response);
}

}  // namespace flashsampler
