#include "server/model/lm_head.h"

#include <sys/stat.h>

#include <Random123/philox.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/common/half_precision.h"
#include "nlohmann/json.hpp"
#include "server/model/safetensors_file.h"

namespace flashsampler {

// At most one of the two is set: a file mapping (Load) or an owned buffer
// (Demo). data_ points into whichever it is; neither buffer moves when the
// LmHead (and with it the unique_ptr<Storage>) moves, so data_ stays valid.
struct LmHead::Storage {
  std::shared_ptr<const void> mapping;
  std::vector<uint16_t> owned;
};

namespace {

using json = nlohmann::json;

constexpr char kDefaultTensor[] = "lm_head.weight";
constexpr char kTiedTensor[] = "model.embed_tokens.weight";
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
// Index files are kilobytes to a few megabytes; the same bound as headers.
constexpr uint64_t kMaxIndexBytes = kMaxSafetensorsHeaderBytes;
constexpr size_t kNamesToList = 10;

// What the caller asked for, for messages: the explicit name, or the default
// with its tied-embedding fallback.
std::string Wanted(const std::string& tensor_name) {
  if (!tensor_name.empty()) return absl::StrCat("'", tensor_name, "'");
  return absl::StrCat("'", kDefaultTensor, "' or '", kTiedTensor, "'");
}

std::vector<std::string> Candidates(const std::string& tensor_name) {
  if (!tensor_name.empty()) return {tensor_name};
  return {kDefaultTensor, kTiedTensor};
}

// Appends the loading context to a status from a lower layer, keeping its code.
absl::Status WithContext(const absl::Status& status, const std::string& tensor_name) {
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), " (loading tensor ", Wanted(tensor_name), ")"));
}

std::string ListNames(const std::vector<std::string>& names) {
  if (names.empty()) return "it holds no tensors";
  std::vector<std::string> shown(names.begin(),
                                 names.begin() + std::min(names.size(), kNamesToList));
  std::string text = absl::StrCat("it holds ", names.size(), " tensor",
                                  names.size() == 1 ? "" : "s", ": ", absl::StrJoin(shown, ", "));
  if (names.size() > shown.size()) absl::StrAppend(&text, ", ...");
  return text;
}

enum class PathKind { kMissing, kFile, kDirectory, kOther };

// *error (optional) gets strerror of a failed stat.
PathKind Classify(const std::string& path, std::string* error = nullptr) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (error != nullptr) *error = std::strerror(errno);
    return PathKind::kMissing;
  }
  if (S_ISDIR(st.st_mode)) return PathKind::kDirectory;
  if (S_ISREG(st.st_mode)) return PathKind::kFile;
  return PathKind::kOther;
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return absl::StrCat(dir, "/", name);
}

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// A shard named by an index must stay inside the index's folder: a relative
// path without ".." components.
bool IsSafeShardName(const std::string& name) {
  if (name.empty() || name.front() == '/') return false;
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part == "..") return false;
  }
  return true;
}

