// LmHead: loading from single files, folders and sharded Hugging Face
// checkpoints; every malformed input is a status naming the file and the
// tensor; the seeded demo head is deterministic and has the promised moments.
#include "server/model/lm_head.h"

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/scoped_temp_dir.h"
#include "kernels/common/half_precision.h"
#include "server/model/safetensors_writer.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;

class LmHeadTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return tmp_.Path(name); }

  testing::ScopedTempDir tmp_{"lm_head"};
  const std::string& dir_ = tmp_.path();
};

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string Raw(const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(uint64_t{header.size()} >> (8 * i));
  return bytes + header + data;
}

std::string HeadBytes(const LmHead& head) {
  return std::string(static_cast<const char*>(head.data()),
                     static_cast<size_t>(head.vocab_size() * head.hidden_size() *
                                         WeightDTypeSize(head.dtype())));
}

// A [vocab, hidden] tensor whose element i has the 16-bit pattern `seed + i`.
std::vector<uint16_t> Pattern16(size_t n, uint16_t seed) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(seed + 7 * i);
  return v;
}

SafetensorsTensorToWrite Tensor16(const std::string& name, const std::string& dtype,
                                  const std::vector<uint16_t>& v, int64_t rows, int64_t cols) {
  return {name, dtype, {rows, cols}, v.data(), v.size() * 2};
}

TEST(WeightDTypeTest, SizesAndNames) {
  EXPECT_EQ(WeightDTypeSize(WeightDType::kFloat32), 4);
  EXPECT_EQ(WeightDTypeSize(WeightDType::kFloat16), 2);
  EXPECT_EQ(WeightDTypeSize(WeightDType::kBFloat16), 2);
  EXPECT_STREQ(WeightDTypeName(WeightDType::kFloat32), "F32");
  EXPECT_STREQ(WeightDTypeName(WeightDType::kFloat16), "F16");
  EXPECT_STREQ(WeightDTypeName(WeightDType::kBFloat16), "BF16");
}

TEST_F(LmHeadTest, LoadsEachDTypeExactly) {
  const std::vector<float> f32 = {0.0f, -1.0f, 3.5f, 1e-30f, -65504.0f, 1e30f};
  const std::vector<uint16_t> f16 = {0x0000, 0x3c00, 0xc000, 0x0001, 0x7bff, 0x8400};
  const std::vector<uint16_t> bf16 = {0x0000, 0x3f80, 0xc040, 0x0001, 0x7f7f, 0x8080};
  struct Case {
    std::string dtype;
    const void* data;
    size_t bytes;
    WeightDType expected;
  };
  for (const Case& c : {Case{"F32", f32.data(), 24, WeightDType::kFloat32},
                        Case{"F16", f16.data(), 12, WeightDType::kFloat16},
                        Case{"BF16", bf16.data(), 12, WeightDType::kBFloat16}}) {
    SCOPED_TRACE(c.dtype);
    const std::string path = Path(c.dtype + ".safetensors");
    ASSERT_TRUE(WriteSafetensors(path, {{"lm_head.weight", c.dtype, {3, 2}, c.data, c.bytes}}).ok());
    absl::StatusOr<LmHead> head = LmHead::Load(path, "");
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_EQ(head->vocab_size(), 3);
    EXPECT_EQ(head->hidden_size(), 2);
    EXPECT_EQ(head->dtype(), c.expected);
    EXPECT_EQ(HeadBytes(*head), std::string(static_cast<const char*>(c.data), c.bytes));
    EXPECT_EQ(head->source(), path + ":lm_head.weight");
  }
  // Spot-check the decoded values, not just the bytes.
  absl::StatusOr<LmHead> head = LmHead::Load(Path("BF16.safetensors"), "lm_head.weight");
  ASSERT_TRUE(head.ok()) << head.status();
  uint16_t h;
  std::memcpy(&h, static_cast<const char*>(head->data()) + 4, 2);
  EXPECT_EQ(Bf16ToFloat(h), -3.0f);
}

