// WriteSafetensors: byte layout of the written file, input validation, and a
// round trip through SafetensorsFile.
#include "server/model/safetensors_writer.h"

#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/scoped_temp_dir.h"
#include "nlohmann/json.hpp"
#include "server/model/safetensors_file.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;

class SafetensorsWriterTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return tmp_.Path(name); }

  testing::ScopedTempDir tmp_{"safetensors_writer"};
  const std::string& dir_ = tmp_.path();
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST_F(SafetensorsWriterTest, LayoutIsPaddedContiguousAndSortedByElementSize) {
  const std::vector<uint8_t> u8 = {1, 2, 3};
  const std::vector<uint16_t> bf16 = {0x3f80, 0x4000, 0xc000, 0x0001, 0x7f80, 0xffff};
  const std::vector<float> f32 = {1.5f, -2.25f};
  const std::string path = Path("t.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"small", "U8", {3}, u8.data(), 3},
                                {"half", "BF16", {2, 3}, bf16.data(), 12},
                                {"wide", "F32", {1, 2}, f32.data(), 8}},
                               {{"format", "pt"}})
                  .ok());

  const std::string bytes = ReadAll(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 3 + 12 + 8);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  const size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');

  const nlohmann::json json = nlohmann::json::parse(header);
  EXPECT_EQ(json["__metadata__"]["format"], "pt");
  // F32 first, then BF16, then U8: each starts at a multiple of its element size.
  EXPECT_EQ(json["wide"]["data_offsets"], nlohmann::json({0, 8}));
  EXPECT_EQ(json["half"]["data_offsets"], nlohmann::json({8, 20}));
  EXPECT_EQ(json["small"]["data_offsets"], nlohmann::json({20, 23}));
  EXPECT_EQ(json["half"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(json["half"]["dtype"], "BF16");

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  absl::StatusOr<SafetensorsTensor> half = file->GetTensor("half");
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_EQ(std::memcmp(half->data, bf16.data(), 12), 0);
  absl::StatusOr<SafetensorsTensor> wide = file->GetTensor("wide");
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(wide->data) % 4, 0u);
  EXPECT_EQ(std::memcmp(wide->data, f32.data(), 8), 0);
  absl::StatusOr<SafetensorsTensor> small = file->GetTensor("small");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(std::memcmp(small->data, u8.data(), 3), 0);

  // Written through a temporary that was renamed into place: nothing left over.
  int entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    (void)entry;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST_F(SafetensorsWriterTest, EmptyFileAndZeroSizedTensor) {
  ASSERT_TRUE(WriteSafetensors(Path("none.safetensors"), {}).ok());
  absl::StatusOr<SafetensorsFile> none = SafetensorsFile::Open(Path("none.safetensors"));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->TensorNames().empty());

  ASSERT_TRUE(WriteSafetensors(Path("zero.safetensors"), {{"z", "F32", {0, 7}, nullptr, 0}}).ok());
  absl::StatusOr<SafetensorsFile> zero = SafetensorsFile::Open(Path("zero.safetensors"));
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->GetTensor("z")->size_bytes, 0);
}

TEST_F(SafetensorsWriterTest, RejectsBadInput) {
  const uint8_t data[8] = {};
  struct Case {
    std::vector<SafetensorsTensorToWrite> tensors;
    std::string substring;
  };
  const std::vector<Case> cases = {
      {{{"", "U8", {1}, data, 1}}, "empty tensor name"},
      {{{"__metadata__", "U8", {1}, data, 1}}, "reserved"},
      {{{"a", "U8", {1}, data, 1}, {"a", "U8", {1}, data, 1}}, "duplicate"},
      {{{"a", "X9", {1}, data, 1}}, "unknown dtype \"X9\""},
      {{{"a", "U8", {-1}, data, 1}}, "negative dimension"},
      {{{"a", "F32", {2}, data, 4}}, "do not match"},
      {{{"a", "F32", {int64_t{1} << 62, 8}, data, 8}}, "do not match"},
      {{{"a", "U8", {4}, nullptr, 4}}, "null data"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.substring);
    const absl::Status status = WriteSafetensors(Path("bad.safetensors"), c.tensors);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr(c.substring));
    EXPECT_THAT(status.message(), HasSubstr(Path("bad.safetensors")));
    EXPECT_FALSE(std::filesystem::exists(Path("bad.safetensors")));
  }
}

TEST_F(SafetensorsWriterTest, MissingFolderIsNotFound) {
  const uint8_t data[1] = {};
  const absl::Status status =
      WriteSafetensors(Path("no/such/dir/t.safetensors"), {{"a", "U8", {1}, data, 1}});
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr("no/such/dir/t.safetensors"));
}

TEST_F(SafetensorsWriterTest, OverwritesAnExistingFile) {
  const uint8_t a[1] = {1};
  const uint8_t b[2] = {2, 3};
  ASSERT_TRUE(WriteSafetensors(Path("t.safetensors"), {{"a", "U8", {1}, a, 1}}).ok());
  ASSERT_TRUE(WriteSafetensors(Path("t.safetensors"), {{"b", "U8", {2}, b, 2}}).ok());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(Path("t.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->TensorNames(), std::vector<std::string>{"b"});
}

}  // namespace
}  // namespace flashsampler
