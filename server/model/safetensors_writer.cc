#include "server/model/safetensors_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <set>

#include "absl/strings/str_cat.h"
#include "kernels/common/half_precision.h"
#include "nlohmann/json.hpp"
#include "server/model/safetensors_file.h"

namespace flashsampler {
namespace {

using json = nlohmann::json;

absl::Status OsError(int err, const std::string& path, absl::string_view what) {
  const std::string message =
      absl::StrCat("writing safetensors file '", path, "': ", what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status InputError(const std::string& path, absl::string_view tensor, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("writing safetensors file '", path, "', tensor '", tensor, "': ", problem));
}

// Writes all of [data, data + size), retrying short writes and EINTR.
bool WriteAll(int fd, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

float LoadAsFloat(const uint8_t* src, WeightDType dtype, int64_t i) {
  if (dtype == WeightDType::kFloat32) {
    float v;
    std::memcpy(&v, src + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, src + 2 * i, 2);
  return dtype == WeightDType::kBFloat16 ? Bf16ToFloat(h) : Fp16ToFloat(h);
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<SafetensorsTensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  std::vector<int> bits(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const SafetensorsTensorToWrite& tensor = tensors[t];
    if (tensor.name.empty()) return InputError(path, tensor.name, "empty tensor name");
    if (tensor.name == "__metadata__") {
      return InputError(path, tensor.name, "\"__metadata__\" is reserved");
    }
    if (!names.insert(tensor.name).second) return InputError(path, tensor.name, "duplicate name");
    const std::optional<int> b = SafetensorsDTypeBits(tensor.dtype);
    if (!b) return InputError(path, tensor.name, absl::StrCat("unknown dtype \"", tensor.dtype, "\""));
    bits[t] = *b;
    for (int64_t d : tensor.shape) {
      if (d < 0) return InputError(path, tensor.name, absl::StrCat("negative dimension ", d));
    }
    // total_bits = product(shape) * bits; a 0 dimension makes it exactly 0.
    const bool empty = std::find(tensor.shape.begin(), tensor.shape.end(), 0) != tensor.shape.end();
    int64_t total_bits = empty ? 0 : *b;
    bool overflow = false;
    for (size_t i = 0; !empty && !overflow && i < tensor.shape.size(); ++i) {
      overflow = __builtin_mul_overflow(total_bits, tensor.shape[i], &total_bits);
    }
    if (overflow || total_bits % 8 != 0 ||
        static_cast<uint64_t>(total_bits / 8) != tensor.size_bytes) {
      return InputError(path, tensor.name,
                        absl::StrCat(tensor.size_bytes, " bytes of data do not match the shape"
                                     " and dtype ", tensor.dtype));
    }
    if (tensor.size_bytes > 0 && tensor.data == nullptr) {
      return InputError(path, tensor.name, "null data");
    }
  }

  // Larger elements first keeps every tensor naturally aligned (header comment).
  std::vector<size_t> order(tensors.size());
  for (size_t t = 0; t < order.size(); ++t) order[t] = t;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return bits[a] > bits[b]; });

  std::string header_text;
  try {
    json header = json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    uint64_t offset = 0;
    for (size_t t : order) {
      const SafetensorsTensorToWrite& tensor = tensors[t];
      header[tensor.name] = {{"dtype", tensor.dtype},
                             {"shape", tensor.shape},
                             {"data_offsets", {offset, offset + tensor.size_bytes}}};
      offset += tensor.size_bytes;
    }
    header_text = header.dump();
  } catch (const std::exception& e) {  // invalid UTF-8 in a name, or bad_alloc
    return absl::InvalidArgumentError(
        absl::StrCat("writing safetensors file '", path, "': cannot build the header: ", e.what()));
  }
  header_text.append((8 - (8 + header_text.size()) % 8) % 8, ' ');
  uint8_t length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<uint8_t>(header_text.size() >> (8 * i));

  std::string tmp_path = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp_path.data());
  if (fd < 0) return OsError(errno, path, absl::StrCat("cannot create '", tmp_path, "'"));
  bool ok = ::fchmod(fd, 0644) == 0 && WriteAll(fd, length_bytes, sizeof length_bytes) &&
            WriteAll(fd, header_text.data(), header_text.size());
  for (size_t i = 0; ok && i < order.size(); ++i) {
    ok = WriteAll(fd, tensors[order[i]].data, tensors[order[i]].size_bytes);
  }
  int err = ok ? 0 : errno;
  if (::close(fd) != 0 && ok) {  // delayed write errors (NFS, quota) surface here
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp_path.c_str());
    return OsError(err, path, "write");
  }
  if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_path.c_str());
    return OsError(err, path, "rename into place");
  }
  return absl::OkStatus();
}

absl::Status WriteLmHeadSafetensors(const std::string& path, const LmHead& head,
                                    WeightDType dtype, const std::string& tensor_name) {
  const int64_t n = head.vocab_size() * head.hidden_size();
  const auto* src = static_cast<const uint8_t*>(head.data());
  SafetensorsTensorToWrite tensor;
  tensor.name = tensor_name;
  tensor.dtype = WeightDTypeName(dtype);
  tensor.shape = {head.vocab_size(), head.hidden_size()};
  tensor.size_bytes = static_cast<size_t>(n * WeightDTypeSize(dtype));
  if (dtype == head.dtype()) {
    tensor.data = src;
    return WriteSafetensors(path, {tensor});
  }
  std::vector<uint8_t> converted(tensor.size_bytes);
  for (int64_t i = 0; i < n; ++i) {
    const float v = LoadAsFloat(src, head.dtype(), i);
    if (dtype == WeightDType::kFloat32) {
      std::memcpy(converted.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dtype == WeightDType::kBFloat16 ? FloatToBf16(v) : FloatToFp16(v);
      std::memcpy(converted.data() + 2 * i, &h, 2);
    }
  }
  tensor.data = converted.data();
  return WriteSafetensors(path, {tensor});
}

}  // namespace flashsampler
