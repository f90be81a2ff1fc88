// flashsampler-kernel-bench --backend=cuda: the fused sampler against cuBLAS and
// the materialized baseline on one GPU.
//
// Ceilings, measured first on the device at hand:
//   copy bandwidth  a device-to-device cudaMemcpyAsync of --copy_mib MiB,
//                   counted as (bytes read + bytes written) / time = 2 * size / t.
//   matmul rate     an 8192 x 8192 x 8192 bf16 cublasGemmEx (fp32 accumulation,
//                   bf16 output), 2 * 8192^3 / t.
// Floor of a (D, V, B) row: floor_ms = W bytes / copy bandwidth (W = V * D * 2
// bytes of bf16 read once; H, the outputs and the logits are not counted), the
// figure "% of floor" = floor_ms / median_ms. flop_ms = 2 * B * V * D / matmul
// rate is printed beside it: where it exceeds floor_ms the problem is no longer
// bound by reading W.
//
// Variants, per (shape, batch), all on one stream:
//   fused         LaunchFusedSample, bf16 W, fp32 H, tokens only (stage 1 + 2).
//   gemm          cublasGemmEx bf16 H x bf16 W^T -> fp32 logits [B, V], fp32
//                 compute, CUBLAS_GEMM_DEFAULT: the call LaunchMaterializedSample
//                 makes (H already in bf16, so the cast is not timed).
//   materialized  LaunchMaterializedSample, tokens only: cast H to bf16, the gemm
//                 above, the Gumbel-max kernel over the logits, the merge.
// Inputs: W ~ N(0, logit_std^2 / D) in bf16 and H ~ N(0, 1) rounded to bf16
// (held as fp32 for the fused kernel), drawn on the device. Temperature
// --temperature for every row; each call gets fresh RowParams (offset = call
// number, stream = row), uploaded before timing.
// Timing: each variant is warmed up, then the variants run round-robin
// (round i runs fused, gemm, materialized once each), every run between its
// own pair of CUDA events, all enqueued without host synchronization; the
// median and minimum of the --iterations runs are reported. When W is small
// enough to stay in L2, the runs rotate among ceil(3 * L2 / W bytes) copies of
// W (at most 64), so no run finds its W in L2; the LM heads of interest
// (> 1 GB against 50 MB of L2 on an H100) use one copy.
// Check, before timing: fused and materialized run once on the same params
// with logz and logprobs, outputs poisoned first; every token must be in
// range, and the table shows how many rows' tokens agree and the largest
// |logz difference| (H is exact in bf16, so the two see the same inputs;
// tokens may differ only at near-ties of the two best scores).
#include "kernels/bench/cuda_bench.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/common/kernel_status.h"
#include "kernels/common/row_params.h"
#include "kernels/cuda/fused_sample.h"
#include "kernels/cuda/materialized_sample.h"
#include "nlohmann/json.hpp"

namespace flashsampler::kernels::bench {
// The helpers declared in cuda_bench.h (shared with sharded_bench.cu).

bool Ok(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::cerr << "flashsampler-kernel-bench: " << what << ": " << cudaGetErrorString(err) << "\n";
  return false;
}

bool Ok(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return true;
  std::cerr << "flashsampler-kernel-bench: " << what << ": cuBLAS status " << static_cast<int>(s)
            << "\n";
  return false;
}

bool Ok(KernelStatus s, const char* what) {
  if (s == KernelStatus::kOk) return true;
  std::cerr << "flashsampler-kernel-bench: " << what << ": KernelStatus "
            << static_cast<int>(s) << "\n";
  return false;
}

#define BENCH_CHECK(expr)              \
  do {                                 \
    if (!Ok((expr), #expr)) return 1;  \
  } while (0)

Stats Summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  if (n == 0) return {};
  const double median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return Stats{median, ms.front()};
}

// Times `runs` calls of fn between event pairs, all enqueued, after `warmup`.
int TimeRepeated(cudaStream_t stream, int warmup, int runs, const std::function<int()>& fn,
                 Stats* out) {
  for (int i = 0; i < warmup; ++i) {
    if (fn() != 0) return 1;
  }
  std::vector<cudaEvent_t> ev(2 * runs);
  for (cudaEvent_t& e : ev) BENCH_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < runs; ++i) {
    BENCH_CHECK(cudaEventRecord(ev[2 * i], stream));
    if (fn() != 0) return 1;
    BENCH_CHECK(cudaEventRecord(ev[2 * i + 1], stream));
  }
  BENCH_CHECK(cudaStreamSynchronize(stream));
  BENCH_CHECK(cudaGetLastError());
  std::vector<double> ms(runs);
  for (int i = 0; i < runs; ++i) {
    float t = 0.0f;
    BENCH_CHECK(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]));
    ms[i] = t;
  }
  for (cudaEvent_t e : ev) cudaEventDestroy(e);
  *out = Summarize(std::move(ms));
  return 0;
}