TEST_F(LmHeadTest, DataSurvivesMovesAndUnlinking) {
  const std::vector<uint16_t> v = Pattern16(12, 100);
  ASSERT_TRUE(WriteSafetensors(Path("t.safetensors"), {Tensor16("lm_head.weight", "BF16", v, 4, 3)}).ok());
  absl::StatusOr<LmHead> loaded = LmHead::Load(Path("t.safetensors"), "");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(::unlink(Path("t.safetensors").c_str()), 0);
  LmHead head = *std::move(loaded);
  LmHead other = LmHead::Demo(2, 2, 0);
  other = std::move(head);
  EXPECT_EQ(other.vocab_size(), 4);
  EXPECT_EQ(std::memcmp(other.data(), v.data(), 24), 0);
}

TEST_F(LmHeadTest, FolderWithModelSafetensors) {
  const std::vector<uint16_t> v = Pattern16(8, 1);
  std::filesystem::create_directory(Path("model"));
  ASSERT_TRUE(WriteSafetensors(Path("model/model.safetensors"), {Tensor16("lm_head.weight", "F16", v, 2, 4)}).ok());
  for (const std::string& folder : {Path("model"), Path("model/")}) {
    absl::StatusOr<LmHead> head = LmHead::Load(folder, "");
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_EQ(head->dtype(), WeightDType::kFloat16);
    EXPECT_EQ(std::memcmp(head->data(), v.data(), 16), 0);
    EXPECT_THAT(head->source(), HasSubstr("model.safetensors:lm_head.weight"));
  }
}