// Resolves the tensor through a Hugging Face index: returns the shard path and
// sets *chosen to the candidate name the weight_map contains.
absl::StatusOr<std::string> ResolveShard(const std::string& index_path,
                                         const std::string& tensor_name, std::string* chosen) {
  const std::string context = absl::StrCat("index file '", index_path, "' (loading tensor ",
                                           Wanted(tensor_name), "): ");
  std::ifstream in(index_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(context, "cannot open"));
  std::string text;
  try {
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    if (size < 0) return absl::NotFoundError(absl::StrCat(context, "cannot read"));
    if (static_cast<uint64_t>(size) > kMaxIndexBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(context, "file is ", size, " bytes, more than the ", kMaxIndexBytes,
                       "-byte limit"));
    }
    in.seekg(0, std::ios::beg);
    text.resize(static_cast<size_t>(size));
    if (!in.read(text.data(), size)) return absl::NotFoundError(absl::StrCat(context, "cannot read"));

    const json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(context, "not valid JSON"));
    if (!index.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(context, "must be a JSON object"));
    }
    const auto map_it = index.find("weight_map");
    if (map_it == index.end() || !map_it->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(context, "has no \"weight_map\" object (tensor name -> shard file)"));
    }
    for (const std::string& candidate : Candidates(tensor_name)) {
      const auto it = map_it->find(candidate);
      if (it == map_it->end()) continue;
      if (!it->is_string() || !IsSafeShardName(it->get<std::string>())) {
        return absl::InvalidArgumentError(absl::StrCat(
            context, "weight_map entry of tensor '", candidate,
            "' must be a relative shard file name inside the index's folder"));
      }
      *chosen = candidate;
      return JoinPath(DirName(index_path), it->get<std::string>());
    }
    std::vector<std::string> names;
    for (const auto& [name, shard] : map_it->items()) names.push_back(name);
    std::sort(names.begin(), names.end());
    return absl::NotFoundError(absl::StrCat(context, "no tensor ", Wanted(tensor_name),
                                            " in its weight_map; ", ListNames(names)));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(context, "out of memory"));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(context, e.what()));
  }
}

absl::StatusOr<WeightDType> ParseWeightDType(const std::string& name) {
  if (name == "BF16") return WeightDType::kBFloat16;
  if (name == "F16") return WeightDType::kFloat16;
  if (name == "F32") return WeightDType::kFloat32;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype ", name, " (an LM head must be BF16, F16 or F32)"));
}

// The demo head's generator. Element e of the flat [vocab * hidden] matrix is
// a Box-Muller normal from Philox4x32-10 block e / 2 (key = seed, counter =
// {pair_lo, pair_hi, tag, 0}); the block's two 64-bit halves give u1, u2 with
// 53 bits each. Counter-based, so the result does not depend on how the work is
// split across threads. Math is in double with IEEE sqrt and the C library's
// log/cos/sin; those are within an ulp of exact on every mainstream libm, and an
// ulp of double is lost in the bf16 rounding except with probability ~2^-44
// per element, so the bytes are the same on every platform.
constexpr uint32_t kDemoTag = 0x44454d4f;  // "DEMO": keeps this stream apart from sampling noise

void FillDemo(uint16_t* out, int64_t begin_pair, int64_t end_pair, int64_t n, uint64_t seed,
              double sigma) {
  r123::Philox4x32 philox;
  const r123::Philox4x32::key_type key = {
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t p = begin_pair; p < end_pair; ++p) {
    const uint64_t pair = static_cast<uint64_t>(p);
    const r123::Philox4x32::ctr_type ctr = {
        {static_cast<uint32_t>(pair), static_cast<uint32_t>(pair >> 32), kDemoTag, 0}};
    const r123::Philox4x32::ctr_type r = philox(ctr, key);
    const uint64_t a = (static_cast<uint64_t>(r.v[0]) << 32 | r.v[1]) >> 11;
    const uint64_t b = (static_cast<uint64_t>(r.v[2]) << 32 | r.v[3]) >> 11;
    const double u1 = (static_cast<double>(a) + 0.5) * 0x1p-53;  // in (0, 1): log is finite
    const double u2 = static_cast<double>(b) * 0x1p-53;
    const double radius = sigma * std::sqrt(-2.0 * std::log(u1));
    const double theta = kTwoPi * u2;
    out[2 * p] = FloatToBf16(static_cast<float>(radius * std::cos(theta)));
    if (2 * p + 1 < n) out[2 * p + 1] = FloatToBf16(static_cast<float>(radius * std::sin(theta)));
  }
}

}  // namespace

int64_t WeightDTypeSize(WeightDType dtype) {
  switch (dtype) {
    case WeightDType::kFloat32:
      return 4;
    case WeightDType::kFloat16:
    case WeightDType::kBFloat16:
      return 2;
  }
  return 0;
}

