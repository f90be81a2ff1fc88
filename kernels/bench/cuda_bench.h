// The CUDA mode of flashsampler-kernel-bench (--backend=cuda), built only when
// the CUDA backend is (FLASHSAMPLER_HAVE_CUDA). What it measures: cuda_bench.cc.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/common/kernel_status.h"
#include "kernels/cuda/fused_sample.h"
#include "kernels/common/row_controls.h"
#include "nlohmann/json.hpp"

namespace flashsampler::kernels::bench {

struct CudaShape {
  int64_t hidden = 0;  // D
  int64_t vocab = 0;   // V
};

struct CudaBenchOptions {
  std::vector<CudaShape> shapes;
  std::vector<int64_t> batches;
  int iterations = 100;  // timed runs per variant and (shape, batch), >= 100
  int warmup = 5;        // untimed runs per variant before timing
  float temperature = 1.0f;
  float logit_std = 2.0f;  // W ~ N(0, logit_std^2 / D), H ~ N(0, 1)
  uint64_t seed = 1;
  size_t copy_bytes = size_t{2} << 30;  // buffer of the device-to-device copy
  std::string json_path;
  std::string commit;
  std::string date;  // UTC timestamp recorded in the table and the JSON
  // The fused variants' stage-1 kernel (--stage1: auto, mma_sync, wgmma,
  // wgmma_overlap, wgmma_pingpong, cuda_core), so one binary measures each.
  Stage1Kernel stage1 = Stage1Kernel::kAuto;
};

// The --stage1 value that names k ("auto", "mma_sync", ...); never null.
const char* Stage1Name(Stage1Kernel k);

// Runs the sweep, prints the table, writes JSON when json_path is set.
// Returns the process exit code (0 ok, 1 device or I/O error, 2 bad options).
int RunCudaBench(const CudaBenchOptions& options);

// The materialized controlled path (cuda_controlled_bench.cc) for the control
// sets named in `which` ("all" or a comma list of top_p, top_k, top_k_top_p,
// min_p, bitmask). Same exit codes.
int RunCudaControlledBench(const CudaBenchOptions& options, const std::string& which);

// One control set of the controlled modes: every row of a batch gets `controls`.
struct ControlSet {
  std::string name;
  RowControls controls;
};

// The sets named in `which` ("all" or a comma list; unknown names are
// skipped, so an empty result means a bad list), for a head of `vocab`
// tokens (bitmask biases 16 tokens spread over it). What each holds:
// cuda_controlled_bench.cc.
std::vector<ControlSet> ControlSets(const std::string& which, int64_t vocab);
// ---- Timing and error helpers (cuda_bench.cc), shared by the CUDA modes ----------
// True on success; otherwise prints "flashsampler-kernel-bench: what: error".
bool Ok(cudaError_t err, const char* what);
bool Ok(cublasStatus_t s, const char* what);
bool Ok(KernelStatus s, const char* what);

// Device memory freed on scope exit, on the device it was allocated on (the
// current device at Allocate; the sharded modes hold buffers on several).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(other.ptr_), bytes_(other.bytes_), device_(other.device_) {
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  ~DeviceBuffer() { Reset(); }
  // Frees what it held, then cudaMalloc(max(bytes, 256)); false (printed
  // with `what`) on failure.
  bool Allocate(size_t bytes, const char* what = "cudaMalloc") {
    Reset();
    bytes_ = bytes;
    return Ok(cudaGetDevice(&device_), what) &&
           Ok(cudaMalloc(&ptr_, bytes > 256 ? bytes : 256), what);
  }
  void Reset() {
    if (ptr_ != nullptr) {
      int current = 0;
      const bool switch_device = cudaGetDevice(&current) == cudaSuccess && current != device_;
      if (switch_device) cudaSetDevice(device_);
      cudaFree(ptr_);
      if (switch_device) cudaSetDevice(current);
    }
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <class T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
};

struct Stats {
  double median_ms = 0.0;
  double min_ms = 0.0;
};

// Median and minimum of `ms` (zeros when empty).
Stats Summarize(std::vector<double> ms);

// {"median_ms": ..., "min_ms": ...}: how every CUDA mode's JSON records Stats.
nlohmann::json StatsJson(const Stats& s);

// The fields every CUDA mode's JSON opens with: backend, device (its name),
// date, commit, temperature, logit_std, iterations.
nlohmann::json BenchJsonHeader(const CudaBenchOptions& o, const std::string& backend,
                               const std::string& device);

// Writes j (2-space indent) to `path`. 0, or 1 after printing why not.
int WriteBenchJson(const nlohmann::json& j, const std::string& path);

// Runs fn `warmup` times, then `runs` times, each between its own pair of CUDA
// events recorded on `stream` (created on the current device, which must be
// the stream's), all enqueued without host synchronisation; fn returns 0 or
// an error. 0 on success, 1 on any error.
int TimeRepeated(cudaStream_t stream, int warmup, int runs, const std::function<int()>& fn,
                 Stats* out);

// ---- Device helpers (cuda_bench_init.cu) ------------------------------------------
// out[i] = bf16(scale * N_i) for i < n, N_i ~ N(0, 1) a hash of (seed, i)
// (splitmix64 + Box-Muller). out is __nv_bfloat16*, passed as void*.
int FillNormalBf16(void* out, size_t n, float scale, uint64_t seed, void* stream);
// out[i] = float(bf16(scale * N_i)): fp32 values exactly representable in bf16,
// so the fused kernel (fp32 hidden) and cuBLAS (bf16 hidden) see the same H.
int FillNormalFloatBf16Exact(float* out, size_t n, float scale, uint64_t seed, void* stream);
// out[i] = bf16(in[i]) (round to nearest even).
int CastFloatToBf16(const float* in, void* out, size_t n, void* stream);

}  // namespace flashsampler::kernels::bench
