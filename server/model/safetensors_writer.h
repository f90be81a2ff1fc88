// Safetensors writer: the inverse of SafetensorsFile, for the demo-head tool,
// tests and anyone who needs a weights file on disk.
//
// Layout written: 8-byte little-endian header length N, the JSON header padded
// with spaces so that 8 + N is a multiple of 8, then the tensors back to back
// with no gaps (the format requires contiguous offsets). Tensors are stored in
// order of decreasing element size (stable otherwise), so every tensor's data
// starts at a multiple of its element size from an 8-aligned data section: a
// reader that maps the file gets naturally aligned data.
//
// The file is written to a temporary name in the same folder and renamed into
// place, so readers never see a half-written file.
//
// Outcomes: InvalidArgument for bad input (empty/duplicate/"__metadata__"
// name, unknown dtype, negative dimension, byte count that disagrees with shape
// and dtype); NotFound / PermissionDenied / ResourceExhausted / Internal for
// file-system failures, with the path and the OS error in the message.
//
// Thread safety: the functions share no state; concurrent calls writing
// different paths are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/model/lm_head.h"

namespace flashsampler {

// One tensor to write. `data` is raw little-endian element data (not owned,
// read only during the call); size_bytes must equal product(shape) * dtype size.
struct SafetensorsTensorToWrite {
  std::string name;
  std::string dtype;  // a safetensors dtype name: "BF16", "F16", "F32", "I64", ...
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t size_bytes = 0;
};

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<SafetensorsTensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Writes `head` as the 2-D tensor `tensor_name` of `dtype`. Values are widened
// exactly (bf16/fp16 -> fp32) and narrowed with round-to-nearest-even
// (-> bf16, -> fp16; fp16 overflows to +-inf); same-dtype output copies the
// bytes unchanged. So a bf16 head written as F32 or BF16 loads back bit-exact.
absl::Status WriteLmHeadSafetensors(const std::string& path, const LmHead& head,
                                    WeightDType dtype,
                                    const std::string& tensor_name = "lm_head.weight");

}  // namespace flashsampler
