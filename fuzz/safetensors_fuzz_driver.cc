#include "fuzz/safetensors_fuzz_driver.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_check.h"
#include "server/model/lm_head.h"
#include "server/model/safetensors_file.h"

namespace flashsampler::fuzz {
namespace {

// A per-thread scratch file, in memory when /dev/shm exists (a fuzzer writes
// it tens of thousands of times a second).
std::string ScratchPath() {
  std::ostringstream thread_id;
  thread_id << std::this_thread::get_id();
  const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : std::getenv("TMPDIR");
  if (dir == nullptr) dir = "/tmp";
  return absl::StrCat(dir, "/flashsampler_fuzz_", ::getpid(), "_", thread_id.str(), ".safetensors");
}

void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FUZZ_CHECK(fd >= 0, "cannot create the scratch file");
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    FUZZ_CHECK(n > 0, "cannot write the scratch file");
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

// Reads every byte of [p, p + n), so an out-of-bounds range faults or trips
// ASan here rather than later in an engine.
uint8_t TouchAll(const uint8_t* p, int64_t n) {
  uint8_t acc = 0;
  for (int64_t i = 0; i < n; ++i) acc ^= p[i];
  return acc;
}

void CheckFailure(const absl::Status& status) {
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument ||
                 status.code() == absl::StatusCode::kNotFound ||
                 status.code() == absl::StatusCode::kResourceExhausted,
             std::string(status.ToString()).c_str());
  FUZZ_CHECK(!status.message().empty(), "failure without a message");
}

void CheckFile(const SafetensorsFile& file, size_t file_size) {
  const auto* base = static_cast<const uint8_t*>(file.mapping().get());
  FUZZ_CHECK(file.file_size() == static_cast<int64_t>(file_size), "file size misreported");
  volatile uint8_t sink = 0;
  for (const std::string& name : file.TensorNames()) {
    FUZZ_CHECK(file.Contains(name), "listed name not found");
    absl::StatusOr<SafetensorsTensor> tensor = file.GetTensor(name);
    if (!tensor.ok()) {
      CheckFailure(tensor.status());
      continue;
    }
    FUZZ_CHECK(tensor->data >= base + 8, "tensor starts before the data section");
    FUZZ_CHECK(tensor->size_bytes >= 0, "negative tensor size");
    FUZZ_CHECK(tensor->data + tensor->size_bytes <= base + file_size, "tensor ends past the file");
    const std::optional<int> bits = SafetensorsDTypeBits(tensor->dtype);
    FUZZ_CHECK(bits.has_value(), "accepted an unknown dtype");
    // product(shape) * bits / 8 == size_bytes, recomputed in 128 bits.
    unsigned __int128 elements = 1;
    for (int64_t d : tensor->shape) {
      FUZZ_CHECK(d >= 0, "accepted a negative dimension");
      elements *= static_cast<unsigned __int128>(d);
      if (elements > (static_cast<unsigned __int128>(1) << 80)) break;
    }
    FUZZ_CHECK(elements * static_cast<unsigned>(*bits) ==
                   static_cast<unsigned __int128>(tensor->size_bytes) * 8,
               "size disagrees with shape and dtype");
    sink = sink ^ TouchAll(tensor->data, tensor->size_bytes);
  }
}

// A head LmHead::Load accepted must be exactly the tensor GetTensor returns
// for the same name (LmHead maps the file itself, so compare shape and bytes,
// not addresses) and 2-D with V, D > 0.
void CheckHead(const LmHead& head, const SafetensorsTensor& tensor) {
  FUZZ_CHECK(head.vocab_size() > 0 && head.hidden_size() > 0, "accepted an empty head");
  FUZZ_CHECK(tensor.shape.size() == 2 && tensor.shape[0] == head.vocab_size() &&
                 tensor.shape[1] == head.hidden_size(),
             "head shape differs from the tensor's");
  FUZZ_CHECK(tensor.dtype == WeightDTypeName(head.dtype()), "head dtype differs from the tensor's");
  const __int128 bytes = static_cast<__int128>(head.vocab_size()) * head.hidden_size() *
                         WeightDTypeSize(head.dtype());
  FUZZ_CHECK(bytes == tensor.size_bytes, "head byte count differs from the tensor's");
  volatile uint8_t sink = TouchAll(static_cast<const uint8_t*>(head.data()), tensor.size_bytes);
  (void)sink;
}

}  // namespace

void CheckSafetensorsBytes(const uint8_t* data, size_t size) {
  const std::string path = ScratchPath();
  WriteFile(path, data, size);
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  if (!file.ok()) {
    CheckFailure(file.status());
    // The loader must fail the same way on a file it cannot open.
    absl::StatusOr<LmHead> head = LmHead::Load(path, "");
    FUZZ_CHECK(!head.ok(), "LmHead::Load accepted a file SafetensorsFile rejects");
    CheckFailure(head.status());
  } else {
    CheckFile(*file, size);
    std::vector<std::string> names = file->TensorNames();
    names.push_back("");  // the default: lm_head.weight, then tied embeddings
    for (const std::string& name : names) {
      absl::StatusOr<LmHead> head = LmHead::Load(path, name);
      if (!head.ok()) {
        CheckFailure(head.status());
        continue;
      }
      const std::string chosen = !name.empty()                       ? name
                                 : file->Contains("lm_head.weight") ? "lm_head.weight"
                                                                    : "model.embed_tokens.weight";
      absl::StatusOr<SafetensorsTensor> tensor = file->GetTensor(chosen);
      FUZZ_CHECK(tensor.ok(), "LmHead::Load accepted a tensor GetTensor rejects");
      CheckHead(*head, *tensor);
    }
  }
  ::unlink(path.c_str());
}

}  // namespace flashsampler::fuzz
