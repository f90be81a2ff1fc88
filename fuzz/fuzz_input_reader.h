// FuzzInputReader: reads typed values off the front of a fuzz input, so a
// structured fuzz target can treat the bytes as a list of edits. Running out
// of bytes is not an error: every read then returns zeros (empty for bytes),
// so any input, including the empty one, is a complete program of edits.
//
// Not thread-safe; one reader per input.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace flashsampler::fuzz {

class FuzzInputReader {
 public:
  FuzzInputReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }

  uint8_t TakeByte() { return static_cast<uint8_t>(TakeUint(1)); }
  uint32_t TakeU32() { return static_cast<uint32_t>(TakeUint(4)); }
  uint64_t TakeU64() { return TakeUint(8); }
  // The next 4 bytes as the bits of a float: every NaN payload, infinity and
  // denormal is reachable.
  float TakeFloatBits() {
    const uint32_t bits = TakeU32();
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  // Up to `max_len` bytes, length taken from the input first.
  std::string TakeBytes(size_t max_len) {
    const size_t want = max_len == 0 ? 0 : TakeU32() % (max_len + 1);
    const size_t n = std::min(want, size_ - std::min(pos_, size_));
    std::string out(reinterpret_cast<const char*>(data_ + std::min(pos_, size_)), n);
    pos_ += n;
    return out;
  }

 private:
  // Little-endian, `n` <= 8 bytes; missing bytes read as zero.
  uint64_t TakeUint(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) {
      const uint64_t byte = pos_ < size_ ? data_[pos_] : 0;
      ++pos_;
      v |= byte << (8 * i);
    }
    return v;
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace flashsampler::fuzz
