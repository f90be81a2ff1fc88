// Fuzz driver for memory-region descriptors: registration (name, shm key,
// offset, size, limit), the slices requests name (Resolve, and a Sample
// request's hidden_states_region through ParseSampleRequest), unregistering
// and listing (server/regions/memory_regions.h). Shared by the libFuzzer target
// (fuzz/region_descriptor_fuzz.cc) and the replay test
// (tests/fuzz/region_descriptor_fuzz_driver_test.cc).
//
// One input is a program: the registry's --max_regions (0-3), then up to 64
// operations, each an opcode byte and its operands (see the seed writer,
// fuzz/write_fuzz_seeds.cc). The memory is one real POSIX shared-memory
// object of kObjectBytes bytes made once per process, byte i holding
// PatternByte(i).
//
// Checks (FUZZ_CHECK aborts; memory errors are left to ASan/UBSan), against a
// model of the registry kept from the documented rules:
//  - registration succeeds exactly when the name is 1-128 of [A-Za-z0-9_.-],
//    unused, the size >= 1, the key names the object, offset + size fits in it
//    (no wrap-around) and the limit allows one more; each refusal carries the
//    documented code (FAILED_PRECONDITION when off, INVALID_ARGUMENT,
//    ALREADY_EXISTS, NOT_FOUND, RESOURCE_EXHAUSTED); CUDA IPC is always refused
//    here (no GPU engine);
//  - Resolve succeeds exactly when the name is registered and the slice is
//    non-empty and inside the region; a resolved slice reads the object's
//    bytes at the region's start + offset, and a write of those same bytes
//    succeeds;
//  - a request naming a region is accepted only when that slice resolves and
//    holds exactly B x D elements; an unregistered name is NOT_FOUND;
//  - Unregister succeeds exactly for registered names; List equals the model.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashsampler::fuzz {

inline constexpr uint64_t kRegionObjectBytes = 1 << 16;
inline uint8_t RegionPatternByte(uint64_t i) { return static_cast<uint8_t>(i * 31 + 7); }

void CheckRegionDescriptors(const uint8_t* data, size_t size);

}  // namespace flashsampler::fuzz
