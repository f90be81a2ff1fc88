#include "server/model/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace flashsampler {
namespace {

using json = nlohmann::json;

std::string FileError(const std::string& path, absl::string_view problem) {
  return absl::StrCat("safetensors file '", path, "': ", problem);
}

std::string TensorError(const std::string& path, absl::string_view name, absl::string_view problem) {
  return absl::StrCat("safetensors file '", path, "', tensor '", name, "': ", problem);
}

// Appends a rendering of `value` to *out, at most kBriefDepth levels deep.
// json::dump recurses once per nesting level, so a hostile header of 10^5
// nested brackets would overflow the stack; this never goes deeper than 3.
constexpr int kBriefDepth = 3;
constexpr size_t kBriefChars = 80;

void AppendBrief(const json& value, int depth, std::string* out) {
  if (out->size() > kBriefChars) return;
  if (!value.is_structured()) {
    // Scalars only: dump does not recurse. `replace` guards against invalid
    // UTF-8, which the parser has already rejected anyway.
    out->append(value.dump(-1, ' ', false, json::error_handler_t::replace));
    return;
  }
  const bool is_array = value.is_array();
  out->push_back(is_array ? '[' : '{');
  if (depth >= kBriefDepth) {
    if (!value.empty()) out->append("...");
  } else {
    bool first = true;
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (out->size() > kBriefChars) break;
      if (!first) out->push_back(',');
      first = false;
      if (!is_array) {
        out->append(json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace));
        out->push_back(':');
      }
      AppendBrief(*it, depth + 1, out);
    }
  }
  out->push_back(is_array ? ']' : '}');
}

// A short rendering of an offending JSON value for error messages.
std::string Brief(const json& value) {
  std::string text;
  AppendBrief(value, 0, &text);
  if (text.size() > kBriefChars) text = text.substr(0, kBriefChars) + "...";
  return text;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

struct DTypeBits {
  absl::string_view name;
  int bits;
};

// Every dtype the safetensors format defines (as of safetensors 0.6).
constexpr DTypeBits kDTypes[] = {
    {"BOOL", 8},     {"U8", 8},       {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8},
    {"F8_E8M0", 8},  {"I16", 16},     {"U16", 16}, {"F16", 16},    {"BF16", 16},
    {"I32", 32},     {"U32", 32},     {"F32", 32}, {"F64", 64},    {"I64", 64},
    {"U64", 64},     {"C64", 64},     {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6},
};

// Reads a JSON integer that must be >= 0 and fit int64. `what` names it in the
// error ("shape[1]", "data_offsets[0]").
absl::StatusOr<int64_t> NonNegativeInt(const json& value, absl::string_view what) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(what, " = ", v, " is too large"));
    }
    return static_cast<int64_t>(v);
  }
  if (value.is_number_integer()) {  // signed and not unsigned: negative
    return absl::InvalidArgumentError(
        absl::StrCat(what, " = ", value.get<int64_t>(), " is negative"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be a non-negative integer, got ", Brief(value)));
}

// Validates one header entry against the data section [data, data + data_size).
// The returned status carries the bare problem; the caller adds file and tensor.
absl::StatusOr<SafetensorsTensor> ParseEntry(absl::string_view name, const json& entry,
                                             const uint8_t* data, uint64_t data_size) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("entry must be a JSON object with dtype, shape and data_offsets, got ",
                     Brief(entry)));
  }
  SafetensorsTensor tensor;
  tensor.name = std::string(name);

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) return absl::InvalidArgumentError("missing \"dtype\"");
  if (!dtype_it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"dtype\" must be a string, got ", Brief(*dtype_it)));
  }
  tensor.dtype = dtype_it->get<std::string>();
  const std::optional<int> bits = SafetensorsDTypeBits(tensor.dtype);
  if (!bits) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype \"", tensor.dtype, "\" (not a safetensors dtype)"));
  }

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) return absl::InvalidArgumentError("missing \"shape\"");
  if (!shape_it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"shape\" must be an array of integers, got ", Brief(*shape_it)));
  }
  bool has_zero_dim = false;
  for (size_t i = 0; i < shape_it->size(); ++i) {
    absl::StatusOr<int64_t> dim = NonNegativeInt((*shape_it)[i], absl::StrCat("shape[", i, "]"));
    if (!dim.ok()) return dim.status();
    tensor.shape.push_back(*dim);
    has_zero_dim = has_zero_dim || *dim == 0;
  }
  // numel = product(shape); an intermediate overflow does not matter when a
  // later dimension is 0 (the product is then exactly 0).
  int64_t numel = has_zero_dim ? 0 : 1;
  bool overflow = false;
  for (size_t i = 0; i < tensor.shape.size() && !has_zero_dim && !overflow; ++i) {
    overflow = __builtin_mul_overflow(numel, tensor.shape[i], &numel);
  }
  int64_t total_bits = 0;
  if (overflow || __builtin_mul_overflow(numel, static_cast<int64_t>(*bits), &total_bits)) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(tensor.shape), " of ",
                                                   tensor.dtype, " overflows a 64-bit size"));
  }
  if (total_bits % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(tensor.shape), " of ",
                                                   tensor.dtype, " does not fill whole bytes"));
  }
  const int64_t expected_bytes = total_bits / 8;

  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) return absl::InvalidArgumentError("missing \"data_offsets\"");
  if (!offsets_it->is_array() || offsets_it->size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"data_offsets\" must be [begin, end], got ", Brief(*offsets_it)));
  }
  absl::StatusOr<int64_t> begin = NonNegativeInt((*offsets_it)[0], "data_offsets[0] (begin)");
  if (!begin.ok()) return begin.status();
  absl::StatusOr<int64_t> end = NonNegativeInt((*offsets_it)[1], "data_offsets[1] (end)");
  if (!end.ok()) return end.status();
  if (*begin > *end) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_offsets [", *begin, ", ", *end, "] has begin > end"));
  }
  if (static_cast<uint64_t>(*end) > data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_offsets [", *begin, ", ", *end, "] end beyond the data section of ",
                     data_size, " bytes (truncated file?)"));
  }
  if (*end - *begin != expected_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data_offsets [", *begin, ", ", *end, "] span ", *end - *begin, " bytes but shape ",
        ShapeString(tensor.shape), " of ", tensor.dtype, " needs ", expected_bytes, " bytes"));
  }
  // In bounds: begin <= end <= data_size, so [data + begin, data + end) lies in the mapping.
  tensor.data = data + *begin;
  tensor.size_bytes = expected_bytes;
  return tensor;
}

