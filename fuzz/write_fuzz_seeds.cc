// flashsampler-fuzz-seeds OUT_DIR: writes the seed corpora of the fuzz targets
// into OUT_DIR/<target>/ (fuzz/corpus/ in the repository). Seeds are valid
// inputs of several shapes and dtypes plus hand-made hostile ones (lying
// offsets, overlapping tensors, shapes whose byte count overflows), so the
// fuzzer starts next to every check. Deterministic: rerunning rewrites the
// same files.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/request_fuzz_driver.h"
#include "server/lm_head.h"
#include "server/safetensors_writer.h"

namespace flashsampler::fuzz {
namespace {

bool WriteSeed(const std::string& dir, const std::string& name, const std::string& bytes) {
  ::mkdir(dir.c_str(), 0755);
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

std::string LittleEndian(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

// A safetensors file from a literal header and data section.
std::string Safetensors(const std::string& header, const std::string& data) {
  return LittleEndian(header.size(), 8) + header + data;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool WriteRequestSeeds(const std::string& root) {
  const std::string dir = root + "/request_bytes";
  bool ok = true;
  for (v1::DType dtype : {v1::DTYPE_FP32, v1::DTYPE_FP16, v1::DTYPE_BF16}) {
    for (int64_t rows : {1, 3}) {
      v1::SampleRequest r = ValidFuzzRequest(rows, dtype, 7);
      ok &= WriteSeed(dir, absl::StrCat("valid_", v1::DType_Name(dtype), "_b", rows), r.SerializeAsString());
    }
  }
  v1::SampleRequest per_row = ValidFuzzRequest(2, v1::DTYPE_FP32, 3);
  per_row.add_params()->set_temperature(0.0f);
  per_row.set_return_logz(true);
  per_row.set_return_logprobs(true);
  per_row.set_request_id("seed");
  ok &= WriteSeed(dir, "valid_per_row_params", per_row.SerializeAsString());
  v1::SampleRequest overflow = ValidFuzzRequest(1, v1::DTYPE_FP32, 1);
  overflow.mutable_hidden_states()->set_shape(0, int64_t{1} << 61);  // B * D * 4 overflows
  ok &= WriteSeed(dir, "shape_overflow", overflow.SerializeAsString());
  v1::SampleRequest nan = ValidFuzzRequest(1, v1::DTYPE_FP32, 1);
  nan.mutable_hidden_states()->mutable_data()->replace(0, 4, LittleEndian(0x7fc00000, 4));
  ok &= WriteSeed(dir, "nan", nan.SerializeAsString());

  // Edit programs for request_edits: first byte picks the start request, then
  // (edit, operands...) pairs; see CheckRequestEdits.
  const std::string edits = root + "/request_edits";
  ok &= WriteSeed(edits, "start_only", std::string(1, '\x05'));
  ok &= WriteSeed(edits, "rows_overflow",
                  std::string("\x00\x01\x00", 3) + LittleEndian(uint64_t{1} << 62, 8));
  ok &= WriteSeed(edits, "consistent_b40", std::string("\x01\x06\x28", 3));
  ok &= WriteSeed(edits, "per_row_params", std::string("\x09\x0a", 2) + LittleEndian(0x3f800000, 4) +
                                               LittleEndian(0, 4) + LittleEndian(0x7f800000, 4));
  ok &= WriteSeed(edits, "bad_dtype", std::string("\x02\x00", 2) + LittleEndian(9, 4));
  ok &= WriteSeed(edits, "short_data", std::string("\x03\x03\xff", 3));
  ok &= WriteSeed(edits, "tiny_temperature",
                  std::string("\x00\x09\x00", 3) + LittleEndian(0x00000001, 4) + std::string("\x01", 1) +
                      LittleEndian(42, 8) + LittleEndian(7, 8));
  ok &= WriteSeed(edits, "flags_and_id", std::string("\x00\x0b\x01\x01", 4) + LittleEndian(5, 4) + "hello");
  return ok;
}

bool WriteSafetensorsSeeds(const std::string& root, const std::string& scratch) {
  const std::string dir = root + "/safetensors";
  bool ok = true;
  // Valid demo heads in every weight dtype, and a tied-embedding name.
  const LmHead head = LmHead::Demo(12, 8, 1);
  const struct {
    WeightDType dtype;
    const char* tensor;
    const char* name;
  } heads[] = {{WeightDType::kBFloat16, "lm_head.weight", "demo_bf16"},
               {WeightDType::kFloat16, "lm_head.weight", "demo_f16"},
               {WeightDType::kFloat32, "model.embed_tokens.weight", "demo_f32_tied"}};
  for (const auto& h : heads) {
    if (!WriteLmHeadSafetensors(scratch, head, h.dtype, h.tensor).ok()) return false;
    ok &= WriteSeed(dir, h.name, ReadFile(scratch));
  }
  std::remove(scratch.c_str());
  const std::string data16(16 * 2, '\x01');
  // Offsets past the data section.
  ok &= WriteSeed(dir, "lying_offsets",
                  Safetensors(R"({"lm_head.weight":{"dtype":"BF16","shape":[4,4],"data_offsets":[0,64]}})", data16));
  // Two tensors sharing bytes.
  ok &= WriteSeed(dir, "overlapping",
                  Safetensors(R"({"lm_head.weight":{"dtype":"BF16","shape":[2,4],"data_offsets":[0,16]},)"
                              R"("b":{"dtype":"BF16","shape":[2,4],"data_offsets":[8,24]},)"
                              R"("__metadata__":{"format":"pt"}})",
                              data16));
  // A shape whose byte count wraps int64 to the real size.
  ok &= WriteSeed(dir, "huge_shape",
                  Safetensors(R"({"lm_head.weight":{"dtype":"BF16","shape":[4611686018427387904,4],"data_offsets":[0,0]}})",
                              data16));
  ok &= WriteSeed(dir, "end_before_begin",
                  Safetensors(R"({"lm_head.weight":{"dtype":"F32","shape":[1,2],"data_offsets":[8,0]}})", data16));
  ok &= WriteSeed(dir, "wrong_rank",
                  Safetensors(R"({"lm_head.weight":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", data16));
  ok &= WriteSeed(dir, "header_longer_than_file", LittleEndian(1 << 20, 8) + "{}");
  ok &= WriteSeed(dir, "odd_dtypes",
                  Safetensors(R"({"lm_head.weight":{"dtype":"I64","shape":[2,2],"data_offsets":[0,32]},)"
                              R"("f4":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})",
                              data16));
  return ok;
}

}  // namespace
}  // namespace flashsampler::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR  (writes OUT_DIR/<target>/ seed files)\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  ::mkdir(root.c_str(), 0755);
  const bool ok = flashsampler::fuzz::WriteRequestSeeds(root) &&
                  flashsampler::fuzz::WriteSafetensorsSeeds(root, root + "/.scratch.safetensors");
  if (!ok) std::fprintf(stderr, "failed to write some seeds under %s\n", root.c_str());
  return ok ? 0 : 1;
}