TEST_F(LmHeadTest, EmptyFolderIsNotFound) {
  std::filesystem::create_directory(Path("empty"));
  absl::StatusOr<LmHead> head = LmHead::Load(Path("empty"), "");
  EXPECT_EQ(head.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(head.status().message(), HasSubstr(Path("empty")));
  EXPECT_THAT(head.status().message(), HasSubstr("model.safetensors.index.json"));
  EXPECT_THAT(head.status().message(), HasSubstr("lm_head.weight"));
}

// A two-shard Hugging Face checkpoint: embeddings in shard 1, lm_head in shard 2.
class ShardedLmHeadTest : public LmHeadTest {
 protected:
  void SetUp() override {
    LmHeadTest::SetUp();
    std::filesystem::create_directory(Path("hf"));
    ASSERT_TRUE(WriteSafetensors(Path("hf/model-00001-of-00002.safetensors"),
                                 {Tensor16("model.embed_tokens.weight", "BF16", embed_, 5, 2),
                                  Tensor16("model.norm.weight", "BF16", norm_, 1, 2)})
                    .ok());
    ASSERT_TRUE(WriteSafetensors(Path("hf/model-00002-of-00002.safetensors"),
                                 {Tensor16("lm_head.weight", "BF16", head_, 5, 2)})
                    .ok());
  }
  void WriteIndex(const std::string& weight_map) {
    WriteBytes(Path("hf/model.safetensors.index.json"),
               absl::StrCat(R"({"metadata":{"total_size":46},"weight_map":)", weight_map, "}"));
  }
  static constexpr char kFullMap[] =
      R"({"model.embed_tokens.weight":"model-00001-of-00002.safetensors",)"
      R"("model.norm.weight":"model-00001-of-00002.safetensors",)"
      R"("lm_head.weight":"model-00002-of-00002.safetensors"})";

  std::vector<uint16_t> embed_ = Pattern16(10, 1000);
  std::vector<uint16_t> norm_ = Pattern16(2, 2000);
  std::vector<uint16_t> head_ = Pattern16(10, 3000);
};

TEST_F(ShardedLmHeadTest, FindsTheShardOfEachTensor) {
  WriteIndex(kFullMap);
  absl::StatusOr<LmHead> head = LmHead::Load(Path("hf"), "");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(std::memcmp(head->data(), head_.data(), 20), 0);
  EXPECT_THAT(head->source(), HasSubstr("model-00002-of-00002.safetensors:lm_head.weight"));

  absl::StatusOr<LmHead> embed = LmHead::Load(Path("hf"), "model.embed_tokens.weight");
  ASSERT_TRUE(embed.ok()) << embed.status();
  EXPECT_EQ(std::memcmp(embed->data(), embed_.data(), 20), 0);

  // The index file itself is accepted as the path too.
  absl::StatusOr<LmHead> via_index = LmHead::Load(Path("hf/model.safetensors.index.json"), "");
  ASSERT_TRUE(via_index.ok()) << via_index.status();
  EXPECT_EQ(std::memcmp(via_index->data(), head_.data(), 20), 0);
}

TEST_F(ShardedLmHeadTest, TiedEmbeddingsFallback) {
  WriteIndex(R"({"model.embed_tokens.weight":"model-00001-of-00002.safetensors"})");
  absl::StatusOr<LmHead> head = LmHead::Load(Path("hf"), "");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(std::memcmp(head->data(), embed_.data(), 20), 0);
  EXPECT_THAT(head->source(), HasSubstr(":model.embed_tokens.weight"));
}

TEST_F(ShardedLmHeadTest, IndexErrors) {
  struct Case {
    std::string index;
    absl::StatusCode code;
    std::string substring;
  };
  const std::vector<Case> cases = {
      {"not json", absl::StatusCode::kInvalidArgument, "not valid JSON"},
      {"[1]", absl::StatusCode::kInvalidArgument, "must be a JSON object"},
      {R"({"metadata":{}})", absl::StatusCode::kInvalidArgument, "no \"weight_map\""},
      {R"({"weight_map":[]})", absl::StatusCode::kInvalidArgument, "no \"weight_map\""},
      {R"({"weight_map":{"lm_head.weight":7}})", absl::StatusCode::kInvalidArgument,
       "relative shard file name"},
      {R"({"weight_map":{"lm_head.weight":"../outside.safetensors"}})",
       absl::StatusCode::kInvalidArgument, "relative shard file name"},
      {R"({"weight_map":{"lm_head.weight":"/etc/passwd"}})", absl::StatusCode::kInvalidArgument,
       "relative shard file name"},
      {R"({"weight_map":{"model.norm.weight":"model-00001-of-00002.safetensors"}})",
       absl::StatusCode::kNotFound, "model.norm.weight"},  // lists what is there
      {R"({"weight_map":{"lm_head.weight":"model-00003-of-00002.safetensors"}})",
       absl::StatusCode::kNotFound, "model-00003-of-00002.safetensors"},
      // The index lies: the named shard does not hold the tensor.
      {R"({"weight_map":{"lm_head.weight":"model-00001-of-00002.safetensors"}})",
       absl::StatusCode::kNotFound, "says it is in this shard"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.index);
    WriteBytes(Path("hf/model.safetensors.index.json"), c.index);
    absl::StatusOr<LmHead> head = LmHead::Load(Path("hf"), "");
    ASSERT_FALSE(head.ok());
    EXPECT_EQ(head.status().code(), c.code) << head.status();
    EXPECT_THAT(head.status().message(), HasSubstr(c.substring));
    EXPECT_THAT(head.status().message(), HasSubstr("lm_head.weight"));
    EXPECT_THAT(head.status().message(), HasSubstr(Path("hf/")));
  }
}

TEST_F(LmHeadTest, TensorNameResolution) {
  const std::vector<uint16_t> embed = Pattern16(6, 10);
  const std::vector<uint16_t> head = Pattern16(6, 20);
  const std::vector<uint16_t> other = Pattern16(6, 30);
  ASSERT_TRUE(WriteSafetensors(Path("tied.safetensors"),
                               {Tensor16("model.embed_tokens.weight", "BF16", embed, 3, 2),
                                Tensor16("other", "BF16", other, 3, 2)})
                  .ok());
  ASSERT_TRUE(WriteSafetensors(Path("both.safetensors"),
                               {Tensor16("model.embed_tokens.weight", "BF16", embed, 3, 2),
                                Tensor16("lm_head.weight", "BF16", head, 3, 2)})
                  .ok());

  absl::StatusOr<LmHead> tied = LmHead::Load(Path("tied.safetensors"), "");
  ASSERT_TRUE(tied.ok()) << tied.status();
  EXPECT_EQ(std::memcmp(tied->data(), embed.data(), 12), 0);

  absl::StatusOr<LmHead> both = LmHead::Load(Path("both.safetensors"), "");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(std::memcmp(both->data(), head.data(), 12), 0);  // lm_head wins

  absl::StatusOr<LmHead> named = LmHead::Load(Path("tied.safetensors"), "other");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(std::memcmp(named->data(), other.data(), 12), 0);

  // An explicit name has no fallback.
  absl::StatusOr<LmHead> missing = LmHead::Load(Path("tied.safetensors"), "lm_head.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(Path("tied.safetensors")));
  EXPECT_THAT(missing.status().message(), HasSubstr("'lm_head.weight'"));
  EXPECT_THAT(missing.status().message(), HasSubstr("model.embed_tokens.weight, other"));

  const std::vector<uint16_t> small = Pattern16(2, 0);
  ASSERT_TRUE(WriteSafetensors(Path("neither.safetensors"), {Tensor16("foo", "BF16", small, 1, 2)}).ok());
  absl::StatusOr<LmHead> neither = LmHead::Load(Path("neither.safetensors"), "");
  ASSERT_FALSE(neither.ok());
  EXPECT_EQ(neither.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(neither.status().message(), HasSubstr("'lm_head.weight' or 'model.embed_tokens.weight'"));
  EXPECT_THAT(neither.status().message(), HasSubstr("1 tensor: foo"));
}

TEST_F(LmHeadTest, MissingPathIsNotFound) {
  absl::StatusOr<LmHead> head = LmHead::Load(Path("nope.safetensors"), "w");
  EXPECT_EQ(head.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(head.status().message(), HasSubstr(Path("nope.safetensors")));
  EXPECT_THAT(head.status().message(), HasSubstr("'w'"));
}

// A path that exists as a name but cannot be opened (a dangling symlink) fails
// the same way for every user, root included.
TEST_F(LmHeadTest, UnopenablePathIsNotFound) {
  std::filesystem::create_symlink(Path("gone.safetensors"), Path("link.safetensors"));
  absl::StatusOr<LmHead> head = LmHead::Load(Path("link.safetensors"), "");
  EXPECT_EQ(head.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(head.status().message(), HasSubstr(Path("link.safetensors")));
}

// Whole-file problems: the message names the file and the tensor being loaded.
TEST_F(LmHeadTest, FileLevelErrorsNameFileAndTensor) {
  std::string all_ones(8, '\xff');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "shorter than the 8-byte header length"},
      {"abc", "shorter than the 8-byte header length"},
      {all_ones + "{}", "exceeds the limit"},
      {std::string("\x40\x00\x00\x00\x00\x00\x00\x00{}", 10), "larger than the 2 bytes"},
      {Raw("{oops}", ""), "not valid JSON"},
      {Raw("[]", ""), "must be a JSON object"},
  };
  int i = 0;
  for (const auto& [bytes, substring] : cases) {
    SCOPED_TRACE(substring);
    const std::string path = Path(absl::StrCat("bad", i++, ".safetensors"));
    WriteBytes(path, bytes);
    for (const std::string& name : {std::string(), std::string("lm_head.weight")}) {
      absl::StatusOr<LmHead> head = LmHead::Load(path, name);
      ASSERT_FALSE(head.ok());
      EXPECT_EQ(head.status().code(), absl::StatusCode::kInvalidArgument) << head.status();
      EXPECT_THAT(head.status().message(), HasSubstr(path));
      EXPECT_THAT(head.status().message(), HasSubstr("'lm_head.weight'"));
      EXPECT_THAT(head.status().message(), HasSubstr(substring));
    }
  }
}

// Entry problems, reported as InvalidArgument naming the file and the tensor.
TEST_F(LmHeadTest, MalformedTensorEntries) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("x")", "must be a JSON object"},
      {R"({"shape":[2,2],"data_offsets":[0,8]})", "missing \"dtype\""},
      {R"({"dtype":["BF16"],"shape":[2,2],"data_offsets":[0,8]})", "\"dtype\" must be a string"},
      {R"({"dtype":"BF16","data_offsets":[0,8]})", "missing \"shape\""},
      {R"({"dtype":"BF16","shape":{"rows":2},"data_offsets":[0,8]})", "\"shape\" must be an array"},
      {R"({"dtype":"BF16","shape":[2,true],"data_offsets":[0,8]})", "shape[1] must be a non-negative integer"},
      {R"({"dtype":"BF16","shape":[-2,-2],"data_offsets":[0,8]})", "shape[0] = -2 is negative"},
      {R"({"dtype":"BF16","shape":[9223372036854775807,9223372036854775807],"data_offsets":[0,8]})",
       "overflows a 64-bit size"},
      {R"({"dtype":"BF16","shape":[4611686018427387904,1],"data_offsets":[0,8]})",
       "overflows a 64-bit size"},  // 2^62 elements * 16 bits
      {R"({"dtype":"BF16","shape":[2,2]})", "missing \"data_offsets\""},
      {R"({"dtype":"BF16","shape":[2,2],"data_offsets":8})", "must be [begin, end]"},
      {R"({"dtype":"BF16","shape":[2,2],"data_offsets":[0,8.5]})", "data_offsets[1] (end) must be"},
      {R"({"dtype":"BF16","shape":[2,2],"data_offsets":[8,0]})", "begin > end"},
      {R"({"dtype":"BF16","shape":[2,2],"data_offsets":[0,16]})", "beyond the data section of 8 bytes"},
      {R"({"dtype":"BF16","shape":[2,2],"data_offsets":[0,6]})", "span 6 bytes but shape [2, 2] of BF16 needs 8"},
      {R"({"dtype":"BF16","shape":[4,4],"data_offsets":[0,8]})", "span 8 bytes but shape [4, 4] of BF16 needs 32"},
      {R"({"dtype":"F8_E4M3","shape":[2,4],"data_offsets":[0,8]})", "unsupported dtype F8_E4M3"},
      {R"({"dtype":"I64","shape":[1,1],"data_offsets":[0,8]})", "unsupported dtype I64"},
      {R"({"dtype":"f32","shape":[1,2],"data_offsets":[0,8]})", "unknown dtype \"f32\""},
      {R"({"dtype":"BF16","shape":[4],"data_offsets":[0,8]})", "rank 1"},
      {R"({"dtype":"BF16","shape":[1,2,2],"data_offsets":[0,8]})", "rank 3"},
      {R"({"dtype":"BF16","shape":[],"data_offsets":[0,2]})", "rank 0"},
      {R"({"dtype":"BF16","shape":[0,4],"data_offsets":[0,0]})", "both dimensions must be > 0"},
      {R"({"dtype":"BF16","shape":[4,0],"data_offsets":[0,0]})", "both dimensions must be > 0"},
  };
  int i = 0;
  for (const auto& [entry, substring] : cases) {
    SCOPED_TRACE(entry);
    const std::string path = Path(absl::StrCat("entry", i++, ".safetensors"));
    WriteBytes(path, Raw(absl::StrCat(R"({"lm_head.weight":)", entry, "}"), std::string(8, '\x11')));
    for (const std::string& name : {std::string(), std::string("lm_head.weight")}) {
      absl::StatusOr<LmHead> head = LmHead::Load(path, name);
      ASSERT_FALSE(head.ok());
      EXPECT_EQ(head.status().code(), absl::StatusCode::kInvalidArgument) << head.status();
      EXPECT_THAT(head.status().message(), HasSubstr(path));
      EXPECT_THAT(head.status().message(), HasSubstr("tensor 'lm_head.weight'"));
      EXPECT_THAT(head.status().message(), HasSubstr(substring));
    }
  }
}

TEST_F(LmHeadTest, MalformedLmHeadDoesNotFallBackToEmbeddings) {
  const std::string header =
      R"({"lm_head.weight":{"dtype":"I64","shape":[1,1],"data_offsets":[0,8]},)"
      R"("model.embed_tokens.weight":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})";
  WriteBytes(Path("t.safetensors"), Raw(header, std::string(8, '\0')));
  absl::StatusOr<LmHead> head = LmHead::Load(Path("t.safetensors"), "");
  EXPECT_EQ(head.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(head.status().message(), HasSubstr("unsupported dtype I64"));
}

TEST_F(LmHeadTest, TruncatedFile) {
  const std::vector<uint16_t> v = Pattern16(64, 5);
  ASSERT_TRUE(WriteSafetensors(Path("t.safetensors"), {Tensor16("lm_head.weight", "BF16", v, 8, 8)}).ok());
  const auto full = std::filesystem::file_size(Path("t.safetensors"));
  std::filesystem::resize_file(Path("t.safetensors"), full - 1);
  absl::StatusOr<LmHead> head = LmHead::Load(Path("t.safetensors"), "");
  ASSERT_FALSE(head.ok());
  EXPECT_EQ(head.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(head.status().message(), HasSubstr("truncated file"));
  EXPECT_THAT(head.status().message(), HasSubstr("'lm_head.weight'"));
  EXPECT_THAT(head.status().message(), HasSubstr(Path("t.safetensors")));

  // Cut inside the header: the header length now points past the end.
  std::filesystem::resize_file(Path("t.safetensors"), 20);
  head = LmHead::Load(Path("t.safetensors"), "");
  EXPECT_EQ(head.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(head.status().message(), HasSubstr("truncated"));
}

TEST_F(LmHeadTest, RandomGarbageIsAnErrorNeverACrash) {
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 300; ++i) {
    std::string bytes(rng() % 128, '\0');
    for (char& b : bytes) b = static_cast<char>(rng());
    if (i % 3 == 0 && bytes.size() >= 9) {  // a plausible length, then a '{'
      const uint64_t n = rng() % (bytes.size() - 8) + 1;
      for (int k = 0; k < 8; ++k) bytes[k] = static_cast<char>(n >> (8 * k));
      bytes[8] = '{';
    }
    const std::string path = Path(absl::StrCat("garbage", i, ".safetensors"));
    WriteBytes(path, bytes);
    absl::StatusOr<LmHead> head = LmHead::Load(path, "");
    EXPECT_FALSE(head.ok()) << "garbage file " << i << " loaded";
  }
}

// Demo(4, 1024, 0): its first four bf16 values and the FNV-1a hash of all
// 8192 bytes, recorded from the implementation (see DeterministicInSeedAndPinned).
constexpr uint16_t kPinnedDemo[4] = {0x3d54, 0xbca8, 0x3c9c, 0x3daf};
constexpr uint64_t kPinnedDemoHash = 4435392854739145716ull;

TEST(LmHeadDemoTest, ShapeAndSource) {
  const LmHead head = LmHead::Demo(100, 64, 3);
  EXPECT_EQ(head.vocab_size(), 100);
  EXPECT_EQ(head.hidden_size(), 64);
  EXPECT_EQ(head.dtype(), WeightDType::kBFloat16);
  EXPECT_NE(head.data(), nullptr);
  EXPECT_THAT(head.source(), HasSubstr("demo("));
}

TEST(LmHeadDemoTest, InvalidSizesGiveAnEmptyHead) {
  for (const auto& [vocab, hidden] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 8}, {8, 0}, {-1, 8}, {int64_t{1} << 40, int64_t{1} << 40}}) {
    const LmHead head = LmHead::Demo(vocab, hidden, 0);
    EXPECT_EQ(head.vocab_size(), 0);
    EXPECT_EQ(head.data(), nullptr);
  }
}

TEST(LmHeadDemoTest, DeterministicInSeedAndPinned) {
  const LmHead a = LmHead::Demo(301, 33, 42);  // odd element count: last pair is half used
  const LmHead b = LmHead::Demo(301, 33, 42);
  const LmHead c = LmHead::Demo(301, 33, 43);
  EXPECT_EQ(HeadBytes(a), HeadBytes(b));
  EXPECT_NE(HeadBytes(a), HeadBytes(c));

  // Known answers: the demo head must never change silently, since served
  // weights, goldens and client tests all derive from it.
  const LmHead pinned = LmHead::Demo(4, 1024, 0);
  uint16_t first[4];
  std::memcpy(first, pinned.data(), sizeof first);
  EXPECT_EQ(first[0], kPinnedDemo[0]);
  EXPECT_EQ(first[1], kPinnedDemo[1]);
  EXPECT_EQ(first[2], kPinnedDemo[2]);
  EXPECT_EQ(first[3], kPinnedDemo[3]);
  uint64_t fnv = 1469598103934665603ull;  // FNV-1a over all 4096 values
  for (unsigned char ch : HeadBytes(pinned)) fnv = (fnv ^ ch) * 1099511628211ull;
  EXPECT_EQ(fnv, kPinnedDemoHash);
}

TEST(LmHeadDemoTest, MomentsMatchTheDocumentedNormal) {
  // n = 2^20 values of N(0, sigma^2), sigma = 2/sqrt(256) = 0.125. Tolerances
  // are 5 standard errors: mean sigma/sqrt(n); std sigma/sqrt(2n); fraction
  // within one sigma sqrt(p(1-p)/n) with p = 0.6827; bf16 rounding (relative
  // 2^-9) shifts the std by far less than that.
  const int64_t vocab = 4096, hidden = 256;
  const LmHead head = LmHead::Demo(vocab, hidden, 7);
  const double sigma = 2.0 / std::sqrt(static_cast<double>(hidden));
  const int64_t n = vocab * hidden;
  const auto* bits = static_cast<const uint16_t*>(head.data());
  double sum = 0, sum_sq = 0;
  int64_t within_one = 0, beyond_three = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = Bf16ToFloat(bits[i]);
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sum_sq += v * v;
    within_one += std::abs(v) <= sigma;
    beyond_three += std::abs(v) > 3 * sigma;
  }
  const double mean = sum / n;
  const double std = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 5 * sigma / std::sqrt(static_cast<double>(n)));
  EXPECT_NEAR(std / sigma, 1.0, 5 / std::sqrt(2.0 * n));
  const double p1 = 0.682689492;
  EXPECT_NEAR(static_cast<double>(within_one) / n, p1, 5 * std::sqrt(p1 * (1 - p1) / n));
  const double p3 = 0.002699796;
  EXPECT_NEAR(static_cast<double>(beyond_three) / n, p3, 5 * std::sqrt(p3 * (1 - p3) / n));
}