const char* WeightDTypeName(WeightDType dtype) {
  switch (dtype) {
    case WeightDType::kFloat32:
      return "F32";
    case WeightDType::kFloat16:
      return "F16";
    case WeightDType::kBFloat16:
      return "BF16";
  }
  return "?";
}

LmHead::LmHead(std::unique_ptr<Storage> storage, const void* data, int64_t vocab, int64_t hidden,
               WeightDType dtype, std::string source)
    : storage_(std::move(storage)),
      data_(data),
      vocab_(vocab),
      hidden_(hidden),
      dtype_(dtype),
      source_(std::move(source)) {}

LmHead::LmHead(LmHead&& other) noexcept
    : storage_(std::move(other.storage_)),
      data_(std::exchange(other.data_, nullptr)),
      vocab_(std::exchange(other.vocab_, 0)),
      hidden_(std::exchange(other.hidden_, 0)),
      dtype_(other.dtype_),
      source_(std::move(other.source_)) {}

LmHead& LmHead::operator=(LmHead&& other) noexcept {
  if (this != &other) {
    storage_ = std::move(other.storage_);
    data_ = std::exchange(other.data_, nullptr);
    vocab_ = std::exchange(other.vocab_, 0);
    hidden_ = std::exchange(other.hidden_, 0);
    dtype_ = other.dtype_;
    source_ = std::move(other.source_);
  }
  return *this;
}

LmHead::~LmHead() = default;

absl::StatusOr<LmHead> LmHead::Load(const std::string& path, const std::string& tensor_name) {
  // 1. Find the file that holds the tensor (and which candidate name it is).
  std::string file_path;
  std::string chosen;
  std::string stat_error;
  const PathKind kind = Classify(path, &stat_error);
  if (kind == PathKind::kMissing) {
    return absl::NotFoundError(absl::StrCat("weights path '", path, "': ", stat_error,
                                            " (loading tensor ", Wanted(tensor_name), ")"));
  }
  std::string index_path;
  if (kind == PathKind::kDirectory) {
    if (Classify(JoinPath(path, kSingleFile)) == PathKind::kFile) {
      file_path = JoinPath(path, kSingleFile);
    } else if (Classify(JoinPath(path, kIndexFile)) == PathKind::kFile) {
      index_path = JoinPath(path, kIndexFile);
    } else {
      return absl::NotFoundError(absl::StrCat("weights folder '", path, "' has neither ", kSingleFile,
                                              " nor ", kIndexFile, " (loading tensor ",
                                              Wanted(tensor_name), ")"));
    }
  } else if (kind == PathKind::kFile && absl::EndsWith(path, ".index.json")) {
    index_path = path;
  } else {
    file_path = path;
  }
  if (!index_path.empty()) {
    absl::StatusOr<std::string> shard = ResolveShard(index_path, tensor_name, &chosen);
    if (!shard.ok()) return shard.status();
    file_path = *std::move(shard);
  }

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(file_path);
  if (!file.ok()) return WithContext(file.status(), tensor_name);
  if (chosen.empty()) {
    for (const std::string& candidate : Candidates(tensor_name)) {
      if (file->Contains(candidate)) {
        chosen = candidate;
        break;
      }
    }
    if (chosen.empty()) {
      return absl::NotFoundError(absl::StrCat("safetensors file '", file_path, "': no tensor ",
                                              Wanted(tensor_name), "; ",
                                              ListNames(file->TensorNames())));
    }
  }

  // 2. Validate it as an LM head. GetTensor has already bounded the bytes.
  absl::StatusOr<SafetensorsTensor> tensor = file->GetTensor(chosen);
  if (!tensor.ok()) {
    if (!index_path.empty() && absl::IsNotFound(tensor.status())) {
      return absl::NotFoundError(absl::StrCat(tensor.status().message(), " (the index '", index_path,
                                              "' says it is in this shard)"));
    }
    return tensor.status();
  }
  const std::string where = absl::StrCat("safetensors file '", file_path, "', tensor '", chosen, "': ");
  absl::StatusOr<WeightDType> dtype = ParseWeightDType(tensor->dtype);
  if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat(where, dtype.status().message()));
  if (tensor->shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "shape [", absl::StrJoin(tensor->shape, ", "), "] has rank ",
                     tensor->shape.size(), "; an LM head must be 2-D [vocab, hidden]"));
  }
  const int64_t vocab = tensor->shape[0];
  const int64_t hidden = tensor->shape[1];
  if (vocab <= 0 || hidden <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "shape [", vocab, ", ", hidden, "] is empty; both dimensions must be > 0"));
  }
  // Token ids are int32 on the wire.
  if (vocab > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "vocabulary of ", vocab, " rows does not fit int32 token ids"));
  }

  auto storage = std::make_unique<Storage>();
  storage->mapping = file->mapping();
  return LmHead(std::move(storage), tensor->data, vocab, hidden, *dtype,
                absl::StrCat(file_path, ":", chosen));
}

