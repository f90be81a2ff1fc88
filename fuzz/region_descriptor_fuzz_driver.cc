#include "fuzz/region_descriptor_fuzz_driver.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input_reader.h"
#include "server/regions/memory_regions.h"
#include "server/api/request_parser.h"

namespace flashsampler::fuzz {
namespace {

constexpr int64_t kHidden = 4;

// The process's shared-memory object, made on first use and unlinked at exit.
const std::string& ObjectKey() {
  static const std::string* key = [] {
    auto* k = new std::string(absl::StrCat("/fs-region-fuzz-", getpid()));
    const int fd = shm_open(k->c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    FUZZ_CHECK(fd >= 0, "cannot create the fuzz shared-memory object");
    std::vector<uint8_t> pattern(kRegionObjectBytes);
    for (uint64_t i = 0; i < kRegionObjectBytes; ++i) pattern[i] = RegionPatternByte(i);
    FUZZ_CHECK(pwrite(fd, pattern.data(), pattern.size(), 0) == static_cast<ssize_t>(pattern.size()),
               "cannot fill the fuzz shared-memory object");
    close(fd);
    std::atexit([] { shm_unlink(ObjectKey().c_str()); });
    return k;
  }();
  return *key;
}

struct ModelRegion {
  uint64_t start = 0;
  uint64_t size = 0;
};

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool Inside(uint64_t offset, uint64_t size, uint64_t limit) {
  return offset <= limit && size <= limit - offset;
}

// A name: mostly from a small table (so operations meet the same regions),
// sometimes arbitrary bytes.
std::string TakeName(FuzzInputReader& in) {
  static const char* const kNames[] = {"a", "b", "region-1", "x.y_z", ""};
  const uint8_t pick = in.TakeByte();
  if (pick < 200) return kNames[pick % 5];
  return in.TakeBytes(140);
}

// Offsets and sizes: small, near the object's size, or any 64-bit value.
uint64_t TakeExtent(FuzzInputReader& in) {
  const uint8_t kind = in.TakeByte() % 4;
  switch (kind) {
    case 0: return in.TakeByte();
    case 1: return in.TakeU32() % (kRegionObjectBytes + 2);
    case 2: return kRegionObjectBytes - (in.TakeByte() % 4);
    default: return in.TakeU64();
  }
}

void CheckStatus(const absl::Status& s, absl::StatusCode want, const char* what) {
  if (s.code() != want) {
    std::fprintf(stderr, "%s: got %s, want code %d\n", what, s.ToString().c_str(), static_cast<int>(want));
  }
  FUZZ_CHECK(s.code() == want, what);
}

}  // namespace

void CheckRegionDescriptors(const uint8_t* data, size_t size) {
  FuzzInputReader in(data, size);
  const int max_regions = in.TakeByte() % 4;
  MemoryRegions regions(MemoryRegionsOptions{max_regions});
  std::map<std::string, ModelRegion> model;
  const std::string& key = ObjectKey();

  for (int op_index = 0; op_index < 64 && !in.empty(); ++op_index) {
    const uint8_t op = in.TakeByte() % 6;
    if (op == 0) {  // register a system shared-memory region
      const std::string name = TakeName(in);
      const uint8_t key_kind = in.TakeByte() % 4;
      const std::string use_key = key_kind == 0   ? key
                                  : key_kind == 1 ? absl::StrCat(key, "-absent")
                                  : key_kind == 2 ? std::string("/")
                                                  : in.TakeBytes(40);
      const uint64_t offset = TakeExtent(in);
      const uint64_t bytes = TakeExtent(in);
      const absl::Status s = regions.RegisterSystemSharedMemory(name, use_key, offset, bytes);
      const bool key_ok = use_key.size() >= 2 && use_key.size() <= 255 && use_key[0] == '/' &&
                          use_key.find('/', 1) == std::string::npos && use_key.find('\0') == std::string::npos;
      absl::StatusCode want = absl::StatusCode::kOk;
      if (max_regions == 0) want = absl::StatusCode::kFailedPrecondition;
      else if (!ValidName(name) || bytes == 0) want = absl::StatusCode::kInvalidArgument;
      else if (model.contains(name)) want = absl::StatusCode::kAlreadyExists;
      else if (static_cast<int>(model.size()) >= max_regions) want = absl::StatusCode::kResourceExhausted;
      else if (!key_ok) want = absl::StatusCode::kInvalidArgument;
      else if (use_key != key) {
        // An arbitrary valid key names no object of ours; shm_open may still
        // find another process's object (or refuse it), so only these codes.
        FUZZ_CHECK(s.code() == absl::StatusCode::kNotFound || s.code() == absl::StatusCode::kInvalidArgument ||
                       s.code() == absl::StatusCode::kPermissionDenied || s.ok(),
                   "a registration with a foreign key got an undocumented code");
        if (s.ok()) {
          FUZZ_CHECK(regions.Unregister(name).ok(), "a foreign registration could not be undone");
        }
        continue;
      } else if (!Inside(offset, bytes, kRegionObjectBytes)) want = absl::StatusCode::kInvalidArgument;
      CheckStatus(s, want, "RegisterSystemSharedMemory disagrees with the model");
      if (s.ok()) model[name] = ModelRegion{offset, bytes};
    } else if (op == 1) {  // register CUDA IPC: never possible without a GPU engine
      const std::string name = TakeName(in);
      const absl::Status s = regions.RegisterCudaIpc(name, in.TakeBytes(80), in.TakeByte(), TakeExtent(in),
                                                     TakeExtent(in));
      FUZZ_CHECK(!s.ok(), "a CUDA IPC region was registered without a GPU engine");
    } else if (op == 2) {  // unregister
      const std::string name = TakeName(in);
      const absl::Status s = regions.Unregister(name);
      CheckStatus(s, model.erase(name) ? absl::StatusCode::kOk : absl::StatusCode::kNotFound,
                  "Unregister disagrees with the model");
    } else if (op == 3) {  // resolve, read and write back
      const std::string name = TakeName(in);
      const uint64_t offset = TakeExtent(in);
      const uint64_t bytes = TakeExtent(in);
      absl::StatusOr<RegionSlice> slice = regions.Resolve(name, offset, bytes, "slice");
      auto it = model.find(name);
      if (it == model.end()) {
        CheckStatus(slice.status(), absl::StatusCode::kNotFound, "Resolve of an unknown name");
        continue;
      }
      const bool inside = bytes > 0 && Inside(offset, bytes, it->second.size);
      CheckStatus(slice.status(), inside ? absl::StatusCode::kOk : absl::StatusCode::kInvalidArgument,
                  "Resolve disagrees with the model");
      if (!slice.ok()) continue;
      std::vector<uint8_t> got(bytes);
      FUZZ_CHECK(slice->Read(got.data()).ok(), "reading a resolved slice failed");
      for (uint64_t i = 0; i < bytes; ++i) {
        FUZZ_CHECK(got[i] == RegionPatternByte(it->second.start + offset + i), "a slice read the wrong bytes");
      }
      FUZZ_CHECK(slice->Write(got.data(), got.size()).ok(), "writing a resolved slice failed");
    } else if (op == 4) {  // a Sample request naming the region
      const std::string name = TakeName(in);
      const int64_t rows = 1 + in.TakeByte() % 4;
      const bool bf16 = in.TakeByte() & 1;
      v1::SampleRequest request;
      request.mutable_hidden_states()->set_dtype(bf16 ? v1::DTYPE_BF16 : v1::DTYPE_FP32);
      request.mutable_hidden_states()->add_shape(rows);
      request.mutable_hidden_states()->add_shape(kHidden);
      request.add_params();
      v1::RegionSlice* ref = request.mutable_hidden_states_region();
      ref->set_region(name);
      ref->set_offset(TakeExtent(in));
      ref->set_byte_size(in.TakeByte() & 1 ? rows * kHidden * (bf16 ? 2 : 4) : TakeExtent(in));
      ModelShape shape;
      shape.vocab_size = shape.valid_vocab = 16;
      shape.hidden_size = kHidden;
      uint64_t seed = 1;
      absl::StatusOr<ParsedSampleRequest> parsed =
          ParseSampleRequest(request, shape, RequestLimits{8}, [&] { return seed++; }, &regions);
      auto it = model.find(name);
      const bool exact_size = ref->byte_size() == static_cast<uint64_t>(rows * kHidden * (bf16 ? 2 : 4));
      // The name is looked up before the size is checked: unknown is NOT_FOUND
      // whatever byte_size says.
      if (it == model.end()) {
        CheckStatus(parsed.status(), absl::StatusCode::kNotFound, "a request naming an unknown region");
      }
      if (parsed.ok()) {
        FUZZ_CHECK(it != model.end() && exact_size && Inside(ref->offset(), ref->byte_size(), it->second.size),
                   "a request was accepted with a slice outside its region");
        FUZZ_CHECK(parsed->batch.rows == rows &&
                       parsed->batch.hidden.size() == static_cast<size_t>(rows * kHidden),
                   "an accepted region request has the wrong shape");
      } else {
        FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument ||
                       parsed.status().code() == absl::StatusCode::kNotFound,
                   "a region request got an undocumented code");
      }
    } else {  // list
      const std::vector<RegionDescription> list = regions.List();
      FUZZ_CHECK(list.size() == model.size(), "List has the wrong number of regions");
      auto it = model.begin();
      for (const RegionDescription& d : list) {
        FUZZ_CHECK(d.name == it->first && d.offset == it->second.start && d.byte_size == it->second.size &&
                       d.key == key,
                   "List differs from the model");
        ++it;
      }
    }
  }
}

}  // namespace flashsampler::fuzz