// Closes a descriptor on every return path of Open.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser() { ::close(fd_); }

 private:
  int fd_;
};

}  // namespace

std::optional<int> SafetensorsDTypeBits(absl::string_view dtype) {
  for (const DTypeBits& d : kDTypes) {
    if (d.name == dtype) return d.bits;
  }
  return std::nullopt;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not hang; it is then rejected as not regular.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return absl::NotFoundError(FileError(path, absl::StrCat("cannot open: ", std::strerror(err))));
  }
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    return absl::NotFoundError(FileError(path, absl::StrCat("cannot stat: ", std::strerror(err))));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(FileError(path, "not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    return absl::InvalidArgumentError(FileError(
        path, absl::StrCat("file is ", file_size,
                           " bytes, shorter than the 8-byte header length (not a safetensors file)")));
  }

  void* addr = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED) {
    const int err = errno;
    const std::string message = FileError(path, absl::StrCat("mmap failed: ", std::strerror(err)));
    return err == ENOMEM ? absl::ResourceExhaustedError(message) : absl::InternalError(message);
  }
  SafetensorsFile file;
  file.path_ = path;
  file.file_size_ = static_cast<int64_t>(file_size);
  file.mapping_ = std::shared_ptr<const void>(
      addr, [file_size](const void* p) { ::munmap(const_cast<void*>(p), file_size); });
  const auto* bytes = static_cast<const uint8_t*>(addr);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(FileError(
        path, absl::StrCat("header length ", header_len, " exceeds the limit of ",
                           kMaxSafetensorsHeaderBytes, " bytes (corrupt or not a safetensors file)")));
  }
  if (header_len > file_size - 8) {
    return absl::InvalidArgumentError(FileError(
        path, absl::StrCat("header length ", header_len, " is larger than the ", file_size - 8,
                           " bytes after the length field (truncated or not a safetensors file)")));
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  // nlohmann's lexer stops at a NUL as if the input ended there, which would
  // silently ignore the rest of the header; the format allows only JSON + spaces.
  if (std::memchr(header_begin, '\0', header_len) != nullptr) {
    return absl::InvalidArgumentError(FileError(path, "header is not valid JSON (contains a NUL byte)"));
  }
  const uint8_t* data = bytes + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;

  // nlohmann's parser and destructor are iterative, so hostile nesting cannot
  // exhaust the stack; allocation failure is the one exception left to catch.
  try {
    json header = json::parse(header_begin, header_begin + header_len, nullptr,
                              /*allow_exceptions=*/false);
    if (header.is_discarded()) {
      return absl::InvalidArgumentError(FileError(path, "header is not valid JSON"));
    }
    if (!header.is_object()) {
      return absl::InvalidArgumentError(FileError(
          path, absl::StrCat("header must be a JSON object, got ", Brief(header))));
    }
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        if (value.is_object()) {
          for (const auto& [key, meta] : value.items()) {
            if (meta.is_string()) file.metadata_[key] = meta.get<std::string>();
          }
        }
        continue;
      }
      Entry entry;
      absl::StatusOr<SafetensorsTensor> tensor = ParseEntry(name, value, data, data_size);
      if (tensor.ok()) {
        entry.tensor = *std::move(tensor);
      } else {
        entry.status = absl::Status(tensor.status().code(),
                                    TensorError(path, name, tensor.status().message()));
      }
      file.entries_.emplace(name, std::move(entry));
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(FileError(path, "out of memory parsing the header"));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        FileError(path, absl::StrCat("cannot parse the header: ", e.what())));
  }
  return file;
}

std::vector<std::string> SafetensorsFile::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const auto& [name, entry] : entries_) names.push_back(name);
  return names;
}

bool SafetensorsFile::Contains(absl::string_view name) const {
  return entries_.find(name) != entries_.end();
}

absl::StatusOr<SafetensorsTensor> SafetensorsFile::GetTensor(absl::string_view name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(TensorError(path_, name, "no such tensor in the header"));
  }
  if (!it->second.status.ok()) return it->second.status;
  return it->second.tensor;
}

}  // namespace flashsampler
