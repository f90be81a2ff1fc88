// What a kernel that checks hidden states on the device tells the host, and
// the few bytes it may carry along: the contract shared by the widening
// launcher (hidden_states.h) and the fused sampler's first kernel, which
// checks hidden states that arrive in the weights' dtype
// (FusedSampleArgs::hidden_in_weight_dtype, fused_sample.h).
//
// A check finds the smallest index of a refused element (NaN or infinite,
// or out of the weights' range once rounded) and reports it with no copy
// before or after the launch: its last block to finish writes the index, or
// kNoBadHiddenElement, into mapped pinned host memory and puts the device
// words back to their start values. A ride-along copy moves a caller's
// per-launch bytes (the serving engine's row parameters) with the same
// launch instead of a copy operation of their own.
//
// Thread safety: plain structs. Launches that share a FirstBadToHost's
// device words must be ordered (one stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>

namespace flashsampler::kernels {

// No bad element: the value a report holds.
inline constexpr unsigned long long kNoBadHiddenElement = ~0ull;

// *first_bad and *blocks_done (device memory) hold kNoBadHiddenElement and 0
// when a launch starts, and the launch leaves them so (the caller sets them
// once, before its first launch, and then never touches them); the launch's
// last block writes the smallest bad index, or kNoBadHiddenElement, to
// *first_bad_host: pinned host memory mapped into the device's address
// space, readable once the stream has passed the launch.
struct FirstBadToHost {
  unsigned long long* first_bad = nullptr;       // device
  unsigned int* blocks_done = nullptr;           // device
  unsigned long long* first_bad_host = nullptr;  // mapped pinned host memory
};

// A few bytes of the caller's per-launch input that the launch's threads
// copy, one 4-byte word each, from src (device-accessible: device memory or
// mapped pinned host memory) to dst (device memory): they are there once the
// stream has passed the launch. bytes == 0: nothing; else both pointers
// non-null and 4-byte aligned, bytes a multiple of 4, and dst overlapping no
// other buffer of the launch (ReportAndRideValid).
struct RideAlongCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  size_t bytes = 0;
};

// Whether a checking launch's report and ride are usable: every report
// pointer set, and `ride` empty, or well formed with its dst overlapping
// neither its src, the report's words nor any of `buffers` (each {pointer,
// bytes}: the launch's own).
inline bool ReportAndRideValid(const FirstBadToHost& report, const RideAlongCopy& ride,
                               std::initializer_list<std::pair<const void*, size_t>> buffers) {
  if (report.first_bad == nullptr || report.blocks_done == nullptr || report.first_bad_host == nullptr) {
    return false;
  }
  if (ride.bytes == 0) return true;
  const auto word_aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; };
  const auto overlaps = [&ride](const void* p, size_t bytes) {
    const char* a = static_cast<const char*>(ride.dst);
    const char* b = static_cast<const char*>(p);
    return p != nullptr && a < b + bytes && b < a + ride.bytes;
  };
  if (ride.src == nullptr || ride.dst == nullptr || ride.bytes % 4 != 0 || !word_aligned(ride.src) ||
      !word_aligned(ride.dst) || overlaps(ride.src, ride.bytes) ||
      overlaps(report.first_bad, sizeof(*report.first_bad)) ||
      overlaps(report.blocks_done, sizeof(*report.blocks_done)) ||
      overlaps(report.first_bad_host, sizeof(*report.first_bad_host))) {
    return false;
  }
  for (const auto& [p, bytes] : buffers) {
    if (overlaps(p, bytes)) return false;
  }
  return true;
}

}  // namespace flashsampler::kernels
