#include "client/local_sampler_client.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "client/local_frame.h"

namespace flashsampler {
namespace {

// The largest answer accepted: a response for the largest request the
// server takes (top-logprob lists included) stays far below it.
constexpr uint32_t kMaxResponseBytes = 1u << 30;

}  // namespace

absl::StatusOr<std::unique_ptr<LocalSamplerClient>> LocalSamplerClient::Connect(
    const std::string& path, Options options) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a local socket path has 1 to ", sizeof(address.sun_path) - 1, " bytes"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::ErrnoToStatus(errno, "socket");
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to the local channel ", path, ": ", std::strerror(err)));
  }
  return std::unique_ptr<LocalSamplerClient>(new LocalSamplerClient(fd, options));
}

LocalSamplerClient::~LocalSamplerClient() { close(fd_); }

bool LocalSamplerClient::broken() const {
  absl::MutexLock lock(&mu_);
  return !broken_.ok();
}

absl::StatusOr<v1::SampleResponse> LocalSamplerClient::Sample(const v1::SampleRequest& request,
                                                              absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return broken_;
  auto fail = [this](absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    broken_ = status;
    shutdown(fd_, SHUT_RDWR);
    return status;
  };
  // The wait for the answer is bounded: the server's deadline, plus a second
  // for the answer to arrive.
  const absl::Duration wait = timeout + absl::Seconds(1);
  if (wait != receive_timeout_) {
    const timeval tv = absl::ToTimeval(wait);
    if (setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
      return fail(absl::ErrnoToStatus(errno, "setsockopt(SO_RCVTIMEO)"));
    }
    receive_timeout_ = wait;
  }
  local::FrameHeader header;
  header.kind = local::FrameKind::kSampleRequest;
  header.call_id = next_call_id_++;
  const int64_t micros = absl::ToInt64Microseconds(timeout);
  header.arg = static_cast<uint32_t>(
      std::clamp<int64_t>(micros, 1, std::numeric_limits<uint32_t>::max()));
  if (!request.SerializeToString(&out_)) {
    return absl::InvalidArgumentError("the request does not serialize");
  }
  const absl::Status written = local::WriteFrame(fd_, header, out_);
  // A server that closed the connection (its drain, its connection limit)
  // said why first: read that even when the request could not be sent.
  if (written.ok()) local::PollForData(fd_, std::min(options_.busy_poll, wait));
  absl::StatusOr<local::FrameHeader> answer = local::ReadFrame(fd_, kMaxResponseBytes, &in_);
  if (!written.ok() && !(answer.ok() && answer->call_id == 0)) return fail(written);
  if (!answer.ok()) {
    const absl::Status& s = answer.status();
    if (absl::IsDeadlineExceeded(s)) {
      return fail(absl::DeadlineExceededError("no answer from the local channel in time"));
    }
    return fail(absl::IsOutOfRange(s) ? absl::UnavailableError("the server closed the local channel")
                                      : s);
  }
  if (answer->call_id != header.call_id) {
    // Call id 0: the server speaks of the connection (its drain, a frame it
    // could not read); anything else is out of order.
    if (answer->call_id == 0 && answer->kind == local::FrameKind::kStatus) {
      return fail(absl::Status(static_cast<absl::StatusCode>(answer->arg), in_));
    }
    return fail(absl::InternalError(absl::StrCat("the local channel answered call ", answer->call_id,
                                                 " to call ", header.call_id)));
  }
  if (answer->kind == local::FrameKind::kStatus) {
    if (answer->arg == 0 || answer->arg > 16) {
      return fail(absl::InternalError(absl::StrCat("the local channel sent status code ", answer->arg)));
    }
    return absl::Status(static_cast<absl::StatusCode>(answer->arg), in_);
  }
  v1::SampleResponse response;
  if (answer->kind != local::FrameKind::kSampleResponse || !response.ParseFromString(in_)) {
    return fail(absl::InternalError("the local channel's answer is not a SampleResponse"));
  }
  return response;
}

}  // namespace flashsampler
