// SafetensorsFile: one .safetensors file, memory-mapped read-only, with its
// header parsed and every tensor entry checked against the file.
//
// Format (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON (an object: tensor name -> {"dtype": "BF16",
// "shape": [d0, d1, ...], "data_offsets": [begin, end]}, plus an optional
// "__metadata__" object of strings), then the data section. Offsets are relative
// to the start of the data section.
//
// Outcomes: Open fails (never crashes) when the file is missing or unreadable
// (NotFound), not a regular file, shorter than 8 bytes, declares a header longer
// than the file or than kMaxHeaderBytes, or whose header is not a JSON object
// (InvalidArgument). Individual tensor entries are checked at Open too, but a
// bad entry only fails a later GetTensor for that name, so one odd entry
// (another tensor's exotic dtype, say) does not make the rest of a checkpoint
// unusable. A tensor that GetTensor returns is guaranteed to lie inside the
// mapping: begin <= end <= data section size, and end - begin equals
// product(shape) * dtype size (computed with overflow checks). Entries may
// overlap one another; that is harmless because each read stays in bounds.
// Every message names the file, and the tensor where there is one.
//
// Alignment: the data pointer of a tensor is the mapping base (page aligned) +
// 8 + N + begin. Writers normally pad N to a multiple of 8 and keep offsets
// multiples of the element size, but the format does not require it, so a
// tensor's data may be misaligned for its element type. Read elements with
// memcpy (or byte/uint16 loads through memcpy), or check the alignment before
// treating the pointer as `const float*`.
//
// Lifetime: the mapping is reference counted (mapping()); tensor data pointers
// stay valid while the SafetensorsFile or any holder of mapping() lives. The
// file must not be truncated while mapped (the kernel would deliver SIGBUS on
// access to the vanished pages; no user-space check can prevent that).
//
// Thread safety: immutable after Open; any number of threads may call the
// const methods concurrently. Move-only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flashsampler {

// The largest header accepted, as in the reference implementation: real
// headers are kilobytes; anything near this is corrupt or hostile.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Bits per element of a safetensors dtype name ("BF16" -> 16, "F4" -> 4), or
// nullopt for a name the format does not define.
std::optional<int> SafetensorsDTypeBits(absl::string_view dtype);

// A validated view of one tensor. `data` points into the mapping and may be
// unaligned (see the header comment).
struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // as written in the header: "BF16", "F32", "I64", ...
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  int64_t size_bytes = 0;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  int64_t file_size() const { return file_size_; }

  // Every entry name in the header (valid or not) except "__metadata__", sorted.
  std::vector<std::string> TensorNames() const;
  bool Contains(absl::string_view name) const;

  // The tensor `name`: NotFound when the header has no such entry,
  // InvalidArgument when the entry is malformed (the message says how).
  absl::StatusOr<SafetensorsTensor> GetTensor(absl::string_view name) const;

  // String-valued entries of "__metadata__" (others are ignored).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Keeps the mapping alive independently of this object (for zero-copy users).
  std::shared_ptr<const void> mapping() const { return mapping_; }

 private:
  // One header entry: either a validated tensor or why it is not one.
  struct Entry {
    absl::Status status;
    SafetensorsTensor tensor;
  };

  SafetensorsFile() = default;

  std::string path_;
  int64_t file_size_ = 0;
  std::shared_ptr<const void> mapping_;
  std::map<std::string, Entry, std::less<>> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace flashsampler