namespace {

// The copy-bandwidth ceiling: (bytes read + bytes written) per second.
int MeasureCopyBandwidth(size_t bytes, cudaStream_t stream, double* bytes_per_s, Stats* stats) {
  DeviceBuffer src, dst;
  if (!src.Allocate(bytes, "copy source") || !dst.Allocate(bytes, "copy destination")) return 1;
  BENCH_CHECK(cudaMemsetAsync(src.get(), 0x5A, bytes, stream));  // never time on zeros
  BENCH_CHECK(cudaMemsetAsync(dst.get(), 0x33, bytes, stream));
  if (TimeRepeated(stream, 3, 30,
                   [&] {
                     return Ok(cudaMemcpyAsync(dst.get(), src.get(), bytes,
                                               cudaMemcpyDeviceToDevice, stream),
                               "cudaMemcpyAsync")
                                ? 0
                                : 1;
                   },
                   stats) != 0) {
    return 1;
  }
  *bytes_per_s = 2.0 * static_cast<double>(bytes) / (stats->median_ms * 1e-3);
  return 0;
}

// The matmul ceiling: a large bf16 GEMM on random data, FLOP per second.
int MeasureMatmulRate(cublasHandle_t cublas, cudaStream_t stream, double* flop_per_s,
                      Stats* stats) {
  constexpr int n = 8192;
  const size_t elems = size_t{n} * n;
  DeviceBuffer a, b, c;
  if (!a.Allocate(elems * 2, "gemm A") || !b.Allocate(elems * 2, "gemm B") ||
      !c.Allocate(elems * 2, "gemm C")) {
    return 1;
  }
  if (FillNormalBf16(a.get(), elems, 1.0f, 101, stream) != 0 ||
      FillNormalBf16(b.get(), elems, 1.0f, 102, stream) != 0) {
    std::cerr << "flashsampler-kernel-bench: fill kernel failed\n";
    return 1;
  }
  const float alpha = 1.0f, beta = 0.0f;
  if (TimeRepeated(stream, 3, 20,
                   [&] {
                     return Ok(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha,
                                            a.get(), CUDA_R_16BF, n, b.get(), CUDA_R_16BF, n,
                                            &beta, c.get(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT),
                               "cublasGemmEx 8192^3")
                                ? 0
                                : 1;
                   },
                   stats) != 0) {
    return 1;
  }
  *flop_per_s = 2.0 * n * double{n} * n / (stats->median_ms * 1e-3);
  return 0;
}

struct Row {
  CudaShape shape;
  int64_t batch = 0;
  int w_copies = 1;
  double floor_ms = 0.0;
  double flop_ms = 0.0;
  Stats fused, gemm, materialized;
  int64_t tokens_agree = 0;
  double max_logz_diff = 0.0;
};

constexpr int kVariants = 3;  // fused, gemm, materialized

class ShapeBench {
 public:
  ShapeBench(const CudaBenchOptions& o, CudaShape shape, cudaStream_t stream,
             cublasHandle_t cublas, size_t l2_bytes)
      : o_(o), shape_(shape), stream_(stream), cublas_(cublas), l2_bytes_(l2_bytes) {}

