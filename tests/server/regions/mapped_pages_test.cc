// MappedPagesPresent against a real POSIX shared-memory object: pages in use
// are present; truncating the object (and growing it back) or punching a hole
// unmaps them, a write does not.
#include "server/regions/mapped_pages.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace flashsampler {
namespace {

constexpr size_t kBytes = 1 << 20;

class MappedPagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    key_ = absl::StrCat("/fs-mapped-pages-", getpid());
    fd_ = shm_open(key_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd_, 0);
    ASSERT_EQ(ftruncate(fd_, kBytes), 0);
    void* base = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    ASSERT_NE(base, MAP_FAILED);
    base_ = static_cast<char*>(base);
    std::memset(base_, 1, kBytes);  // every page faulted in
  }
  void TearDown() override {
    if (base_ != nullptr) munmap(base_, kBytes);
    close(fd_);
    shm_unlink(key_.c_str());
  }
  bool Present(size_t offset, size_t bytes) {
    const absl::StatusOr<bool> present = MappedPagesPresent(base_ + offset, bytes);
    EXPECT_TRUE(present.ok()) << present.status();
    return present.value_or(false);
  }

  std::string key_;
  int fd_ = -1;
  char* base_ = nullptr;
};

TEST_F(MappedPagesTest, PagesInUseArePresentAndAWriteKeepsThem) {
  EXPECT_TRUE(Present(0, kBytes));
  EXPECT_TRUE(Present(4095, 2));  // across a page boundary
  EXPECT_TRUE(Present(0, 0));
  const char byte = 7;
  ASSERT_EQ(pwrite(fd_, &byte, 1, 12345), 1);
  EXPECT_TRUE(Present(0, kBytes));
  // A fresh mapping of the same object, never touched: nothing present.
  void* other = mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd_, 0);
  ASSERT_NE(other, MAP_FAILED);
  const absl::StatusOr<bool> untouched = MappedPagesPresent(other, kBytes);
  ASSERT_TRUE(untouched.ok()) << untouched.status();
  EXPECT_FALSE(*untouched);
  munmap(other, kBytes);
}

TEST_F(MappedPagesTest, AHolePunchedInTheObjectUnmapsItsPagesOnly) {
  ASSERT_EQ(fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 64 << 10, 4096), 0);
  EXPECT_FALSE(Present(0, kBytes));
  EXPECT_FALSE(Present((64 << 10) + 100, 8));
  EXPECT_TRUE(Present(0, 64 << 10));
  EXPECT_TRUE(Present((64 << 10) + 4096, kBytes - (64 << 10) - 4096));
}

TEST_F(MappedPagesTest, TruncatedAndGrownBackTheObjectsPagesAreGone) {
  ASSERT_EQ(ftruncate(fd_, 0), 0);
  ASSERT_EQ(ftruncate(fd_, kBytes), 0);
  // (The mapping is not touched from here on: it would map the new pages.)
  EXPECT_FALSE(Present(0, kBytes));
  EXPECT_FALSE(Present(kBytes - 4096, 4096));
}

}  // namespace
}  // namespace flashsampler
