#include "server/local/local_channel_server.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/local_frame.h"
#include "server/batching/spin_wait.h"

namespace flashsampler {
namespace {

using local::FrameHeader;
using local::FrameKind;

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat("local channel ", what, " ", path));
}

// A Status frame, written with the socket blocking: used by the reading
// thread and the accepting thread, never by a batcher thread.
void SendStatus(int fd, uint64_t call_id, absl::StatusCode code, absl::string_view message) {
  FrameHeader header;
  header.kind = FrameKind::kStatus;
  header.call_id = call_id;
  header.arg = static_cast<uint32_t>(code);
  (void)local::WriteFrame(fd, header, message);  // a peer that is gone needs no answer
}

// True when the peer has closed its end entirely (not just its writing half).
bool PeerHungUp(int fd) {
  pollfd p{fd, 0, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR)) != 0;
}

}  // namespace

// One accepted connection and its thread. The thread reads a frame, starts
// its request and waits until the request is answered before it reads the
// next: the answer is written by whichever thread completes the request
// (SampleCall::Answer), with a non-blocking send, so a batcher thread never
// waits on a client. What the socket does not take at once the connection's
// own thread sends after the wait, blocking. So only one thread writes at a
// time, and a client that stops reading holds up its own connection alone.
class LocalChannelServer::Connection final : public SampleCall {
 public:
  Connection(SamplerService* service, int fd, const LocalChannelOptions& options,
             std::atomic<bool>* answer_spinner)
      : service_(service), fd_(fd), max_request_bytes_(options.max_request_bytes),
        idle_poll_(options.idle_poll), answer_spinner_(answer_spinner) {
    response = &response_;
    method = RpcMethod::kLocalSample;
  }
  ~Connection() {
    if (thread_.joinable()) thread_.join();
    close(fd_);
  }

  void Begin() { thread_ = std::thread([this] { Run(); }); }
  bool finished() const { return finished_.load(); }
  // Drain: the connection ends after its current request, with a goodbye.
  // Frames already in the socket are still read (and refused by the
  // draining service); the client's later sends fail.
  void BeginDrain() {
    draining_.store(true);
    shutdown(fd_, SHUT_RD);
  }
  // Stop: ends every read and write at once.
  void Close() { shutdown(fd_, SHUT_RDWR); }

  void Answer(grpc::Status status) override {
    out_.clear();
    FrameHeader header;
    header.call_id = call_id_;
    if (status.ok()) {
      header.kind = FrameKind::kSampleResponse;
      response_.SerializeToString(&serialized_);
      local::AppendFrame(header, serialized_, &out_);
    } else {
      header.kind = FrameKind::kStatus;
      header.arg = static_cast<uint32_t>(status.error_code());
      local::AppendFrame(header, status.error_message(), &out_);
    }
    sent_ = 0;
    if (!local::SendBytes(fd_, out_, &sent_, /*block=*/false).ok()) {
      write_failed_ = true;
    }
    // Set and notified under the lock: the connection may be freed as soon
    // as its thread has seen answered_ and then taken the lock, which it can
    // only do once this thread has let go of it (WaitForAnswer).
    std::lock_guard<std::mutex> lock(answer_mu_);
    answered_.store(true, std::memory_order_release);
    answer_cv_.notify_one();
  }