LmHead LmHead::Demo(int64_t vocab, int64_t hidden, uint64_t seed) {
  const std::string source = absl::StrCat("demo(vocab=", vocab, ", hidden=", hidden, ", seed=", seed, ")");
  int64_t n = 0;
  // Invalid sizes cannot be reported through this signature; they give an
  // empty head (vocab_size() == 0) that callers must check, never a crash.
  if (vocab <= 0 || hidden <= 0 || vocab > std::numeric_limits<int32_t>::max() ||
      __builtin_mul_overflow(vocab, hidden, &n) || n > (int64_t{1} << 40)) {
    return LmHead(std::make_unique<Storage>(), nullptr, 0, 0, WeightDType::kBFloat16,
                  absl::StrCat(source, " [invalid size]"));
  }
  auto storage = std::make_unique<Storage>();
  try {
    storage->owned.resize(static_cast<size_t>(n));
  } catch (const std::bad_alloc&) {
    return LmHead(std::make_unique<Storage>(), nullptr, 0, 0, WeightDType::kBFloat16,
                  absl::StrCat(source, " [out of memory]"));
  }
  uint16_t* out = storage->owned.data();
  const double sigma = 2.0 / std::sqrt(static_cast<double>(hidden));
  const int64_t pairs = (n + 1) / 2;

  // The thread count changes only the speed: each pair's values depend on its
  // index alone. ~1M pairs per thread amortizes starting it.
  constexpr int64_t kPairsPerThread = int64_t{1} << 20;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t num_threads = std::clamp<int64_t>((pairs + kPairsPerThread - 1) / kPairsPerThread,
                                                  1, std::min<int64_t>(hw, 16));
  const auto chunk_begin = [&](int64_t t) { return pairs * t / num_threads; };
  std::vector<std::thread> workers;
  try {
    workers.reserve(static_cast<size_t>(num_threads));
    for (int64_t t = 1; t < num_threads; ++t) {
      workers.emplace_back(FillDemo, out, chunk_begin(t), chunk_begin(t + 1), n, seed, sigma);
    }
  } catch (const std::exception&) {
    // Fewer threads than planned (std::system_error): the caller covers the rest.
  }
  // Workers run chunks 1..workers.size(); this thread runs chunk 0 and the tail
  // of chunks that could not be started (empty when all started).
  FillDemo(out, chunk_begin(0), chunk_begin(1), n, seed, sigma);
  FillDemo(out, chunk_begin(static_cast<int64_t>(workers.size()) + 1), pairs, n, seed, sigma);
  for (std::thread& w : workers) w.join();
  const void* data = out;
  return LmHead(std::move(storage), data, vocab, hidden, WeightDType::kBFloat16, source);
}

}  // namespace flashsampler
