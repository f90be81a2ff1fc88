// flashsampler-kernel-bench: times the fused sampler against the materialized
// baseline on random inputs, prints a table and optionally writes JSON.
//
//   flashsampler-kernel-bench --backend=cpu [--batch=8 --vocab=32000
//       --hidden=1024 --weight_dtype=fp32 --threads=0 --iterations=50 --json=out.json]
//   flashsampler-kernel-bench --backend=cuda [--shapes=4096x151936,8192x128256
//       --batches=1,2,4,8,16,32,64,128,256 --iterations=100 --json=out.json]
//   flashsampler-kernel-bench --backend=cuda --controls=all [--shapes=4096x151936 ...]
//       (the materialized controlled path: cuda_controlled_bench.cc)
//
//   flashsampler-kernel-bench --backend=cuda_sharded [--devices=0,1 --shapes=...
//       --batches=... --iterations=100 --json=out.json]
//   flashsampler-kernel-bench --backend=cuda_sharded --controls=all [--devices=0,1 ...]
//       (controlled rows over the shards: sharded_controlled_bench.cc)
//
// The cuda_sharded mode (built only with NCCL) times one sampling step with W
// split by vocabulary over --devices (default: every visible GPU) against one
// GPU, the summary exchange alone, and the all-gather-logits baseline:
// sharded_bench.cu.
//
// The CUDA mode (built only with the CUDA backend) measures the device's copy
// bandwidth and matmul rate, then times the fused sampler, cuBLAS's GEMM alone
// and the materialized baseline for every shape and batch: cuda_bench.cc.
//
// CPU variants (same B, V, D, threads, inputs and temperature):
//   fused            CpuTiledSampler::Sample, tokens only (W in token panels,
//                    fixed-order logits: kernels/cpu/fixed_order_logits.h;
//                    with --weight_dtype=bf16 or fp16 the panels hold the
//                    head's 16-bit values, as the CPU engine keeps them).
//   fused+logz       the same, also returning logz and logprobs.
//   materialized     the baseline a framework runs: ONE multi-threaded
//                    cblas_sgemm writes the full [B, V] logits, then a separate
//                    pass per row computes softmax(l / T) (max, exp, sum, written
//                    to a [B, V] probability buffer) and draws one multinomial
//                    sample by inverse CDF. Rows of that pass are spread over the
//                    same number of threads; OpenBLAS runs with --threads threads.
//   sgemm only       the baseline's matmul alone, for reference.
//   tile logits      one tile's logits ([B, tile_rows]) on one thread: the
//                    CPU backend's FixedOrderLogits, and OpenBLAS sgemm (one
//                    thread) on the same tile, which the backend used before.
//                    The fused sampler runs one such call per (tile, row block).
// Each variant is warmed up, then all are timed --iterations times, round-robin
// (one run of each per round), with std::chrono::steady_clock; the table shows
// the median and the minimum per variant.
//
// Inputs: H ~ N(0, 1) and W ~ N(0, (logit_std)^2 / D), so the logits are roughly
// N(0, logit_std^2); a 16-bit head is W rounded to bf16 or fp16, and the
// sgemm baseline multiplies by the same values widened to fp32. The fused sampler's pruning depends on the spread; the
// default 2.0 is in the range of trained LM heads, and --logit_std lets you try
// flatter (harder) or wider distributions.
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/flags/parse.h"
#include "kernels/common/gumbel_noise.h"
#include "kernels/common/half_precision.h"
#include "kernels/common/row_params.h"
#include "kernels/cpu/fixed_order_logits.h"
#include "kernels/cpu/tiled_sampler.h"
#include "kernels/cpu/worker_pool.h"
#include "nlohmann/json.hpp"
#if FLASHSAMPLER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/bench/cuda_bench.h"
#endif
#if FLASHSAMPLER_HAVE_NCCL
#include "kernels/bench/sharded_bench.h"
#endif

ABSL_FLAG(std::string, backend, "cpu", "cpu, cuda or cuda_sharded");
ABSL_FLAG(std::string, devices, "",
          "cuda_sharded: comma-separated GPU ordinals, one vocabulary shard each (empty: all visible)");
