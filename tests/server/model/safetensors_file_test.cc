// SafetensorsFile: header parsing and the bounds guarantees of GetTensor, on
// hand-made well-formed and malformed files.
#include "server/model/safetensors_file.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/scoped_temp_dir.h"
#include "server/model/safetensors_writer.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;

// A fresh folder per test under GoogleTest's temp dir, removed afterwards.
class SafetensorsFileTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return tmp_.Path(name); }

  testing::ScopedTempDir tmp_{"safetensors_file"};
  const std::string& dir_ = tmp_.path();
};

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string LengthPrefix(uint64_t n) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  return bytes;
}

// length + header + data, the length taken from the header unless overridden.
std::string Raw(const std::string& header, const std::string& data) {
  return LengthPrefix(header.size()) + header + data;
}

TEST_F(SafetensorsFileTest, DTypeBitsCoverTheFormat) {
  EXPECT_EQ(SafetensorsDTypeBits("BF16"), 16);
  EXPECT_EQ(SafetensorsDTypeBits("F16"), 16);
  EXPECT_EQ(SafetensorsDTypeBits("F32"), 32);
  EXPECT_EQ(SafetensorsDTypeBits("I64"), 64);
  EXPECT_EQ(SafetensorsDTypeBits("F8_E4M3"), 8);
  EXPECT_EQ(SafetensorsDTypeBits("F4"), 4);
  EXPECT_EQ(SafetensorsDTypeBits("bf16"), std::nullopt);  // names are case-sensitive
  EXPECT_EQ(SafetensorsDTypeBits(""), std::nullopt);
}

TEST_F(SafetensorsFileTest, ReadsTensorsAndMetadata) {
  const std::string header =
      R"({"__metadata__":{"format":"pt","n":3},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[1,3],"data_offsets":[8,11]}})";
  const std::string data = std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8) + "xyz";
  WriteBytes(Path("t.safetensors"), Raw(header, data));

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(Path("t.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->TensorNames(), (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(file->Contains("__metadata__"));
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().count("n"), 0u);  // non-string metadata is ignored

  absl::StatusOr<SafetensorsTensor> a = file->GetTensor("a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, "F32");
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2}));
  ASSERT_EQ(a->size_bytes, 8);
  float values[2];
  std::memcpy(values, a->data, 8);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], 2.0f);

  absl::StatusOr<SafetensorsTensor> b = file->GetTensor("b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b->data), 3), "xyz");

  absl::StatusOr<SafetensorsTensor> missing = file->GetTensor("c");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'c'"));
  EXPECT_THAT(missing.status().message(), HasSubstr(Path("t.safetensors")));
}

TEST_F(SafetensorsFileTest, MappingOutlivesTheFileObjectAndTheDirectoryEntry) {
  WriteBytes(Path("t.safetensors"),
             Raw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", "abcd"));
  std::shared_ptr<const void> keep;
  const uint8_t* data = nullptr;
  {
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(Path("t.safetensors"));
    ASSERT_TRUE(file.ok()) << file.status();
    SafetensorsFile moved = *std::move(file);
    data = moved.GetTensor("a")->data;
    keep = moved.mapping();
  }
  ASSERT_EQ(::unlink(Path("t.safetensors").c_str()), 0);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(data), 4), "abcd");
}

TEST_F(SafetensorsFileTest, ZeroSizedAndOverlappingTensorsAreInBounds) {
  // A 0 dimension makes the product 0 even when the other dims would overflow.
  const std::string header =
      R"({"empty":{"dtype":"F32","shape":[4611686018427387904,4,0],"data_offsets":[4,4]},)"
      R"("x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
      R"("y":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})";
  WriteBytes(Path("t.safetensors"), Raw(header, "abcd"));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(Path("t.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<SafetensorsTensor> empty = file->GetTensor("empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->size_bytes, 0);
  absl::StatusOr<SafetensorsTensor> y = file->GetTensor("y");
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(y->data), 2), "bc");
}

