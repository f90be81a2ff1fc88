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
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/request_fuzz_driver.h"
#include "server/model/lm_head.h"
#include "server/model/safetensors_writer.h"

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
  // Verify requests (CheckRequestBytes parses every input as both messages).
  ok &= WriteSeed(dir, "verify_gammas_0_2_5", ValidFuzzVerifyRequest({0, 2, 5}, 11).SerializeAsString());
  v1::VerifyRequest verify_controls = ValidFuzzVerifyRequest({3}, 12);
  v1::SamplingParams* vp = verify_controls.mutable_sequences(0)->mutable_params();
  vp->set_top_k(4);
  vp->set_repetition_penalty(1.3f);
  vp->add_prompt_token_ids(2);
  verify_controls.set_return_logz(true);
  ok &= WriteSeed(dir, "verify_controls", verify_controls.SerializeAsString());

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

// Bytes from small integers (an edit program for sampling_params).
std::string Program(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

// Programs for sampling_params (see CheckSamplingParams and its readers in
// fuzz/sampling_params_fuzz_driver.cc): shape, requests - 1, then per request
// rows - 1, entries mode (0: shared, 4: one per row, 7: count follows; +16
// logz, +32 logprobs) and per entry the edit count and edits (op % 20,
// operands; floats are indices into the driver's boundary-value table:
// 4 = 0.5, 5 = 2, 6 = -2, 9 = 100, 10 = -100, 13 = 1.0000001, 17 = 1e-45,
// 22 = 0.1, 23 = 1.5), then launch rows - 1 and one drop byte per launch.
bool WriteSamplingParamsSeeds(const std::string& root) {
  const std::string dir = root + "/sampling_params";
  bool ok = true;
  ok &= WriteSeed(dir, "plain_shared", Program({0, 0, 3, 0, 0, 7, 0}));
  // top_k 3, top_p 0.5, min_p 0.1 on V = 100 (valid 70), with logz + logprobs.
  ok &= WriteSeed(dir, "top_k_top_p_min_p", Program({3, 0, 2, 48, 3, 3, 5, 4, 4, 5, 22, 3, 0}));
  // One entry per row: logit bias (+100 on 3, -100 on 39), bans 0..2.
  ok &= WriteSeed(dir, "bias_and_bans",
                  Program({1, 0, 1, 4, 1, 6, 2, 3, 9, 39, 10, 1, 7, 3, 0, 1, 2, 3, 0}));
  // Bitmask of full length allowing token 5 only; then one allowing nothing
  // (FAILED_PRECONDITION), then the valid-vocabulary length (V = 100, valid 70).
  ok &= WriteSeed(dir, "bitmask_one_token", Program({0, 0, 1, 0, 1, 8, 12, 5, 1, 0}));
  ok &= WriteSeed(dir, "bitmask_none", Program({0, 0, 0, 0, 1, 8, 0, 0, 0}));
  ok &= WriteSeed(dir, "bitmask_valid_length", Program({3, 0, 0, 0, 1, 8, 5, 0, 0}));
  // Repetition 1.5, presence 2, frequency -2 over output and prompt ids.
  ok &= WriteSeed(dir, "penalties", Program({0, 0, 1, 0, 5, 9, 23, 10, 5, 11, 6, 12, 3, 4, 4, 5,
                                             13, 2, 6, 7, 3, 0}));
  // top_logprobs 20 in raw mode, 8 samples per row, shared by 4 rows.
  ok &= WriteSeed(dir, "top_logprobs_raw_samples", Program({3, 0, 3, 16, 3, 14, 22, 15, 3, 16, 10, 7, 0}));
  // Unfused top_k 100 on V = 130, 64 samples, top_logprobs 5 (sampled mode).
  ok &= WriteSeed(dir, "unfused_top_k_64_samples", Program({5, 0, 1, 0, 3, 3, 102, 16, 66, 14, 7, 3, 0}));
  // Four requests, plain and controlled alternating, launches of 3 rows, a drop.
  ok &= WriteSeed(dir, "mixed_queue", Program({0, 3, 4, 0, 0, 2, 0, 1, 3, 5, 1, 0, 0, 3, 4, 1, 3, 3,
                                               1, 3, 4, 1, 3, 5, 1, 3, 6, 2, 0, 0x81, 0, 0, 0}));
  // Out of range: top_p just over 1, bias 100.00001 on token V (one per entry).
  ok &= WriteSeed(dir, "out_of_range", Program({0, 0, 1, 4, 1, 4, 13, 1, 6, 1, 32, 11, 0}));
  // A params count of B + 2.
  ok &= WriteSeed(dir, "wrong_count", Program({0, 0, 1, 7, 4, 0, 0, 0, 0, 0}));
  // Repetition penalty 1e-45 on every prompt token (positive logits would
  // overflow): refused, below kMinRepetitionPenalty.
  ok &= WriteSeed(dir, "tiny_repetition_penalty",
                  Program({4, 0, 0, 0, 2, 9, 17, 13, 1, 0, 0, 0}));
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

// Programs for region_descriptor (fuzz/region_descriptor_fuzz_driver.cc):
// max_regions, then ops: 0 register (name pick, key kind 0 = the object,
// offset, size), 1 CUDA IPC (name, handle bytes, device, offset, size),
// 2 unregister (name), 3 resolve (name, offset, size), 4 request (name, rows
// - 1, bf16 flag, offset, odd = exact size), 5 list. Names: 0 "a", 1 "b",
// 2 "region-1", 3 "x.y_z", 4 "", >= 200 bytes follow. Extents: 0 and one
// byte, 1 and a u32, 2 and the object size minus (byte % 4), 3 and a u64.
std::string Small(int v) { return Program({0, v}); }
std::string U32(uint32_t v) { return std::string(1, '\x01') + LittleEndian(v, 4); }
std::string U64(uint64_t v) { return std::string(1, '\x03') + LittleEndian(v, 8); }
std::string NearEnd(int below) { return Program({2, below}); }

bool WriteRegionDescriptorSeeds(const std::string& root) {
  const std::string dir = root + "/region_descriptor";
  bool ok = true;
  const std::string reg_a = Program({0, 0, 0}) + U32(100) + U32(1000);
  ok &= WriteSeed(dir, "register_resolve_list", Program({3}) + reg_a + Program({3, 0}) + Small(5) + Small(16) +
                                                    Program({3, 0}) + U32(990) + U32(11) + Program({5}));
  ok &= WriteSeed(dir, "request_fp32_and_bf16", Program({3, 0, 0, 0}) + Small(0) + NearEnd(0) +
                                                    Program({4, 0, 1, 0}) + Small(64) + Program({1}) +
                                                    Program({4, 0, 3, 1}) + Small(8) + Program({1}) +
                                                    Program({4, 1, 0, 0}) + Small(0) + Program({1}));
  ok &= WriteSeed(dir, "limit_duplicates_unregister",
                  Program({1}) + reg_a + reg_a + Program({0, 1, 0}) + Small(0) + Small(8) + Program({2, 0}) +
                      Program({0, 1, 0}) + Small(0) + Small(8) + Program({2, 0, 5}));
  ok &= WriteSeed(dir, "bad_names_and_keys",
                  Program({3, 0, 4, 0}) + Small(0) + Small(8) + Program({0, 0, 2}) + Small(0) + Small(8) +
                      Program({0, 0, 1}) + Small(0) + Small(8) + Program({0, 250}) + LittleEndian(5, 4) +
                      "a/b c" + Program({0}) + Small(0) + Small(8) + Program({0, 0, 3}) + LittleEndian(6, 4) +
                      "/x/y\x00z" + Small(0) + Small(8) + Program({0, 0, 0}) + Small(0) + Small(0) + Program({5}));
  ok &= WriteSeed(dir, "overflowing_extents",
                  Program({2, 0, 0, 0}) + U64(~uint64_t{0}) + Small(2) + Program({0, 0, 0}) + NearEnd(3) + Small(4) +
                      Program({3, 0}) + U64(~uint64_t{0} - 1) + Small(3) + Program({3, 0}) + Small(1) +
                      U64(~uint64_t{0}) + Program({4, 0, 0, 1}) + U64(~uint64_t{0} - 8) + Program({1}));
  ok &= WriteSeed(dir, "cuda_ipc_refused", Program({2, 1, 0}) + LittleEndian(64, 4) + std::string(64, '\0') +
                                               Program({0}) + Small(0) + Small(16) + Program({5}));
  ok &= WriteSeed(dir, "regions_off", Program({0}) + reg_a + Program({5}));
  return ok;
}

// Byte streams for local_frame (fuzz/local_frame_fuzz_driver.cc): frames as
// client/local_frame.h lays them out, valid and hostile.
std::string Frame(uint32_t kind, uint64_t call_id, uint32_t arg, const std::string& payload,
                  uint32_t magic = 0x314C5346) {
  return LittleEndian(magic, 4) + LittleEndian(kind, 4) + LittleEndian(call_id, 8) + LittleEndian(arg, 4) +
         LittleEndian(payload.size(), 4) + payload;
}

bool WriteLocalFrameSeeds(const std::string& root) {
  const std::string dir = root + "/local_frame";
  const std::string one = ValidFuzzRequest(1, v1::DTYPE_BF16, 5).SerializeAsString();
  const std::string three = ValidFuzzRequest(3, v1::DTYPE_FP32, 6).SerializeAsString();
  bool ok = true;
  ok &= WriteSeed(dir, "one_request", Frame(1, 1, 1000000, one));
  ok &= WriteSeed(dir, "three_requests", Frame(1, 1, 0, one) + Frame(1, 2, 5, three) + Frame(1, 3, 0, ""));
  ok &= WriteSeed(dir, "garbage_payload_then_request", Frame(1, 7, 0, "\xff\xff\x01garbage") + Frame(1, 8, 0, one));
  ok &= WriteSeed(dir, "bad_magic", Frame(1, 1, 0, one, 0x324C5346));
  ok &= WriteSeed(dir, "unknown_kind_after_one", Frame(1, 1, 0, one) + Frame(9, 2, 0, "x"));
  ok &= WriteSeed(dir, "response_and_status_kinds", Frame(2, 1, 0, one) + Frame(3, 2, 3, "why"));
  ok &= WriteSeed(dir, "over_the_limit", Frame(1, 1, 0, "").substr(0, 20) + LittleEndian(0xFFFFFFFFu, 4));
  ok &= WriteSeed(dir, "cut_in_payload", Frame(1, 1, 0, three).substr(0, 40));
  ok &= WriteSeed(dir, "cut_in_header", Frame(1, 1, 0, one).substr(0, 13));
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
                  flashsampler::fuzz::WriteSamplingParamsSeeds(root) &&
                  flashsampler::fuzz::WriteRegionDescriptorSeeds(root) &&
                  flashsampler::fuzz::WriteLocalFrameSeeds(root) &&
                  flashsampler::fuzz::WriteSafetensorsSeeds(root, root + "/.scratch.safetensors");
  if (!ok) std::fprintf(stderr, "failed to write some seeds under %s\n", root.c_str());
  return ok ? 0 : 1;
}
