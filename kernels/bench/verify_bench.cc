// flashsampler-verify-bench: the GPU time of one speculative-verification step
// (issue: FlashSpec verify-and-resample for greedy drafts) on one GPU.
//
// A step verifies `sequences` sequences of gamma draft tokens each: rows =
// sequences * (gamma + 1) (gamma draft positions plus the bonus position). The
// engine runs them as one sampler launch with FusedSampleArgs::draft_tokens
// (the draft positions carry their draft token, the bonus position -1); the
// accept / reject chain is then walked on the host over O(rows) numbers, which
// is not timed here. Variants, each between its own pair of CUDA events:
//   fused_verify         LaunchFusedSample with drafts: log Z, l'_x - log Z and
//                        the residual Gumbel-max in one pass over W.
//   fused_plain          the same launch without drafts (tokens only): what the
//                        verification adds to plain sampling.
//   materialized_verify  LaunchMaterializedSample with drafts: cuBLAS logits
//                        [rows, V] in fp32, then the same Gumbel-max over them.
// The conventional PyTorch baseline (logits -> softmax -> accept -> residual ->
// multinomial) is kernels/bench/verify_peers.py, on the same shapes.
// Inputs: W ~ N(0, logit_std^2 / D) bf16, H ~ N(0, 1) exact in bf16, random
// draft tokens, temperature --temperature. Median / min of --iterations runs
// after --warmup, variants round-robin, no host synchronization in between.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/bench/cuda_bench.h"
#include "kernels/common/kernel_status.h"
#include "kernels/common/row_params.h"
#include "kernels/cuda/fused_sample.h"
#include "kernels/cuda/materialized_sample.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int64_t, hidden, 4096, "hidden size D");
ABSL_FLAG(int64_t, vocab, 151936, "vocabulary V");
ABSL_FLAG(std::string, gammas, "1,3,5,7", "draft lengths gamma");
ABSL_FLAG(std::string, sequences, "1,2,4,8,16", "sequences per step");
ABSL_FLAG(int, iterations, 100, "timed runs per variant (>= 100)");
ABSL_FLAG(int, warmup, 10, "untimed runs per variant");
ABSL_FLAG(float, temperature, 1.0f, "temperature of every row (> 0)");
ABSL_FLAG(float, logit_std, 2.0f, "standard deviation of the random logits");
ABSL_FLAG(std::string, json, "", "write the results to this JSON file");
ABSL_FLAG(std::string, commit, FLASHSAMPLER_BENCH_COMMIT, "commit recorded in the JSON");