TEST_F(SafetensorsFileTest, FileLevelErrors) {
  struct Case {
    std::string name;
    std::string bytes;  // empty name: no file at all
    absl::StatusCode code;
    std::string substring;
  };
  const std::string big_len = LengthPrefix(uint64_t{1} << 62) + "{}";
  const std::vector<Case> cases = {
      {"missing", "", absl::StatusCode::kNotFound, "cannot open"},
      {"empty", std::string(), absl::StatusCode::kInvalidArgument, "shorter than the 8-byte"},
      {"seven_bytes", "1234567", absl::StatusCode::kInvalidArgument, "shorter than the 8-byte"},
      {"header_past_end", LengthPrefix(100) + "{}", absl::StatusCode::kInvalidArgument,
       "larger than the 2 bytes"},
      {"absurd_header", big_len, absl::StatusCode::kInvalidArgument, "exceeds the limit"},
      {"all_ones_length", std::string(8, '\xff') + "{}", absl::StatusCode::kInvalidArgument,
       "exceeds the limit"},
      {"zero_length_header", LengthPrefix(0) + "{}", absl::StatusCode::kInvalidArgument,
       "not valid JSON"},
      {"not_json", Raw("{\"a\": ", ""), absl::StatusCode::kInvalidArgument, "not valid JSON"},
      {"trailing_nul", Raw(std::string("{}\0", 3), ""), absl::StatusCode::kInvalidArgument,
       "not valid JSON"},
      {"invalid_utf8", Raw("{\"\xff\xfe\":1}", ""), absl::StatusCode::kInvalidArgument,
       "not valid JSON"},
      {"array", Raw("[1,2]", ""), absl::StatusCode::kInvalidArgument, "must be a JSON object"},
      {"string", Raw("\"hello\"", ""), absl::StatusCode::kInvalidArgument,
       "must be a JSON object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = Path(c.name + ".safetensors");
    if (c.name != "missing") WriteBytes(path, c.bytes);
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), c.code) << file.status();
    EXPECT_THAT(file.status().message(), HasSubstr(path));
    EXPECT_THAT(file.status().message(), HasSubstr(c.substring));
  }
}

TEST_F(SafetensorsFileTest, DirectoryIsNotARegularFile) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(dir_);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(file.status().message(), HasSubstr("not a regular file"));
}

TEST_F(SafetensorsFileTest, PaddedHeaderIsAccepted) {
  std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  header.append(13, ' ');
  WriteBytes(Path("t.safetensors"), Raw(header, "z"));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(Path("t.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->GetTensor("a").ok());
}

// Each malformed entry fails only its own GetTensor, with InvalidArgument and a
// message naming the file, the tensor and the problem; its neighbour still loads.
TEST_F(SafetensorsFileTest, MalformedEntriesFailOnlyThemselves) {
  struct Case {
    std::string entry;
    std::string substring;
  };
  const std::vector<Case> cases = {
      {R"([1,2])", "must be a JSON object"},
      {R"({"shape":[2],"data_offsets":[0,2]})", "missing \"dtype\""},
      {R"({"dtype":16,"shape":[2],"data_offsets":[0,2]})", "\"dtype\" must be a string"},
      {R"({"dtype":"Q7","shape":[2],"data_offsets":[0,2]})", "unknown dtype \"Q7\""},
      {R"({"dtype":"U8","data_offsets":[0,2]})", "missing \"shape\""},
      {R"({"dtype":"U8","shape":"2","data_offsets":[0,2]})", "\"shape\" must be an array"},
      {R"({"dtype":"U8","shape":["2"],"data_offsets":[0,2]})",
       "shape[0] must be a non-negative integer"},
      {R"({"dtype":"U8","shape":[2.0],"data_offsets":[0,2]})",
       "shape[0] must be a non-negative integer"},
      {R"({"dtype":"U8","shape":[1,-2],"data_offsets":[0,2]})", "shape[1] = -2 is negative"},
      {R"({"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,2]})", "is too large"},
      {R"({"dtype":"U8","shape":[1e300],"data_offsets":[0,2]})", "must be a non-negative integer"},
      {R"({"dtype":"BF16","shape":[4294967296,4294967296],"data_offsets":[0,2]})",
       "overflows a 64-bit size"},
      {R"({"dtype":"F32","shape":[2305843009213693952],"data_offsets":[0,2]})",
       "overflows a 64-bit size"},  // 2^61 elements fit int64, 2^61 * 32 bits do not
      {R"({"dtype":"F4","shape":[3],"data_offsets":[0,2]})", "does not fill whole bytes"},
      {R"({"dtype":"U8","shape":[2]})", "missing \"data_offsets\""},
      {R"({"dtype":"U8","shape":[2],"data_offsets":{"begin":0}})", "must be [begin, end]"},
      {R"({"dtype":"U8","shape":[2],"data_offsets":[0]})", "must be [begin, end]"},
      {R"({"dtype":"U8","shape":[2],"data_offsets":[0,2,4]})", "must be [begin, end]"},
      {R"({"dtype":"U8","shape":[2],"data_offsets":["0",2]})", "data_offsets[0] (begin) must be"},
      {R"({"dtype":"U8","shape":[2],"data_offsets":[0,null]})", "data_offsets[1] (end) must be"},
      {R"({"dtype":"U8","shape":[2],"data_offsets":[-1,1]})", "is negative"},
      {R"({"dtype":"U8","shape":[2],"data_offsets":[4,2]})", "begin > end"},
      {R"({"dtype":"U8","shape":[2],"data_offsets":[6,8]})", "beyond the data section of 4"},
      {R"({"dtype":"U8","shape":[2],"data_offsets":[0,18446744073709551615]})", "too large"},
      {R"({"dtype":"U8","shape":[2],"data_offsets":[0,3]})",
       "span 3 bytes but shape [2] of U8 needs 2 bytes"},
      {R"({"dtype":"BF16","shape":[2,2],"data_offsets":[0,4]})",
       "span 4 bytes but shape [2, 2] of BF16 needs 8 bytes"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.entry);
    const std::string path = Path(absl::StrCat("case", i++, ".safetensors"));
    const std::string header =
        absl::StrCat(R"({"good":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"bad.weight":)",
                     c.entry, "}");
    WriteBytes(path, Raw(header, "abcd"));
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_TRUE(file->Contains("bad.weight"));
    absl::StatusOr<SafetensorsTensor> bad = file->GetTensor("bad.weight");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
    EXPECT_THAT(bad.status().message(), HasSubstr(path));
    EXPECT_THAT(bad.status().message(), HasSubstr("'bad.weight'"));
    EXPECT_THAT(bad.status().message(), HasSubstr(c.substring));
    EXPECT_TRUE(file->GetTensor("good").ok());
  }
}

