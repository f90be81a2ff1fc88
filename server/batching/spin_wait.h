// SpinUntil: busy-waiting for a flag another thread sets, where the server
// trades a core for a wake-up (--idle_spin_us: the batcher's worker between
// launches, a local-channel connection around its request). A thread woken
// from a futex after a few hundred microseconds asleep takes longer to run
// again than a spinning one takes to see the flag, because its core has
// gone idle. Stateless; any thread may call it.
#pragma once

#include <chrono>

namespace flashsampler {

// One step of a spin-wait: tells the core this thread is polling, so a
// hyperthread sibling gets the pipeline and the loop exit is not mispredicted.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until done() is true (returns true) or `until` passes (returns false).
// The clock is read every 32 relax steps (about a microsecond).
template <class Done>
bool SpinUntil(Done done, std::chrono::steady_clock::time_point until) {
  while (!done()) {
    for (int i = 0; i < 32; ++i) CpuRelax();
    if (std::chrono::steady_clock::now() >= until) return done();
  }
  return true;
}

}  // namespace flashsampler