 private:
  void Run() {
    bool answered_one = false;
    while (true) {
      // Right after an answer the next request is likeliest: poll before sleeping.
      if (answered_one) local::PollForData(fd_, idle_poll_);
      absl::StatusOr<FrameHeader> header = local::ReadFrame(fd_, max_request_bytes_, &payload_);
      if (!header.ok()) {
        // A header that cannot be trusted: say why, then end (the stream
        // cannot be resynchronized). End of stream or a socket error: end.
        if (absl::IsInvalidArgument(header.status()) || absl::IsResourceExhausted(header.status())) {
          SendStatus(fd_, 0, header.status().code(), header.status().message());
        }
        break;
      }
      if (header->kind != FrameKind::kSampleRequest) {
        SendStatus(fd_, 0, absl::StatusCode::kInvalidArgument,
                   absl::StrCat("a client sends SampleRequest frames (kind 1); got kind ",
                                static_cast<uint32_t>(header->kind)));
        break;
      }
      if (!request_.ParseFromString(payload_)) {
        SendStatus(fd_, header->call_id, absl::StatusCode::kInvalidArgument,
                   "the frame's payload is not a serialized flashsampler.v1.SampleRequest");
        continue;
      }
      call_id_ = header->call_id;
      SamplerService::CallScope scope;
      if (header->arg != 0) scope.deadline = absl::Now() + absl::Microseconds(header->arg);
      // A client that hung up while its request waits in the queue gets it
      // dropped (CANCELLED, never computed), as a gRPC client that went
      // away. The batcher asks before each launch, for queued requests only:
      // one poll(2) each, and a connection has one request in flight. A
      // client that only shut its writing half keeps its request.
      scope.cancelled = [fd = fd_] { return PeerHungUp(fd); };
      {
        std::lock_guard<std::mutex> lock(answer_mu_);
        answered_.store(false, std::memory_order_relaxed);
      }
      write_failed_ = false;
      service_->StartSample(std::move(scope), request_, this);
      WaitForAnswer();
      // The rest of an answer the socket did not take at once.
      if (write_failed_ || !local::SendBytes(fd_, out_, &sent_, /*block=*/true).ok()) break;
      answered_one = true;
    }
    // Every request of this connection is answered here. During a drain the
    // client learns that the connection ends because of it; otherwise the
    // peer closed (or broke) the connection and needs no word.
    if (draining_.load() && !PeerHungUp(fd_)) {
      SendStatus(fd_, 0, absl::StatusCode::kUnavailable,
                 "server is shutting down; reconnect to continue");
    }
    // The peer sees the end now; the descriptor itself is closed when the
    // connection is freed, so another thread's shutdown never hits a reused one.
    shutdown(fd_, SHUT_RDWR);
    finished_.store(true);
  }

  // Returns once Answer has run and let go of answer_mu_. With idle_poll_
  // set, and no other connection of the server spinning, the thread first
  // spins on answered_ for up to that long, so that it is running, not
  // asleep, when the answer goes out: the client's next request follows
  // within microseconds, and with the thread woken from the condition
  // variable instead, steps of 16-256 rows spent 10-20 µs more outside
  // every server timer (BENCHMARKS.md, "The local channel's thread awake
  // for its answer"). The lock is then taken with try_lock spins: the
  // answering thread holds it only to set the flag and notify, and blocking
  // on it would mean one more sleep and wake-up.
  void WaitForAnswer() {
    if (idle_poll_ > absl::ZeroDuration() && !answer_spinner_->exchange(true, std::memory_order_relaxed)) {
      const bool seen =
          SpinUntil([this] { return answered_.load(std::memory_order_acquire); },
                    std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(idle_poll_));
      answer_spinner_->store(false, std::memory_order_relaxed);
      if (seen) {
        while (!answer_mu_.try_lock()) CpuRelax();
        answer_mu_.unlock();
        return;
      }
    }
    std::unique_lock<std::mutex> lock(answer_mu_);
    answer_cv_.wait(lock, [this] { return answered_.load(std::memory_order_relaxed); });
  }

  SamplerService* const service_;
  const int fd_;
  const uint32_t max_request_bytes_;
  const absl::Duration idle_poll_;
  std::atomic<bool>* const answer_spinner_;  // the server's (WaitForAnswer)
  std::thread thread_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> finished_{false};
  // The request in flight and its answer; touched by the completing thread
  // between StartSample and answered_, by the connection's thread otherwise.
  std::string payload_;
  v1::SampleRequest request_;
  v1::SampleResponse response_;
  uint64_t call_id_ = 0;
  std::string serialized_;
  std::string out_;
  size_t sent_ = 0;
  bool write_failed_ = false;
  std::mutex answer_mu_;
  std::condition_variable answer_cv_;
  // Written under answer_mu_; read under it, or spun on (WaitForAnswer).
  std::atomic<bool> answered_{true};
};

bool UnixSocketServed(const std::string& path) {
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof(address.sun_path)) return false;
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool served = connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return served;
}