  int Setup() {
    const int64_t d = shape_.hidden, v = shape_.vocab;
    max_batch_ = *std::max_element(o_.batches.begin(), o_.batches.end());
    w_bytes_ = static_cast<size_t>(v) * static_cast<size_t>(d) * 2;
    const size_t want = (3 * l2_bytes_ + w_bytes_ - 1) / w_bytes_;
    copies_ = static_cast<int>(std::clamp<size_t>(want, 1, 64));
    weights_.resize(copies_);
    const float w_scale = o_.logit_std / std::sqrt(static_cast<float>(d));
    for (int c = 0; c < copies_; ++c) {
      if (!weights_[c].Allocate(w_bytes_, "W")) return 1;
      if (FillNormalBf16(weights_[c].get(), w_bytes_ / 2, w_scale, o_.seed * 1000 + 7 + c,
                         stream_) != 0) {
        std::cerr << "flashsampler-kernel-bench: fill W failed\n";
        return 1;
      }
    }
    const size_t h_elems = static_cast<size_t>(max_batch_ * d);
    if (!hidden_.Allocate(h_elems * 4, "H fp32") || !hidden_bf16_.Allocate(h_elems * 2, "H bf16"))
      return 1;
    if (FillNormalFloatBf16Exact(hidden_.get<float>(), h_elems, 1.0f, o_.seed * 1000 + 3,
                                 stream_) != 0 ||
        CastFloatToBf16(hidden_.get<float>(), hidden_bf16_.get(), h_elems, stream_) != 0) {
      std::cerr << "flashsampler-kernel-bench: fill H failed\n";
      return 1;
    }
    // Calls per variant: 1 check + warmup + iterations; call k uses params row k.
    calls_ = 1 + o_.warmup + o_.iterations;
    std::vector<RowParams> params(static_cast<size_t>(calls_ * max_batch_));
    for (int k = 0; k < calls_; ++k) {
      for (int64_t b = 0; b < max_batch_; ++b) {
        params[k * max_batch_ + b] =
            RowParams{o_.temperature, o_.seed, static_cast<uint64_t>(k + 1),
                      static_cast<uint32_t>(b)};
      }
    }
    if (!params_.Allocate(params.size() * sizeof(RowParams), "params")) return 1;
    BENCH_CHECK(cudaMemcpy(params_.get(), params.data(), params.size() * sizeof(RowParams),
                           cudaMemcpyHostToDevice));
    if (!tokens_.Allocate(max_batch_ * 4 * 2, "tokens") ||
        !logz_.Allocate(max_batch_ * 4 * 2, "logz") ||
        !logprobs_.Allocate(max_batch_ * 4 * 2, "logprobs") ||
        !fused_ws_.Allocate(FusedSampleWorkspaceBytes(max_batch_, v, d), "fused workspace") ||
        !mat_ws_.Allocate(
            MaterializedSampleWorkspaceBytes(max_batch_, v, d, CudaWeightDType::kBFloat16),
            "materialized workspace") ||
        !gemm_logits_.Allocate(static_cast<size_t>(max_batch_ * v) * 4, "gemm logits")) {
      return 1;
    }
    BENCH_CHECK(cudaStreamSynchronize(stream_));
    BENCH_CHECK(cudaGetLastError());
    return 0;
  }

  // Rows of the outputs: fused writes [0, B), materialized [B, 2B).
  FusedSampleArgs Args(int64_t batch, int copy, int call, bool second_half, bool lse) const {
    FusedSampleArgs a;
    a.weight = weights_[copy].get();
    a.weight_dtype = CudaWeightDType::kBFloat16;
    a.hidden = hidden_.get<float>();
    a.params = params_.get<RowParams>() + static_cast<size_t>(call) * max_batch_;
    a.batch = batch;
    a.vocab = shape_.vocab;
    a.valid_vocab = shape_.vocab;
    a.hidden_dim = shape_.hidden;
    const int64_t off = second_half ? max_batch_ : 0;
    a.token_ids = tokens_.get<int32_t>() + off;
    a.logz = lse ? logz_.get<float>() + off : nullptr;
    a.logprobs = lse ? logprobs_.get<float>() + off : nullptr;
    return a;
  }