// What flashsampler-demo-head does: the written file loads back as the demo.
TEST_F(LmHeadTest, DemoRoundTripThroughTheWriter) {
  const LmHead demo = LmHead::Demo(257, 96, 11);
  const int64_t n = 257 * 96;
  const auto* demo_bits = static_cast<const uint16_t*>(demo.data());

  ASSERT_TRUE(WriteLmHeadSafetensors(Path("bf16.safetensors"), demo, WeightDType::kBFloat16).ok());
  absl::StatusOr<LmHead> bf16 = LmHead::Load(Path("bf16.safetensors"), "");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->dtype(), WeightDType::kBFloat16);
  EXPECT_EQ(bf16->vocab_size(), 257);
  EXPECT_EQ(bf16->hidden_size(), 96);
  EXPECT_EQ(HeadBytes(*bf16), HeadBytes(demo));

  ASSERT_TRUE(WriteLmHeadSafetensors(Path("f32.safetensors"), demo, WeightDType::kFloat32, "w").ok());
  absl::StatusOr<LmHead> f32 = LmHead::Load(Path("f32.safetensors"), "w");
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_EQ(f32->dtype(), WeightDType::kFloat32);
  for (int64_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, static_cast<const char*>(f32->data()) + 4 * i, 4);
    ASSERT_EQ(FloatToBits(v), FloatToBits(Bf16ToFloat(demo_bits[i]))) << i;
    ASSERT_EQ(FloatToBf16(v), demo_bits[i]) << i;  // narrows back exactly
  }

  ASSERT_TRUE(WriteLmHeadSafetensors(Path("f16.safetensors"), demo, WeightDType::kFloat16).ok());
  absl::StatusOr<LmHead> f16 = LmHead::Load(Path("f16.safetensors"), "");
  ASSERT_TRUE(f16.ok()) << f16.status();
  ASSERT_EQ(f16->dtype(), WeightDType::kFloat16);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(f16->data()) + 2 * i, 2);
    const float want = Bf16ToFloat(demo_bits[i]);
    // Nearest fp16: half an ulp relative for normals (|x| >= 2^-14), half the
    // subnormal spacing 2^-24 below.
    const float tolerance = std::max(std::abs(want) * 0x1p-11f, 0x1p-25f);
    ASSERT_LE(std::abs(Fp16ToFloat(h) - want), tolerance) << i;
  }
}

}  // namespace
}  // namespace flashsampler