absl::StatusOr<std::unique_ptr<LocalChannelServer>> LocalChannelServer::Start(
    LocalChannelOptions options, SamplerService* service) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (options.path.empty() || options.path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("--local_socket must be a path of 1 to ",
                                                    sizeof(address.sun_path) - 1, " bytes"));
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError("the local channel needs max_connections >= 1");
  }
  std::memcpy(address.sun_path, options.path.data(), options.path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket", options.path);
  auto fail = [fd](absl::Status status) {
    close(fd);
    return status;
  };
  auto* sa = reinterpret_cast<sockaddr*>(&address);
  if (bind(fd, sa, sizeof(address)) != 0) {
    if (errno != EADDRINUSE) return fail(Errno("bind", options.path));
    // A socket file is there. Another server listening on it keeps it; a
    // stale one (its server gone) is replaced. Anything else is left alone.
    struct stat st;
    if (lstat(options.path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("--local_socket ", options.path, " exists and is not a socket")));
    }
    if (UnixSocketServed(options.path)) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("another process listens on --local_socket ", options.path)));
    }
    if (unlink(options.path.c_str()) != 0 || bind(fd, sa, sizeof(address)) != 0) {
      return fail(Errno("bind", options.path));
    }
  }
  // Before listen: nobody can connect while the file has the umask's mode.
  struct stat bound {};
  if (chmod(options.path.c_str(), 0600) != 0 || lstat(options.path.c_str(), &bound) != 0 || listen(fd, 128) != 0) {
    const absl::Status status = Errno("listen", options.path);
    unlink(options.path.c_str());
    return fail(status);
  }
  std::unique_ptr<LocalChannelServer> server(
      new LocalChannelServer(std::move(options), service, fd, SocketFileId{bound.st_dev, bound.st_ino}));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

LocalChannelServer::LocalChannelServer(LocalChannelOptions options, SamplerService* service,
                                       int listen_fd, SocketFileId file)
    : options_(std::move(options)), service_(service), listen_fd_(listen_fd), file_(file) {}

LocalChannelServer::~LocalChannelServer() { Stop(); }

void LocalChannelServer::AcceptLoop() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors or memory: the pending client waits in the
        // backlog; try again shortly instead of spinning.
        absl::SleepFor(absl::Milliseconds(10));
        continue;
      }
      return;  // the listener was shut down (BeginDrain)
    }
    ucred peer{};
    socklen_t length = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0 ||
        (peer.uid != geteuid() && peer.uid != 0)) {
      SendStatus(fd, 0, absl::StatusCode::kPermissionDenied,
                 "the local channel serves only the server's own user");
      close(fd);
      continue;
    }
    absl::MutexLock lock(&mu_);
    ReapFinished();
    if (draining_) {
      SendStatus(fd, 0, absl::StatusCode::kUnavailable, "server is shutting down");
      close(fd);
      continue;
    }
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      SendStatus(fd, 0, absl::StatusCode::kResourceExhausted,
                 absl::StrCat("the local channel has its ", options_.max_connections,
                              " connections open (--max_local_connections)"));
      close(fd);
      continue;
    }
    connections_.push_back(std::make_unique<Connection>(service_, fd, options_, &answer_spinner_));
    connections_.back()->Begin();
  }
}

void LocalChannelServer::ReapFinished() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if ((*it)->finished()) {
      it = connections_.erase(it);  // joins the ended thread
    } else {
      ++it;
    }
  }
}

void LocalChannelServer::BeginDrain() {
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return;
    draining_ = true;
    for (const std::unique_ptr<Connection>& c : connections_) c->BeginDrain();
  }
  shutdown(listen_fd_, SHUT_RDWR);  // accept4 returns EINVAL
  if (accept_thread_.joinable()) accept_thread_.join();
}

void LocalChannelServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  BeginDrain();
  absl::MutexLock lock(&mu_);
  for (const std::unique_ptr<Connection>& c : connections_) c->Close();
  connections_.clear();  // joins every connection's thread
  close(listen_fd_);
  // Only this server's own socket file: once its listener is shut (BeginDrain),
  // another server may have taken the path, and its file stays.
  struct stat st {};
  if (lstat(options_.path.c_str(), &st) == 0 && st.st_dev == file_.device && st.st_ino == file_.inode) {
    unlink(options_.path.c_str());
  }
}

}  // namespace flashsampler