TEST_F(SafetensorsFileTest, DeeplyNestedHeaderDoesNotExhaustTheStack) {
  const std::string header = "{\"a\":" + std::string(200000, '[') + std::string(200000, ']') + "}";
  WriteBytes(Path("deep.safetensors"), Raw(header, ""));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(Path("deep.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->GetTensor("a").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsFileTest, RandomBytesAreRejected) {
  std::mt19937_64 rng(20240611);
  for (int i = 0; i < 400; ++i) {
    std::string bytes(rng() % 200, '\0');
    for (char& b : bytes) b = static_cast<char>(rng());
    if (i % 2 == 1 && bytes.size() >= 8) {
      // Half the files get a plausible length so the JSON parser sees garbage.
      const std::string len = LengthPrefix(rng() % (bytes.size() - 7));
      bytes.replace(0, 8, len);
    }
    const std::string path = Path(absl::StrCat("garbage", i));
    WriteBytes(path, bytes);
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    EXPECT_FALSE(file.ok()) << "file " << i << " parsed";
    if (!file.ok()) {
      EXPECT_THAT(file.status().message(), HasSubstr(path));
    }
  }
}

// Corrupting bytes of a valid file's header must never yield a tensor that
// reaches outside the file.
TEST_F(SafetensorsFileTest, MutatedHeadersStayInBounds) {
  std::vector<uint8_t> payload(64);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i);
  ASSERT_TRUE(WriteSafetensors(Path("seed.safetensors"),
                               {{"w", "BF16", {4, 4}, payload.data(), 32},
                                {"v", "F32", {2, 4}, payload.data() + 32, 32}})
                  .ok());
  std::ifstream in(Path("seed.safetensors"), std::ios::binary);
  const std::string original((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t header_end = original.size() - payload.size();
  const std::string alphabet = "0123456789-[]{},:\". eE+";

  std::mt19937_64 rng(7);
  int opened = 0;
  for (int i = 0; i < 600; ++i) {
    std::string bytes = original;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % header_end;  // includes the length field
      bytes[at] = (rng() % 2) ? alphabet[rng() % alphabet.size()] : static_cast<char>(rng());
    }
    if (rng() % 8 == 0) bytes.resize(rng() % bytes.size());
    const std::string path = Path(absl::StrCat("mutant", i));
    WriteBytes(path, bytes);
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    if (!file.ok()) continue;
    ++opened;
    const auto* base = static_cast<const uint8_t*>(file->mapping().get());
    for (const std::string& name : file->TensorNames()) {
      absl::StatusOr<SafetensorsTensor> t = file->GetTensor(name);
      if (!t.ok()) continue;
      EXPECT_GE(t->data, base);
      EXPECT_LE(t->data + t->size_bytes, base + file->file_size());
      uint8_t sum = 0;  // touches every byte; the sanitizer build checks the reads
      for (int64_t k = 0; k < t->size_bytes; ++k) sum = static_cast<uint8_t>(sum + t->data[k]);
      ::testing::Test::RecordProperty("checksum", sum);
    }
  }
  EXPECT_GT(opened, 0);  // some mutants keep a valid header, so the check above ran
}

}  // namespace
}  // namespace flashsampler
