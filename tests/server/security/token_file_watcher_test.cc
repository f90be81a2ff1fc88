#include "server/security/token_file_watcher.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/common/scoped_temp_dir.h"

namespace flashsampler {
namespace {

using testing::ScopedTempDir;

absl::StatusCode CheckToken(const BearerTokenAuth& auth, const std::string& token) {
  const std::string key = "authorization";
  const std::string value = "Bearer " + token;
  std::multimap<grpc::string_ref, grpc::string_ref> metadata;
  metadata.emplace(key, value);
  return auth.Check(metadata).code();
}

// Writes `content` to a new file and renames it over `path`, as a rotation
// should.
void ReplaceFile(const std::string& path, const std::string& content) {
  const std::string next = path + ".next";
  std::ofstream(next) << content;
  ASSERT_EQ(std::rename(next.c_str(), path.c_str()), 0);
}

// A token file at `path` holding `token`, and the check the server builds from it.
BearerTokenAuth AuthFromNewFile(const std::string& path, const std::string& token) {
  ReplaceFile(path, token);
  return BearerTokenAuth(token);
}

// RefreshNow (what the background thread calls every interval): a new token
// in the file replaces the old one; a missing, empty or invalid file keeps
// the token in use; the same token again changes nothing.
TEST(TokenFileWatcher, FollowsTheFileAndKeepsTheTokenWhenTheFileIsBad) {
  ScopedTempDir dir("token_watcher");
  const std::string path = dir.Path("token");
  BearerTokenAuth auth = AuthFromNewFile(path, "first-token");
  TokenFileWatcher watcher(path, &auth, absl::ZeroDuration(), "first-token");  // no thread: only RefreshNow reads

  EXPECT_TRUE(watcher.RefreshNow().ok());
  EXPECT_EQ(CheckToken(auth, "first-token"), absl::StatusCode::kOk);

  ReplaceFile(path, "  second-token \n");
  EXPECT_TRUE(watcher.RefreshNow().ok());
  EXPECT_EQ(CheckToken(auth, "second-token"), absl::StatusCode::kOk);
  EXPECT_EQ(CheckToken(auth, "first-token"), absl::StatusCode::kUnauthenticated);

  ReplaceFile(path, "");
  EXPECT_EQ(watcher.RefreshNow().code(), absl::StatusCode::kInvalidArgument);
  ReplaceFile(path, "two words\n");
  EXPECT_EQ(watcher.RefreshNow().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(std::remove(path.c_str()), 0);
  EXPECT_EQ(watcher.RefreshNow().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckToken(auth, "second-token"), absl::StatusCode::kOk);

  ReplaceFile(path, "third-token");
  EXPECT_TRUE(watcher.RefreshNow().ok());
  EXPECT_EQ(CheckToken(auth, "third-token"), absl::StatusCode::kOk);
  EXPECT_EQ(CheckToken(auth, "second-token"), absl::StatusCode::kUnauthenticated);
}

// The file was rotated between the server's start-up read and the watcher's
// start (the server loads its weights in between): the first read replaces
// the start-up token, which then stops working.
TEST(TokenFileWatcher, ARotationBeforeItStartsIsPickedUp) {
  ScopedTempDir dir("token_watcher_early");
  const std::string path = dir.Path("token");
  BearerTokenAuth auth = AuthFromNewFile(path, "start-up-token");
  ReplaceFile(path, "rotated-token");
  TokenFileWatcher watcher(path, &auth, absl::ZeroDuration(), "start-up-token");
  EXPECT_TRUE(watcher.RefreshNow().ok());
  EXPECT_EQ(CheckToken(auth, "rotated-token"), absl::StatusCode::kOk);
  EXPECT_EQ(CheckToken(auth, "start-up-token"), absl::StatusCode::kUnauthenticated);
}

// With an interval the watcher's own thread picks the new token up. The test
// waits on the new token being accepted (bounded by a deadline), never on a
// fixed sleep.
TEST(TokenFileWatcher, ItsThreadPicksUpANewToken) {
  ScopedTempDir dir("token_watcher_thread");
  const std::string path = dir.Path("token");
  BearerTokenAuth auth = AuthFromNewFile(path, "first-token");
  TokenFileWatcher watcher(path, &auth, absl::Milliseconds(20), "first-token");
  ReplaceFile(path, "second-token");
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (CheckToken(auth, "second-token") != absl::StatusCode::kOk && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(CheckToken(auth, "second-token"), absl::StatusCode::kOk);
  EXPECT_EQ(CheckToken(auth, "first-token"), absl::StatusCode::kUnauthenticated);
}

// A watcher with an hour's interval is destroyed at once: its thread waits
// on the stop flag, not in a sleep (if it slept, the test would outlive its
// 120 s ctest timeout and fail).
TEST(TokenFileWatcher, StopsWithoutWaitingForItsInterval) {
  ScopedTempDir dir("token_watcher_stop");
  BearerTokenAuth auth = AuthFromNewFile(dir.Path("token"), "token");
  { TokenFileWatcher watcher(dir.Path("token"), &auth, absl::Hours(1), "token"); }
  EXPECT_EQ(CheckToken(auth, "token"), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace flashsampler
