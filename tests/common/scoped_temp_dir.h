// ScopedTempDir: a fresh directory under GoogleTest's TempDir(), removed with
// everything in it when the object dies. For tests that write files.
// Not thread-safe; one per test.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "gtest/gtest.h"

namespace flashsampler::testing {

class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix) {
    std::string base = ::testing::TempDir();
    if (!base.empty() && base.back() != '/') base += '/';
    std::string pattern = base + prefix + "_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp failed for " << pattern;
      return;
    }
    path_ = pattern;
  }
  ~ScopedTempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Path(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace flashsampler::testing