  int RunFused(int64_t batch, int copy, int call, bool lse) {
    FusedSampleArgs a = Args(batch, copy, call, false, lse);
    a.workspace = fused_ws_.get();
    a.workspace_bytes = fused_ws_.bytes();
    a.stage1 = o_.stage1;
    return Ok(LaunchFusedSample(a, stream_), "LaunchFusedSample") ? 0 : 1;
  }

  int RunMaterialized(int64_t batch, int copy, int call, bool lse) {
    FusedSampleArgs a = Args(batch, copy, call, true, lse);
    a.workspace = mat_ws_.get();
    a.workspace_bytes = mat_ws_.bytes();
    return Ok(LaunchMaterializedSample(a, cublas_, stream_), "LaunchMaterializedSample") ? 0 : 1;
  }

  int RunGemm(int64_t batch, int copy) {
    const float alpha = 1.0f, beta = 0.0f;
    const int m = static_cast<int>(shape_.vocab), n = static_cast<int>(batch),
              k = static_cast<int>(shape_.hidden);
    if (!Ok(cublasSetStream(cublas_, stream_), "cublasSetStream")) return 1;
    return Ok(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha,
                           weights_[copy].get(), CUDA_R_16BF, k, hidden_bf16_.get(), CUDA_R_16BF,
                           k, &beta, gemm_logits_.get(), CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx")
               ? 0
               : 1;
  }

  int Check(int64_t batch, Row* row) {
    BENCH_CHECK(cudaMemsetAsync(tokens_.get(), 0x80, tokens_.bytes(), stream_));
    BENCH_CHECK(cudaMemsetAsync(logz_.get(), 0xFF, logz_.bytes(), stream_));  // NaN
    if (RunFused(batch, 0, 0, true) != 0 || RunMaterialized(batch, 0, 0, true) != 0) return 1;
    BENCH_CHECK(cudaStreamSynchronize(stream_));
    BENCH_CHECK(cudaGetLastError());
    std::vector<int32_t> tokens(2 * max_batch_);
    std::vector<float> logz(2 * max_batch_);
    BENCH_CHECK(cudaMemcpy(tokens.data(), tokens_.get(), tokens.size() * 4,
                           cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(logz.data(), logz_.get(), logz.size() * 4, cudaMemcpyDeviceToHost));
    row->tokens_agree = 0;
    row->max_logz_diff = 0.0;
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t tf = tokens[b], tm = tokens[max_batch_ + b];
      const float lf = logz[b], lm = logz[max_batch_ + b];
      if (tf < 0 || tf >= shape_.vocab || tm < 0 || tm >= shape_.vocab || !std::isfinite(lf) ||
          !std::isfinite(lm)) {
        std::cerr << "flashsampler-kernel-bench: check failed at D=" << shape_.hidden
                  << " V=" << shape_.vocab << " B=" << batch << " row " << b << ": tokens " << tf
                  << " / " << tm << ", logz " << lf << " / " << lm << "\n";
        return 1;
      }
      row->tokens_agree += tf == tm;
      row->max_logz_diff = std::max(row->max_logz_diff, std::fabs(double{lf} - double{lm}));
    }
    return 0;
  }

  int Measure(int64_t batch, Row* row) {
    row->shape = shape_;
    row->batch = batch;
    row->w_copies = copies_;
    if (Check(batch, row) != 0) return 1;
    const int runs = o_.iterations;
    std::vector<cudaEvent_t> ev(2 * kVariants * runs);
    for (cudaEvent_t& e : ev) BENCH_CHECK(cudaEventCreate(&e));
    int copy = 0;
    auto run_variant = [&](int variant, int call) {
      copy = (copy + 1) % copies_;
      switch (variant) {
        case 0: return RunFused(batch, copy, call, false);
        case 1: return RunGemm(batch, copy);
        default: return RunMaterialized(batch, copy, call, false);
      }
    };
    for (int variant = 0; variant < kVariants; ++variant) {
      for (int i = 0; i < o_.warmup; ++i) {
        if (run_variant(variant, 1 + i) != 0) return 1;
      }
    }
    for (int i = 0; i < runs; ++i) {
      for (int variant = 0; variant < kVariants; ++variant) {
        const size_t e = 2 * (static_cast<size_t>(variant) * runs + i);
        BENCH_CHECK(cudaEventRecord(ev[e], stream_));
        if (run_variant(variant, 1 + o_.warmup + i) != 0) return 1;
        BENCH_CHECK(cudaEventRecord(ev[e + 1], stream_));
      }
    }
    BENCH_CHECK(cudaStreamSynchronize(stream_));
    BENCH_CHECK(cudaGetLastError());
    Stats* stats[kVariants] = {&row->fused, &row->gemm, &row->materialized};
    for (int variant = 0; variant < kVariants; ++variant) {
      std::vector<double> ms(runs);
      for (int i = 0; i < runs; ++i) {
        const size_t e = 2 * (static_cast<size_t>(variant) * runs + i);
        float t = 0.0f;
        BENCH_CHECK(cudaEventElapsedTime(&t, ev[e], ev[e + 1]));
        ms[i] = t;
      }
      *stats[variant] = Summarize(std::move(ms));
    }
    for (cudaEvent_t e : ev) cudaEventDestroy(e);
    return 0;
  }

  size_t w_bytes() const { return w_bytes_; }
  int copies() const { return copies_; }

 private:
  const CudaBenchOptions& o_;
  CudaShape shape_;
  cudaStream_t stream_;
  cublasHandle_t cublas_;
  size_t l2_bytes_;
  int64_t max_batch_ = 0;
  size_t w_bytes_ = 0;
  int copies_ = 1;
  int calls_ = 0;
  std::vector<DeviceBuffer> weights_;
  DeviceBuffer hidden_, hidden_bf16_, params_, tokens_, logz_, logprobs_, fused_ws_, mat_ws_,
      gemm_logits_;
};

}  // namespace

nlohmann::json StatsJson(const Stats& s) {
  return {{"median_ms", s.median_ms}, {"min_ms", s.min_ms}};
}

const char* Stage1Name(Stage1Kernel k) {
  switch (k) {
    case Stage1Kernel::kAuto: return "auto";
    case Stage1Kernel::kMmaSync: return "mma_sync";
    case Stage1Kernel::kWgmma: return "wgmma";
    case Stage1Kernel::kWgmmaOverlap: return "wgmma_overlap";
    case Stage1Kernel::kWgmmaPingpong: return "wgmma_pingpong";
    case Stage1Kernel::kCudaCore: return "cuda_core";
    case Stage1Kernel::kWgmmaSeparateEpilogue: return "wgmma_separate_epilogue";
  }
  return "unknown";
}

nlohmann::json BenchJsonHeader(const CudaBenchOptions& o, const std::string& backend,
                               const std::string& device) {
  return {{"backend", backend},         {"device", device},
          {"date", o.date},             {"commit", o.commit},
          {"temperature", o.temperature}, {"logit_std", o.logit_std},
          {"iterations", o.iterations}, {"stage1", Stage1Name(o.stage1)}};
}

int WriteBenchJson(const nlohmann::json& j, const std::string& path) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) {
    std::cerr << "flashsampler-kernel-bench: cannot write " << path << "\n";
    return 1;
  }
  return 0;
}

