#include "tests/fuzz/replay_inputs.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace flashsampler::testing {

std::vector<std::pair<std::string, std::string>> ReadFuzzInputs(const std::string& target) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, std::string>> inputs;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(FLASHSAMPLER_FUZZ_DIR) / kind / target;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      if (!e.is_regular_file()) continue;
      std::ifstream in(e.path(), std::ios::binary);
      inputs.emplace_back(e.path().string(), std::string(std::istreambuf_iterator<char>(in),
                                                         std::istreambuf_iterator<char>()));
    }
  }
  std::sort(inputs.begin(), inputs.end());
  return inputs;
}

}  // namespace flashsampler::testing