namespace flashsampler::kernels {
namespace {

#define VB_CHECK(expr)                                                          \
  do {                                                                          \
    const auto vb_err = (expr);                                                 \
    if (vb_err != decltype(vb_err){}) {                                         \
      std::fprintf(stderr, "%s failed (%d)\n", #expr, static_cast<int>(vb_err)); \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

bool ParseList(const std::string& text, std::vector<int64_t>* out) {
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(item, &v) || v < 0) return false;
    out->push_back(v);
  }
  return !out->empty();
}

struct Stats {
  double median_ms = 0.0, min_ms = 0.0;
};

Stats Summarize(std::vector<float> ms) {
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return Stats{n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]), ms.front()};
}

int Run() {
  const int64_t d = absl::GetFlag(FLAGS_hidden), v = absl::GetFlag(FLAGS_vocab);
  const int iterations = absl::GetFlag(FLAGS_iterations), warmup = absl::GetFlag(FLAGS_warmup);
  const float temperature = absl::GetFlag(FLAGS_temperature);
  std::vector<int64_t> gammas, sequences;
  if (!ParseList(absl::GetFlag(FLAGS_gammas), &gammas) ||
      !ParseList(absl::GetFlag(FLAGS_sequences), &sequences) || d < 8 || d % 8 != 0 || v < 2 ||
      iterations < 100 || warmup < 1 || !(temperature > 0.0f)) {
    std::cerr << "flashsampler-verify-bench: bad flags (see --help)\n";
    return 2;
  }
  int64_t max_rows = 0;
  for (int64_t g : gammas) {
    for (int64_t s : sequences) max_rows = std::max(max_rows, s * (g + 1));
  }
  if (max_rows < 1 || max_rows > 4096) {
    std::cerr << "flashsampler-verify-bench: 1 <= sequences * (gamma + 1) <= 4096\n";
    return 2;
  }

  cudaDeviceProp prop{};
  VB_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream = nullptr;
  VB_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t cublas = nullptr;
  VB_CHECK(cublasCreate(&cublas));

  void *w = nullptr, *ws = nullptr;
  float *h = nullptr, *draft_logprobs = nullptr;
  RowParams* params = nullptr;
  int32_t *tokens = nullptr, *drafts = nullptr;
  const size_t ws_bytes =
      std::max(FusedSampleWorkspaceBytes(max_rows, v, d),
               MaterializedSampleWorkspaceBytes(max_rows, v, d, CudaWeightDType::kBFloat16));
  VB_CHECK(cudaMalloc(&w, static_cast<size_t>(v) * d * 2));
  VB_CHECK(cudaMalloc(&h, static_cast<size_t>(max_rows) * d * sizeof(float)));
  VB_CHECK(cudaMalloc(&ws, ws_bytes));
  VB_CHECK(cudaMalloc(&params, max_rows * sizeof(RowParams)));
  VB_CHECK(cudaMalloc(&tokens, max_rows * sizeof(int32_t)));
  VB_CHECK(cudaMalloc(&drafts, max_rows * sizeof(int32_t)));
  VB_CHECK(cudaMalloc(&draft_logprobs, max_rows * sizeof(float)));
  const float w_scale = absl::GetFlag(FLAGS_logit_std) / std::sqrt(static_cast<float>(d));
  if (bench::FillNormalBf16(w, static_cast<size_t>(v) * d, w_scale, 1, stream) != 0 ||
      bench::FillNormalFloatBf16Exact(h, static_cast<size_t>(max_rows) * d, 1.0f, 2, stream) != 0) {
    std::cerr << "flashsampler-verify-bench: input generation failed\n";
    return 1;
  }

  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::printf("flashsampler-verify-bench on %s, D=%lld V=%lld bf16, T=%g, %d runs, %s, commit %s\n",
              prop.name, static_cast<long long>(d), static_cast<long long>(v), temperature,
              iterations, date, absl::GetFlag(FLAGS_commit).c_str());
  std::printf("%6s %5s %5s %16s %16s %21s\n", "gamma", "seqs", "rows", "fused_verify ms",
              "fused_plain ms", "materialized_verify ms");
  nlohmann::json results = nlohmann::json::array();
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> any_token(0, static_cast<int32_t>(v - 1));

  for (int64_t gamma : gammas) {
    for (int64_t seqs : sequences) {
      const int64_t rows = seqs * (gamma + 1);
      std::vector<RowParams> host_params(rows);
      std::vector<int32_t> host_drafts(rows);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t position = r % (gamma + 1);
        host_params[r] = RowParams{temperature, 1234 + static_cast<uint64_t>(r / (gamma + 1)),
                                   static_cast<uint64_t>(position), 0};
        host_drafts[r] = position < gamma ? any_token(rng) : -1;
      }
      VB_CHECK(cudaMemcpyAsync(params, host_params.data(), rows * sizeof(RowParams),
                               cudaMemcpyHostToDevice, stream));
      VB_CHECK(cudaMemcpyAsync(drafts, host_drafts.data(), rows * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream));
      FusedSampleArgs args;
      args.weight = w;
      args.hidden = h;
      args.params = params;
      args.batch = rows;
      args.vocab = v;
      args.valid_vocab = v;
      args.hidden_dim = d;
      args.token_ids = tokens;
      args.workspace = ws;
      args.workspace_bytes = ws_bytes;
      FusedSampleArgs plain = args;
      args.draft_tokens = drafts;
      args.draft_logprobs = draft_logprobs;

      auto fused_verify = [&] { return LaunchFusedSample(args, stream); };
      auto fused_plain = [&] { return LaunchFusedSample(plain, stream); };
      auto materialized = [&] { return LaunchMaterializedSample(args, cublas, stream); };
      for (int i = 0; i < warmup; ++i) {
        VB_CHECK(fused_verify());
        VB_CHECK(fused_plain());
        VB_CHECK(materialized());
      }
      std::vector<cudaEvent_t> ev(6 * iterations);
      for (cudaEvent_t& e : ev) VB_CHECK(cudaEventCreate(&e));
      for (int i = 0; i < iterations; ++i) {
        VB_CHECK(cudaEventRecord(ev[6 * i + 0], stream));
        VB_CHECK(fused_verify());
        VB_CHECK(cudaEventRecord(ev[6 * i + 1], stream));
        VB_CHECK(fused_plain());
        VB_CHECK(cudaEventRecord(ev[6 * i + 2], stream));
        VB_CHECK(cudaEventRecord(ev[6 * i + 3], stream));
        VB_CHECK(materialized());
        VB_CHECK(cudaEventRecord(ev[6 * i + 4], stream));
      }
      VB_CHECK(cudaStreamSynchronize(stream));
      VB_CHECK(cudaGetLastError());
      std::vector<float> t_verify(iterations), t_plain(iterations), t_mat(iterations);
      for (int i = 0; i < iterations; ++i) {
        VB_CHECK(cudaEventElapsedTime(&t_verify[i], ev[6 * i + 0], ev[6 * i + 1]));
        VB_CHECK(cudaEventElapsedTime(&t_plain[i], ev[6 * i + 1], ev[6 * i + 2]));
        VB_CHECK(cudaEventElapsedTime(&t_mat[i], ev[6 * i + 3], ev[6 * i + 4]));
      }
      for (cudaEvent_t e : ev) cudaEventDestroy(e);
      const Stats sv = Summarize(t_verify), sp = Summarize(t_plain), sm = Summarize(t_mat);
      std::printf("%6lld %5lld %5lld %16.4f %16.4f %21.4f\n", static_cast<long long>(gamma),
                  static_cast<long long>(seqs), static_cast<long long>(rows), sv.median_ms,
                  sp.median_ms, sm.median_ms);
      results.push_back({{"gamma", gamma},
                         {"sequences", seqs},
                         {"rows", rows},
                         {"fused_verify_ms", {{"median", sv.median_ms}, {"min", sv.min_ms}}},
                         {"fused_plain_ms", {{"median", sp.median_ms}, {"min", sp.min_ms}}},
                         {"materialized_verify_ms", {{"median", sm.median_ms}, {"min", sm.min_ms}}}});
    }
  }
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << nlohmann::json{{"device", prop.name},
                          {"date", date},
                          {"commit", absl::GetFlag(FLAGS_commit)},
                          {"hidden", d},
                          {"vocab", v},
                          {"temperature", temperature},
                          {"iterations", iterations},
                          {"results", results}}
               .dump(2)
        << "\n";
    if (!out) {
      std::cerr << "flashsampler-verify-bench: cannot write " << json_path << "\n";
      return 1;
    }
  }
  for (void* p : {w, ws, static_cast<void*>(h), static_cast<void*>(draft_logprobs),
                  static_cast<void*>(params), static_cast<void*>(tokens),
                  static_cast<void*>(drafts)}) {
    cudaFree(p);
  }
  cublasDestroy(cublas);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace flashsampler::kernels

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return flashsampler::kernels::Run();
}
