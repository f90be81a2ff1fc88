// flashsampler-demo-head: writes the seeded demo LM head (the server's embedded
// default, LmHead::Demo) to a safetensors file, so the same weights can be
// served with --weights, loaded by PyTorch peers, or shipped to a device.
//
//   flashsampler-demo-head --out=head.safetensors [--vocab=32000] [--hidden=1024]
//       [--seed=0] [--dtype=bf16|fp16|fp32] [--tensor=lm_head.weight]
//
// bf16 and fp32 files hold exactly the demo values; fp16 holds them rounded to
// nearest even (values below fp16's subnormal range lose precision).
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "server/model/lm_head.h"
#include "server/model/safetensors_writer.h"

ABSL_FLAG(std::string, out, "", "Output .safetensors file (required).");
ABSL_FLAG(int64_t, vocab, 32000, "Vocabulary size V (rows of W).");
ABSL_FLAG(int64_t, hidden, 1024, "Hidden size D (columns of W).");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the demo generator.");
ABSL_FLAG(std::string, dtype, "bf16", "Stored dtype: bf16, fp16 or fp32.");
ABSL_FLAG(std::string, tensor, "lm_head.weight", "Tensor name in the file.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes the seeded demo LM head to a safetensors file.\n"
      "  flashsampler-demo-head --out=FILE [--vocab=V] [--hidden=D] [--seed=S] "
      "[--dtype=bf16|fp16|fp32] [--tensor=NAME]");
  absl::ParseCommandLine(argc, argv);

  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "flashsampler-demo-head: --out=FILE is required\n");
    return 2;
  }
  const std::string dtype_name = absl::AsciiStrToLower(absl::GetFlag(FLAGS_dtype));
  flashsampler::WeightDType dtype;
  if (dtype_name == "bf16" || dtype_name == "bfloat16") {
    dtype = flashsampler::WeightDType::kBFloat16;
  } else if (dtype_name == "fp16" || dtype_name == "f16" || dtype_name == "float16") {
    dtype = flashsampler::WeightDType::kFloat16;
  } else if (dtype_name == "fp32" || dtype_name == "f32" || dtype_name == "float32") {
    dtype = flashsampler::WeightDType::kFloat32;
  } else {
    std::fprintf(stderr, "flashsampler-demo-head: --dtype must be bf16, fp16 or fp32, got '%s'\n",
                 dtype_name.c_str());
    return 2;
  }
  const int64_t vocab = absl::GetFlag(FLAGS_vocab);
  const int64_t hidden = absl::GetFlag(FLAGS_hidden);
  const std::string tensor = absl::GetFlag(FLAGS_tensor);
  if (vocab <= 0 || hidden <= 0 || vocab > INT32_MAX) {
    std::fprintf(stderr, "flashsampler-demo-head: need 0 < --vocab <= 2^31-1 and --hidden > 0\n");
    return 2;
  }
  if (tensor.empty()) {
    std::fprintf(stderr, "flashsampler-demo-head: --tensor must not be empty\n");
    return 2;
  }

  const flashsampler::LmHead head =
      flashsampler::LmHead::Demo(vocab, hidden, absl::GetFlag(FLAGS_seed));
  if (head.vocab_size() == 0) {
    std::fprintf(stderr, "flashsampler-demo-head: cannot generate %s\n", head.source().c_str());
    return 1;
  }
  const absl::Status status = flashsampler::WriteLmHeadSafetensors(out, head, dtype, tensor);
  if (!status.ok()) {
    std::fprintf(stderr, "flashsampler-demo-head: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s: tensor '%s' %s [%lld, %lld] from %s\n", out.c_str(), tensor.c_str(),
              flashsampler::WeightDTypeName(dtype), static_cast<long long>(vocab),
              static_cast<long long>(hidden), head.source().c_str());
  return 0;
}
