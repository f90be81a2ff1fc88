// MappedPagesPresent: whether every page of a range of this process's address
// space is still mapped, read from /proc/self/pagemap (bit 63 of each page's
// entry: present).
//
// Why the shared-memory regions need it: a region the GPU reads in place is a
// MAP_SHARED mapping of the caller's object whose pages were pinned at
// registration (server/regions/cuda_ipc_region.cc). When the caller truncates
// the object (even if it grows it back before the next request) or punches a
// hole in it, the kernel removes those pages from the object and unmaps them
// from every mapping, this one included; the GPU would go on reading the old,
// pinned pages while the object holds new ones. The server never touches the
// mapping with the CPU, so nothing maps a page back in: a page that is not
// present means the object's bytes there are no longer the pinned ones. A
// write to the object (pwrite, or a store through another mapping) keeps its
// pages and their entries.
//
// Thread safety: may be called concurrently from any thread.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace flashsampler {

// True when every page that [addr, addr + bytes) touches is present in this
// process's page tables; false when one is not. An error when pagemap cannot
// be read (no /proc, or a kernel that refuses it).
absl::StatusOr<bool> MappedPagesPresent(const void* addr, uint64_t bytes);

}  // namespace flashsampler