ABSL_FLAG(int64_t, batch, 8, "rows B");
ABSL_FLAG(int64_t, vocab, 32000, "vocabulary V");
ABSL_FLAG(int64_t, hidden, 1024, "hidden size D");
ABSL_FLAG(std::string, weight_dtype, "fp32",
          "cpu: dtype of the LM head, fp32, bf16 or fp16 (16-bit heads stay 16-bit in the "
          "fused sampler's token panels)");
ABSL_FLAG(int, threads, 0, "CPU threads for every variant (0: all hardware threads)");
ABSL_FLAG(int64_t, tile_rows, 1024, "tokens per tile of the fused CPU sampler");
ABSL_FLAG(int, iterations, 0,
          "timed runs per variant (0: 50 for cpu, at least 20; 100 for cuda, at least 100)");
ABSL_FLAG(int, warmup, 5, "untimed runs per variant before timing");
ABSL_FLAG(float, temperature, 1.0f, "sampling temperature of every row");
ABSL_FLAG(float, logit_std, 2.0f, "standard deviation of the random logits");
ABSL_FLAG(uint64_t, seed, 1, "seed of the random inputs and of the samplers");
ABSL_FLAG(std::string, json, "", "write the results to this JSON file");
ABSL_FLAG(std::string, commit, FLASHSAMPLER_BENCH_COMMIT, "commit recorded in the JSON");
ABSL_FLAG(std::string, shapes, "4096x151936,8192x128256",
          "cuda: comma-separated DxV shapes (hidden x vocab) of the bf16 LM head");
ABSL_FLAG(std::string, batches, "1,2,4,8,16,32,64,128,256", "cuda: comma-separated batch sizes");
ABSL_FLAG(std::string, controls, "",
          "cuda: time the controlled paths instead (all, or a comma list of top_p, top_k, "
          "top_k_top_p, min_p, bitmask; cuda_controlled_bench.cc); cuda_sharded: the "
          "controlled launchers over the shards (sharded_controlled_bench.cc)");
ABSL_FLAG(std::string, stage1, "auto",
          "cuda: the fused variant's stage-1 kernel: auto (the library's choice), mma_sync "
          "(the mma.sync tensor-core kernel at every B) or wgmma (the Hopper WGMMA + TMA kernel, "
          "sm_90 builds with CUTLASS, one block per SM) or wgmma_overlap (the same kernel at two "
          "blocks per SM, so one block's epilogue overlaps the other's main loop) or "
          "wgmma_pingpong (persistent, two consumer warpgroups alternating main loop and "
          "epilogue) or wgmma_separate_epilogue (persistent, two MMA warpgroups and 8 epilogue "
          "warps, 11 at 128 rows) or cuda_core (the CUDA-core kernel at every B); with --controls, the stage 1 "
          "of the fused controlled path and of its plain reference (not wgmma_pingpong or "
          "cuda_core there)");
ABSL_FLAG(int64_t, copy_mib, 2048, "cuda: MiB of the device-to-device copy that measures bandwidth");

