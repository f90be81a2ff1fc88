// LmHead: the LM-head weight matrix W [vocab, hidden] the service samples with,
// either memory-mapped from a safetensors file (zero copy) or generated as the
// seeded demo head (owned memory).
//
// Loading: `path` is a .safetensors file, or a folder holding one
// (model.safetensors) or a Hugging Face sharded checkpoint
// (model.safetensors.index.json naming the shard of each tensor). With an empty
// `tensor_name` the loader takes "lm_head.weight" and falls back to
// "model.embed_tokens.weight" (tied embeddings). dtypes F32, F16, BF16; the
// tensor must be 2-D. Every failure is an absl::Status naming the file and the
// tensor: NotFound (missing file or tensor), InvalidArgument (malformed header,
// offsets outside the file, sizes that disagree with shape and dtype,
// unsupported dtype, wrong rank), never a crash.
//
// Thread safety: immutable after construction; any number of threads may read.
// Move-only: the mapping lives as long as the object.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace flashsampler {

enum class WeightDType { kFloat32, kFloat16, kBFloat16 };

// Bytes per element of a weight dtype.
int64_t WeightDTypeSize(WeightDType dtype);
const char* WeightDTypeName(WeightDType dtype);  // "F32", "F16", "BF16"

class LmHead {
 public:
  static absl::StatusOr<LmHead> Load(const std::string& path, const std::string& tensor_name);

  // The embedded default: W[i][j] ~ N(0, (2 / sqrt(hidden))^2) drawn from a
  // seeded generator and stored as bf16, so logits of unit-variance hidden
  // states have a standard deviation of about 2. Deterministic in (vocab,
  // hidden, seed) on every platform.
  static LmHead Demo(int64_t vocab, int64_t hidden, uint64_t seed);

  LmHead(LmHead&&) noexcept;
  LmHead& operator=(LmHead&&) noexcept;
  ~LmHead();

  int64_t vocab_size() const { return vocab_; }
  int64_t hidden_size() const { return hidden_; }
  WeightDType dtype() const { return dtype_; }
  // [vocab, hidden] row-major elements of dtype(), little-endian.
  const void* data() const { return data_; }
  // Where the weights came from, for logs: "FILE:TENSOR" or "demo(...)".
  const std::string& source() const { return source_; }

 private:
  struct Storage;  // the mapping or the owned buffer
  LmHead(std::unique_ptr<Storage> storage, const void* data, int64_t vocab, int64_t hidden,
         WeightDType dtype, std::string source);

  std::unique_ptr<Storage> storage_;
  const void* data_ = nullptr;
  int64_t vocab_ = 0;
  int64_t hidden_ = 0;
  WeightDType dtype_ = WeightDType::kBFloat16;
  std::string source_;
};

}  // namespace flashsampler
