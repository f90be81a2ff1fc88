// ReadFuzzInputs: the files of fuzz/corpus/<target>/ and
// fuzz/regressions/<target>/, for tests that replay them through a fuzz
// driver. A missing folder contributes nothing. Not thread-safe (gtest main
// thread only).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace flashsampler::testing {

// (path, contents) of every regular file under the two folders of `target`,
// sorted by path.
std::vector<std::pair<std::string, std::string>> ReadFuzzInputs(const std::string& target);

}  // namespace flashsampler::testing