namespace flashsampler::kernels {
namespace {

struct Variant {
  std::string name;
  std::function<void()> run;
};

struct Timing {
  std::string name;
  double median_ms = 0.0;
  double min_ms = 0.0;
};

// Warms every variant up, then times them round-robin: iteration i runs each
// variant once, in order. Interleaving spreads any background load of a shared
// machine over all variants instead of penalising whichever ran at that time.
std::vector<Timing> TimeInterleaved(const std::vector<Variant>& variants, int warmup,
                                    int iterations) {
  for (const Variant& v : variants) {
    for (int i = 0; i < warmup; ++i) v.run();
  }
  std::vector<std::vector<double>> ms(variants.size());
  for (int i = 0; i < iterations; ++i) {
    for (size_t k = 0; k < variants.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      variants[k].run();
      const auto t1 = std::chrono::steady_clock::now();
      ms[k].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  }
  std::vector<Timing> out;
  for (size_t k = 0; k < variants.size(); ++k) {
    std::vector<double>& m = ms[k];
    std::sort(m.begin(), m.end());
    const size_t n = m.size();
    const double median = n % 2 ? m[n / 2] : 0.5 * (m[n / 2 - 1] + m[n / 2]);
    out.push_back(Timing{variants[k].name, median, m.front()});
  }
  return out;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The materialized baseline: full logits, then softmax + multinomial per row.
class MaterializedSampler {
 public:
  MaterializedSampler(const float* weight, int64_t vocab, int64_t hidden, int64_t batch,
                      int threads)
      : weight_(weight),
        vocab_(vocab),
        hidden_(hidden),
        threads_(threads),
        pool_(threads),
        logits_(static_cast<size_t>(batch * vocab)),
        probs_(static_cast<size_t>(batch * vocab)) {}

  // One sgemm over the whole vocabulary with `threads` OpenBLAS threads.
  void Logits(const float* h, int64_t batch) {
    openblas_set_num_threads(threads_);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(batch),
                static_cast<int>(vocab_), static_cast<int>(hidden_), 1.0f, h,
                static_cast<int>(hidden_), weight_, static_cast<int>(hidden_), 0.0f,
                logits_.data(), static_cast<int>(vocab_));
  }

  void Sample(const float* h, int64_t batch, const RowParams* params, int32_t* tokens,
              float* logz) {
    Logits(h, batch);
    std::atomic<int64_t> next{0};
    pool_.RunOnAll([&](int) {
      for (int64_t b = next.fetch_add(1); b < batch; b = next.fetch_add(1)) {
        SoftmaxAndSample(b, params[b], &tokens[b], &logz[b]);
      }
    });
  }

 private:
  void SoftmaxAndSample(int64_t b, const RowParams& p, int32_t* token, float* logz) {
    const float scale = LogitScale(p);
    const float* l = logits_.data() + b * vocab_;
    float* q = probs_.data() + b * vocab_;
    float m = -INFINITY;
    for (int64_t v = 0; v < vocab_; ++v) m = std::max(m, l[v] * scale);
    float sum = 0.0f;
    for (int64_t v = 0; v < vocab_; ++v) sum += q[v] = expf(l[v] * scale - m);
    const float inv = 1.0f / sum;
    for (int64_t v = 0; v < vocab_; ++v) q[v] *= inv;  // the softmax tensor
    *logz = m + logf(sum);
    // One uniform per row from the same Philox stream, then inverse CDF.
    const float u = static_cast<float>(NoiseBits(p.seed, p.offset, p.stream, 0) >> 8) * 0x1p-24f;
    float cdf = 0.0f;
    int64_t v = 0;
    for (; v < vocab_ - 1; ++v) {
      cdf += q[v];
      if (u < cdf) break;
    }
    *token = static_cast<int32_t>(v);
  }

  const float* weight_;
  int64_t vocab_, hidden_;
  int threads_;
  WorkerPool pool_;
  std::vector<float> logits_;
  std::vector<float> probs_;
};

int RunCpu() {
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  const int64_t vocab = absl::GetFlag(FLAGS_vocab);
  const int64_t hidden = absl::GetFlag(FLAGS_hidden);
  const int64_t tile_rows = absl::GetFlag(FLAGS_tile_rows);
  const int iterations =
      absl::GetFlag(FLAGS_iterations) == 0 ? 50 : absl::GetFlag(FLAGS_iterations);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const float temperature = absl::GetFlag(FLAGS_temperature);
  const float logit_std = absl::GetFlag(FLAGS_logit_std);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const std::string weight_dtype = absl::GetFlag(FLAGS_weight_dtype);
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  if (batch <= 0 || vocab <= 0 || hidden <= 0 || iterations < 20 || warmup < 0 ||
      !(temperature >= 0.0f)) {
    std::cerr << "flashsampler-kernel-bench: need batch, vocab, hidden > 0, iterations >= 20, "
                 "temperature >= 0\n";
    return 2;
  }
  if (weight_dtype != "fp32" && weight_dtype != "bf16" && weight_dtype != "fp16") {
    std::cerr << "flashsampler-kernel-bench: --weight_dtype must be fp32, bf16 or fp16\n";
    return 2;
  }

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(vocab * hidden));
  std::vector<float> h(static_cast<size_t>(batch * hidden));
  const float w_scale = logit_std / std::sqrt(static_cast<float>(hidden));
  for (float& x : w) x = normal(rng) * w_scale;
  for (float& x : h) x = normal(rng);
  // A 16-bit head: its bits, and w becomes their (exact) fp32 values.
  std::vector<uint16_t> w16;
  if (weight_dtype != "fp32") {
    w16.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w16[i] = weight_dtype == "bf16" ? FloatToBf16(w[i]) : FloatToFp16(w[i]);
      w[i] = weight_dtype == "bf16" ? Bf16ToFloat(w16[i]) : Fp16ToFloat(w16[i]);
    }
  }
  std::vector<RowParams> params(batch);
  uint64_t offset = 0;  // advanced every call, like decode steps
  auto next_params = [&] {
    ++offset;
    for (int64_t b = 0; b < batch; ++b) {
      params[b] = RowParams{temperature, seed, offset, static_cast<uint32_t>(b)};
    }
  };