int RunCudaBench(const CudaBenchOptions& o) {
  if (o.shapes.empty() || o.batches.empty() || o.iterations < 100 || o.warmup < 1 ||
      !(o.temperature >= 0.0f) || o.copy_bytes < (size_t{1} << 20)) {
    std::cerr << "flashsampler-kernel-bench: --backend=cuda needs shapes, batches, "
                 "iterations >= 100, warmup >= 1, temperature >= 0, copy_mib >= 1\n";
    return 2;
  }
  for (const CudaShape& s : o.shapes) {
    if (s.hidden < 1 || s.vocab < 1 || s.hidden % 8 != 0) {
      std::cerr << "flashsampler-kernel-bench: bad shape D=" << s.hidden << " V=" << s.vocab
                << " (D must be a multiple of 8)\n";
      return 2;
    }
  }
  for (int64_t b : o.batches) {
    if (b < 1 || b > 65536) {
      std::cerr << "flashsampler-kernel-bench: bad batch " << b << "\n";
      return 2;
    }
  }

  int device = 0;
  BENCH_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, device));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  const std::string& date = o.date;
  const size_t l2_bytes = static_cast<size_t>(prop.l2CacheSize);

  cudaStream_t stream = nullptr;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t cublas = nullptr;
  BENCH_CHECK(cublasCreate(&cublas));
  BENCH_CHECK(cublasSetStream(cublas, stream));

  std::fprintf(stderr, "%s (%d SMs, L2 %zu MB): measuring copy bandwidth and matmul rate\n",
               prop.name, prop.multiProcessorCount, l2_bytes >> 20);
  double copy_bw = 0.0, mm_rate = 0.0;
  Stats copy_stats, mm_stats;
  if (MeasureCopyBandwidth(o.copy_bytes, stream, &copy_bw, &copy_stats) != 0) return 1;
  if (MeasureMatmulRate(cublas, stream, &mm_rate, &mm_stats) != 0) return 1;

  std::vector<Row> rows;
  std::vector<int64_t> batches = o.batches;
  for (const CudaShape& shape : o.shapes) {
    ShapeBench bench(o, shape, stream, cublas, l2_bytes);
    if (bench.Setup() != 0) return 1;
    for (int64_t batch : batches) {
      Row row;
      if (bench.Measure(batch, &row) != 0) return 1;
      row.floor_ms = static_cast<double>(bench.w_bytes()) / copy_bw * 1e3;
      row.flop_ms = 2.0 * batch * static_cast<double>(shape.vocab) * shape.hidden / mm_rate * 1e3;
      std::fprintf(stderr, "  D=%lld V=%lld B=%lld: fused %.3f gemm %.3f materialized %.3f ms\n",
                   static_cast<long long>(shape.hidden), static_cast<long long>(shape.vocab),
                   static_cast<long long>(batch), row.fused.median_ms, row.gemm.median_ms,
                   row.materialized.median_ms);
      rows.push_back(row);
    }
  }
  cublasDestroy(cublas);
  cudaStreamDestroy(stream);

  std::printf("flashsampler-kernel-bench backend=cuda  %s  %s  commit %s\n", prop.name,
              date.c_str(), o.commit.c_str());
  std::printf("SMs=%d L2=%zu MB driver=%d runtime=%d  T=%g logit_std=%g iterations=%d "
              "warmup=%d stage1=%s (median of iterations; CUDA events)\n",
              prop.multiProcessorCount, l2_bytes >> 20, driver, runtime, o.temperature,
              o.logit_std, o.iterations, o.warmup, Stage1Name(o.stage1));
  std::printf("copy bandwidth %.3f TB/s = (read + write) bytes / time of a %zu MiB D2D copy "
              "(median %.3f ms)\n",
              copy_bw * 1e-12, o.copy_bytes >> 20, copy_stats.median_ms);
  std::printf("matmul rate %.1f TFLOP/s (8192^3 bf16 cublasGemmEx, median %.3f ms)\n",
              mm_rate * 1e-12, mm_stats.median_ms);
  std::printf("floor_ms = bf16 W bytes / copy bandwidth (read W once); %%floor = floor_ms / "
              "median_ms; flop_ms = 2*B*V*D / matmul rate\n");
  std::printf("%-12s %4s %6s %8s %9s %9s %9s %7s %7s %7s %8s %9s %7s %9s\n", "DxV", "B", "Wcopy",
              "floor_ms", "fused_ms", "gemm_ms", "mat_ms", "fus%fl", "gem%fl", "mat%fl",
              "fus/gemm", "mat/fused", "flop_ms", "agree");
  for (const Row& r : rows) {
    char shape[32], agree[32];
    std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(r.shape.hidden),
                  static_cast<long long>(r.shape.vocab));
    std::snprintf(agree, sizeof agree, "%lld/%lld", static_cast<long long>(r.tokens_agree),
                  static_cast<long long>(r.batch));
    std::printf("%-12s %4lld %6d %8.3f %9.3f %9.3f %9.3f %6.1f%% %6.1f%% %6.1f%% %8.2f %9.2f "
                "%7.3f %9s\n",
                shape, static_cast<long long>(r.batch), r.w_copies, r.floor_ms,
                r.fused.median_ms, r.gemm.median_ms, r.materialized.median_ms,
                100.0 * r.floor_ms / r.fused.median_ms, 100.0 * r.floor_ms / r.gemm.median_ms,
                100.0 * r.floor_ms / r.materialized.median_ms,
                r.fused.median_ms / r.gemm.median_ms,
                r.materialized.median_ms / r.fused.median_ms, r.flop_ms, agree);
  }
  double worst_logz = 0.0;
  for (const Row& r : rows) worst_logz = std::max(worst_logz, r.max_logz_diff);
  std::printf("check: agree = rows whose fused and materialized tokens match on the check "
              "call; max |logz fused - logz materialized| = %.3g\n",
              worst_logz);

  if (!o.json_path.empty()) {
    nlohmann::json j;
    j["backend"] = "cuda";
    j["device"] = prop.name;
    j["sm_count"] = prop.multiProcessorCount;
    j["l2_bytes"] = l2_bytes;
    j["driver_version"] = driver;
    j["runtime_version"] = runtime;
    j["date"] = date;
    j["commit"] = o.commit;
    j["temperature"] = o.temperature;
    j["logit_std"] = o.logit_std;
    j["iterations"] = o.iterations;
    j["warmup"] = o.warmup;
    j["weight_dtype"] = "bf16";
    j["copy_bandwidth"] = {
        {"bytes_per_s", copy_bw},
        {"counted_as", "(bytes read + bytes written) / time of a device-to-device cudaMemcpy"},
        {"buffer_bytes", o.copy_bytes},
        {"median_ms", copy_stats.median_ms},
        {"min_ms", copy_stats.min_ms}};
    j["matmul_rate"] = {{"flop_per_s", mm_rate},
                        {"what", "8192^3 bf16 cublasGemmEx, fp32 compute, bf16 output"},
                        {"median_ms", mm_stats.median_ms},
                        {"min_ms", mm_stats.min_ms}};
    j["floor"] = "W bytes (V * D * 2) / copy bandwidth";
    for (const CudaShape& s : o.shapes) {
      j["shapes"].push_back({{"hidden", s.hidden}, {"vocab", s.vocab}});
    }
    j["batches"] = o.batches;
    for (const Row& r : rows) {
      j["results"].push_back({{"hidden", r.shape.hidden},
                              {"vocab", r.shape.vocab},
                              {"batch", r.batch},
                              {"w_copies", r.w_copies},
                              {"floor_ms", r.floor_ms},
                              {"flop_ms", r.flop_ms},
                              {"fused", StatsJson(r.fused)},
                              {"gemm", StatsJson(r.gemm)},
                              {"materialized", StatsJson(r.materialized)},
                              {"fused_over_gemm", r.fused.median_ms / r.gemm.median_ms},
                              {"materialized_over_fused",
                               r.materialized.median_ms / r.fused.median_ms},
                              {"tokens_agree", r.tokens_agree},
                              {"max_logz_diff", r.max_logz_diff}});
    }
    return WriteBenchJson(j, o.json_path);
  }
  return 0;
}

}  // namespace flashsampler::kernels::bench
