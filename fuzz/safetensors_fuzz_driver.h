// Fuzz driver for the weights loaders (server/model/safetensors_file.h,
// server/model/lm_head.h): arbitrary bytes are written as a .safetensors file and
// opened, every tensor is fetched, and the file is loaded as an LM head under
// the default names and under each of its tensor names. Shared by the
// libFuzzer target and the replay test (tests/fuzz/), so a crash input replays
// through the same code in the normal test suite.
//
// Outcomes: returns normally when the loaders keep their contract; aborts
// (FUZZ_CHECK) when a failure has an unexpected code or empty message, or when
// a tensor or head they accept does not lie inside the file (begin <= end <=
// file size, size = product(shape) * dtype size, LM head 2-D with V, D > 0 and
// V * D * dtype size bytes). Every accepted byte is read, so ASan and the
// kernel catch reads past the mapping.
//
// Thread safety: each call writes its own file (named by thread), so
// concurrent calls are safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashsampler::fuzz {

void CheckSafetensorsBytes(const uint8_t* data, size_t size);

}  // namespace flashsampler::fuzz