  // The panels in the head's dtype, as the CPU engine lays them out.
  const size_t panel_elements = static_cast<size_t>(TokenPanelElements(vocab, hidden));
  std::vector<float> panels32(w16.empty() ? panel_elements : 0, 0.0f);
  std::vector<uint16_t> panels16(w16.empty() ? 0 : panel_elements, 0);
  TokenPanels panels = panels32.data();
  if (w16.empty()) {
    PackTokenPanels(w.data(), 0, vocab, hidden, panels32.data());
  } else {
    PackTokenPanels(w16.data(), 0, vocab, hidden, panels16.data());
    panels = weight_dtype == "bf16" ? TokenPanels::BFloat16(panels16.data())
                                    : TokenPanels::Float16(panels16.data());
  }
  CpuTiledSampler fused(panels, vocab, vocab, hidden, {threads, tile_rows});
  MaterializedSampler materialized(w.data(), vocab, hidden, batch, threads);
  std::vector<int32_t> tokens(batch);
  std::vector<float> logz(batch), logprobs(batch), base_logz(batch);
  const int64_t tile = std::min(tile_rows, vocab);
  std::vector<float> tile_out(static_cast<size_t>(batch * tile));

  const std::vector<Variant> variants = {
      {"fused (tokens)",
       [&] {
         next_params();
         if (fused.Sample(h.data(), batch, params.data(), {tokens.data()}) != KernelStatus::kOk) {
           std::abort();
         }
       }},
      {"fused (tokens+logz+logprobs)",
       [&] {
         next_params();
         if (fused.Sample(h.data(), batch, params.data(),
                          {tokens.data(), logz.data(), logprobs.data()}) != KernelStatus::kOk) {
           std::abort();
         }
       }},
      {"materialized sgemm+softmax+sample",
       [&] {
         next_params();
         materialized.Sample(h.data(), batch, params.data(), tokens.data(), base_logz.data());
       }},
      {"materialized: sgemm only", [&] { materialized.Logits(h.data(), batch); }},
      {"tile logits, 1 thread: fixed order",
       [&] { FixedOrderLogits(h.data(), batch, panels, 0, tile, hidden, tile_out.data()); }},
      {"tile logits, 1 thread: sgemm",
       [&] {
         openblas_set_num_threads(1);
         cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(batch),
                     static_cast<int>(tile), static_cast<int>(hidden), 1.0f, h.data(),
                     static_cast<int>(hidden), w.data(), static_cast<int>(hidden), 0.0f,
                     tile_out.data(), static_cast<int>(tile));
       }},
  };
  const std::vector<Timing> results = TimeInterleaved(variants, warmup, iterations);
  openblas_set_num_threads(1);

