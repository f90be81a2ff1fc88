// FUZZ_CHECK: an invariant a fuzz driver asserts about the code under test.
// A violation prints the condition and aborts, which libFuzzer records as a
// crash (saving the input) and which fails a replaying gtest. Used only in
// fuzz/ drivers; library code reports errors through absl::Status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, what)                                                        \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, \
                   #cond, (what));                                                    \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)
