// flashsampler-widen-bench: how long LaunchWidenHiddenStates takes to bring a
// decode step's hidden states (rows x D bf16) into the fp32 the samplers read,
// from each place a request's rows can be:
//   device  - GPU memory (a CUDA IPC region, an upload already done);
//   mapped  - host memory mapped into the device (a shared-memory region read
//             in place, server/regions): every load crosses the bus;
// each from a 16-byte-aligned source (the vector kernel) and from one an
// element off (the element kernel); next to the physical anchor for the
// mapped rows, a cudaMemcpyAsync of the same bytes from pinned memory (the
// copy engine at the bus's speed).
//
//   flashsampler-widen-bench [--rows=16,64,256] [--hidden=4096] [--iterations=200]
//
// Prints one line per (rows, case): microseconds per call (CUDA events over
// the iterations, after a warm-up) and the source bytes per second. A widening
// call includes the launcher's reset of the first-bad index (an 8-byte memset,
// FirstBadReset::kByLauncher), which the CUDA engine's form
// (LaunchWidenHiddenStatesToHost) does without. A
// program, not a test: nothing here is asserted.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/cuda/hidden_states.h"

ABSL_FLAG(std::string, rows, "16,64,256", "rows per step, comma-separated");
ABSL_FLAG(int64_t, hidden, 4096, "hidden size D");
ABSL_FLAG(int32_t, iterations, 200, "timed calls per case");

namespace {

using flashsampler::kernels::CudaWeightDType;
using flashsampler::kernels::KernelStatus;

#define WB_CHECK(expr)                                                                   \
  do {                                                                                   \
    const cudaError_t err_ = (expr);                                                     \
    if (err_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(err_));                 \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

// Mean microseconds of `iterations` calls of `step` on `stream` (after 10
// untimed ones), or a negative value when a call fails.
template <class Step>
double TimeCalls(cudaStream_t stream, int iterations, Step step) {
  for (int i = 0; i < 10; ++i) {
    if (!step()) return -1.0;
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream);
  for (int i = 0; i < iterations; ++i) {
    if (!step()) return -1.0;
  }
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 1000.0 * ms / iterations;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int64_t> row_counts;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_rows), ',')) {
    int64_t r = 0;
    if (!absl::SimpleAtoi(part, &r) || r < 1) {
      std::fprintf(stderr, "--rows: bad value '%s'\n", std::string(part).c_str());
      return 2;
    }
    row_counts.push_back(r);
  }
  const int64_t d = absl::GetFlag(FLAGS_hidden);
  const int iterations = absl::GetFlag(FLAGS_iterations);
  int64_t max_rows = 0;
  for (int64_t r : row_counts) max_rows = r > max_rows ? r : max_rows;
  // One element (2 bytes) of slack for the misaligned sources.
  const size_t max_bytes = static_cast<size_t>(max_rows * d) * 2 + 16;

  cudaStream_t stream;
  WB_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* device_src = nullptr;
  float* dst = nullptr;
  unsigned long long* first_bad = nullptr;
  void* copy_dst = nullptr;
  WB_CHECK(cudaMalloc(&device_src, max_bytes));
  WB_CHECK(cudaMalloc(reinterpret_cast<void**>(&dst), static_cast<size_t>(max_rows * d) * sizeof(float)));
  WB_CHECK(cudaMalloc(reinterpret_cast<void**>(&first_bad), sizeof(unsigned long long)));
  WB_CHECK(cudaMalloc(&copy_dst, max_bytes));
  // Host rows as a shared-memory region is mapped: page-aligned, registered
  // read-only and mapped (MapForDeviceReads' flags).
  const size_t page = 4096;
  const size_t host_bytes = (max_bytes + page - 1) / page * page;
  void* host = std::aligned_alloc(page, host_bytes);
  if (host == nullptr) return 1;
  // bf16 1.0 everywhere: finite, so no atomics.
  for (size_t i = 0; i + 1 < host_bytes; i += 2) {
    const uint16_t one = 0x3f80;
    std::memcpy(static_cast<char*>(host) + i, &one, 2);
  }
  WB_CHECK(cudaHostRegister(host, host_bytes,
                            cudaHostRegisterPortable | cudaHostRegisterMapped | cudaHostRegisterReadOnly));
  void* mapped = nullptr;
  WB_CHECK(cudaHostGetDevicePointer(&mapped, host, 0));
  WB_CHECK(cudaMemcpy(device_src, host, max_bytes, cudaMemcpyHostToDevice));

  std::printf("%6s %-28s %10s %10s\n", "rows", "case", "us/call", "GB/s");
  for (int64_t rows : row_counts) {
    const int64_t count = rows * d;
    const size_t bytes = static_cast<size_t>(count) * 2;
    const auto widen = [&](const void* src) {
      return [=] {
        return flashsampler::kernels::LaunchWidenHiddenStates(src, CudaWeightDType::kBFloat16, count,
                                                              CudaWeightDType::kBFloat16, dst, first_bad,
                                                              stream) == KernelStatus::kOk;
      };
    };
    struct Case {
      const char* name;
      std::function<bool()> step;
    };
    const Case cases[] = {
        {"device, aligned (vectors)", widen(device_src)},
        {"device, misaligned (elements)", widen(static_cast<char*>(device_src) + 2)},
        {"mapped, aligned (vectors)", widen(mapped)},
        {"mapped, misaligned (elements)", widen(static_cast<char*>(mapped) + 2)},
        {"pinned memcpy H2D (anchor)",
         [&] { return cudaMemcpyAsync(copy_dst, host, bytes, cudaMemcpyHostToDevice, stream) == cudaSuccess; }},
    };
    for (const Case& c : cases) {
      const double us = TimeCalls(stream, iterations, c.step);
      if (us < 0) {
        std::fprintf(stderr, "%s failed\n", c.name);
        return 1;
      }
      std::printf("%6lld %-28s %10.2f %10.1f\n", static_cast<long long>(rows), c.name, us,
                  static_cast<double>(bytes) / (us * 1e3));
    }
  }
  cudaHostUnregister(host);
  std::free(host);
  cudaFree(device_src);
  cudaFree(dst);
  cudaFree(first_bad);
  cudaFree(copy_dst);
  cudaStreamDestroy(stream);
  return 0;
}