  // Sanity: both paths see the same distribution, so their logz agree.
  double max_logz_diff = 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    max_logz_diff = std::max(max_logz_diff, std::fabs(double{logz[b]} - base_logz[b]));
  }

  const double baseline = results[2].median_ms;
  const std::string cpu = CpuModel();
  const std::string date = UtcNow();
  std::printf("flashsampler-kernel-bench backend=cpu  %s  %s\n", cpu.c_str(), date.c_str());
  std::printf("B=%lld V=%lld D=%lld W=%s threads=%d tile_rows=%lld T=%g logit_std=%g "
              "iterations=%d warmup=%d\n",
              static_cast<long long>(batch), static_cast<long long>(vocab),
              static_cast<long long>(hidden), weight_dtype.c_str(), threads,
              static_cast<long long>(tile_rows), temperature, logit_std, iterations, warmup);
  std::printf("%-36s %12s %12s %14s\n", "variant", "median_ms", "min_ms", "vs_materialized");
  for (const Timing& t : results) {
    std::printf("%-36s %12.3f %12.3f %13.2fx\n", t.name.c_str(), t.median_ms, t.min_ms,
                baseline / t.median_ms);
  }
  std::printf("max |logz fused - logz materialized| = %.3g\n", max_logz_diff);

  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    nlohmann::json j;
    j["backend"] = "cpu";
    j["device"] = cpu;
    j["date"] = date;
    j["commit"] = absl::GetFlag(FLAGS_commit);
    j["shapes"] = {{"batch", batch}, {"vocab", vocab}, {"hidden", hidden}};
    j["weight_dtype"] = weight_dtype;
    j["threads"] = threads;
    j["tile_rows"] = tile_rows;
    j["temperature"] = temperature;
    j["logit_std"] = logit_std;
    j["iterations"] = iterations;
    j["warmup"] = warmup;
    j["max_logz_diff"] = max_logz_diff;
    for (const Timing& t : results) {
      j["results"].push_back(
          {{"variant", t.name}, {"median_ms", t.median_ms}, {"min_ms", t.min_ms}});
    }
    std::ofstream out(json_path);
    out << j.dump(2) << "\n";
    if (!out) {
      std::cerr << "flashsampler-kernel-bench: cannot write " << json_path << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace flashsampler::kernels

#if FLASHSAMPLER_HAVE_CUDA
namespace flashsampler::kernels {
namespace {

// Parses "4096x151936,8192x128256" and "1,2,4"; false on any malformed entry.
bool ParseShapes(const std::string& text, std::vector<bench::CudaShape>* out) {
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::vector<absl::string_view> dv = absl::StrSplit(item, 'x');
    bench::CudaShape s;
    if (dv.size() != 2 || !absl::SimpleAtoi(dv[0], &s.hidden) ||
        !absl::SimpleAtoi(dv[1], &s.vocab)) {
      return false;
    }
    out->push_back(s);
  }
  return !out->empty();
}

bool ParseBatches(const std::string& text, std::vector<int64_t>* out) {
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t b = 0;
    if (!absl::SimpleAtoi(item, &b)) return false;
    out->push_back(b);
  }
  return !out->empty();
}

int RunCuda() {
  bench::CudaBenchOptions o;
  if (!ParseShapes(absl::GetFlag(FLAGS_shapes), &o.shapes)) {
    std::cerr << "flashsampler-kernel-bench: --shapes wants DxV[,DxV...], e.g. 4096x151936\n";
    return 2;
  }
  if (!ParseBatches(absl::GetFlag(FLAGS_batches), &o.batches)) {
    std::cerr << "flashsampler-kernel-bench: --batches wants B[,B...], e.g. 1,8,64\n";
    return 2;
  }
  o.iterations = absl::GetFlag(FLAGS_iterations) == 0 ? 100 : absl::GetFlag(FLAGS_iterations);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.temperature = absl::GetFlag(FLAGS_temperature);
  o.logit_std = absl::GetFlag(FLAGS_logit_std);
  o.seed = absl::GetFlag(FLAGS_seed);
  const int64_t copy_mib = absl::GetFlag(FLAGS_copy_mib);
  o.copy_bytes = copy_mib > 0 ? static_cast<size_t>(copy_mib) << 20 : 0;
  o.json_path = absl::GetFlag(FLAGS_json);
  o.commit = absl::GetFlag(FLAGS_commit);
  o.date = UtcNow();
  const std::string stage1 = absl::GetFlag(FLAGS_stage1);
  if (stage1 == "auto") {
    o.stage1 = Stage1Kernel::kAuto;
  } else if (stage1 == "mma_sync") {
    o.stage1 = Stage1Kernel::kMmaSync;
  } else if (stage1 == "wgmma") {
    o.stage1 = Stage1Kernel::kWgmma;
  } else if (stage1 == "wgmma_overlap") {
    o.stage1 = Stage1Kernel::kWgmmaOverlap;
  } else if (stage1 == "wgmma_pingpong") {
    o.stage1 = Stage1Kernel::kWgmmaPingpong;
  } else if (stage1 == "wgmma_separate_epilogue") {
    o.stage1 = Stage1Kernel::kWgmmaSeparateEpilogue;
  } else if (stage1 == "cuda_core") {
    o.stage1 = Stage1Kernel::kCudaCore;
  } else {
    std::cerr << "flashsampler-kernel-bench: --stage1 wants auto, mma_sync, wgmma, wgmma_overlap, "
                 "wgmma_pingpong, wgmma_separate_epilogue or cuda_core\n";
    return 2;
  }
  if (const std::string controls = absl::GetFlag(FLAGS_controls); !controls.empty()) {
    return bench::RunCudaControlledBench(o, controls);
  }
  return bench::RunCudaBench(o);
}

#if FLASHSAMPLER_HAVE_NCCL
int RunCudaSharded() {
  bench::CudaBenchOptions o;
  if (!ParseShapes(absl::GetFlag(FLAGS_shapes), &o.shapes) ||
      !ParseBatches(absl::GetFlag(FLAGS_batches), &o.batches)) {
    std::cerr << "flashsampler-kernel-bench: bad --shapes or --batches\n";
    return 2;
  }
  std::vector<int> devices;
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_devices), ',', absl::SkipWhitespace())) {
    int d = 0;
    if (!absl::SimpleAtoi(item, &d)) {
      std::cerr << "flashsampler-kernel-bench: --devices wants GPU ordinals, e.g. 0,1\n";
      return 2;
    }
    devices.push_back(d);
  }
  if (devices.empty()) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    for (int d = 0; d < count; ++d) devices.push_back(d);
  }
  o.iterations = absl::GetFlag(FLAGS_iterations) == 0 ? 100 : absl::GetFlag(FLAGS_iterations);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.temperature = absl::GetFlag(FLAGS_temperature);
  o.logit_std = absl::GetFlag(FLAGS_logit_std);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.json_path = absl::GetFlag(FLAGS_json);
  o.commit = absl::GetFlag(FLAGS_commit);
  o.date = UtcNow();
  if (const std::string controls = absl::GetFlag(FLAGS_controls); !controls.empty()) {
    return bench::RunShardedControlledBench(o, devices, controls);
  }
  return bench::RunShardedBench(o, devices);
}
#endif

}  // namespace
}  // namespace flashsampler::kernels
#endif

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "cpu") return flashsampler::kernels::RunCpu();
  if (backend == "cuda") {
#if FLASHSAMPLER_HAVE_CUDA
    return flashsampler::kernels::RunCuda();
#endif
    std::cerr << "flashsampler-kernel-bench: --backend=cuda: this binary was not built with "
                 "CUDA (configure with -DFLASHSAMPLER_CUDA=ON on a machine with nvcc)\n";
    return 2;
  }
  if (backend == "cuda_sharded") {
#if FLASHSAMPLER_HAVE_NCCL
    return flashsampler::kernels::RunCudaSharded();
#endif
    std::cerr << "flashsampler-kernel-bench: --backend=cuda_sharded: this binary was not built "
                 "with NCCL (FLASHSAMPLER_NCCL)\n";
    return 2;
  }
  std::cerr << "flashsampler-kernel-bench: unknown --backend=" << backend
            << " (cpu, cuda or cuda_sharded)\n";
  return 2;
}
