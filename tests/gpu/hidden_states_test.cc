// LaunchWidenHiddenStates (kernels/cuda/hidden_states.h) against the host's
// conversions, bit for bit: every wire dtype into every weight dtype, over
// random bit patterns (so NaNs, infinities, subnormals and fp16-overflowing
// fp32 values all occur), fp32 values at bf16's overflow edge, and the index
// of the first bad element. Needs a
// GPU: FAILS (does not skip) without one.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/half_precision.h"
#include "kernels/cuda/hidden_states.h"

namespace flashsampler::kernels {
namespace {

size_t Bytes(CudaWeightDType d) { return d == CudaWeightDType::kFloat32 ? 4 : 2; }

// The host path: widen (Bf16ToFloat / Fp16ToFloat), refuse inf / NaN, round
// to the weights' dtype (RoundHiddenToWeightDType: nearest even; fp16
// overflow refused).
float HostWiden(const std::vector<uint8_t>& src, CudaWeightDType dtype, size_t i, bool* bad) {
  float v;
  if (dtype == CudaWeightDType::kFloat32) {
    std::memcpy(&v, src.data() + 4 * i, 4);
  } else {
    uint16_t h;
    std::memcpy(&h, src.data() + 2 * i, 2);
    v = dtype == CudaWeightDType::kBFloat16 ? Bf16ToFloat(h) : Fp16ToFloat(h);
  }
  *bad = !std::isfinite(v);
  return v;
}

float HostRound(float v, CudaWeightDType weight, bool* bad) {
  if (weight == CudaWeightDType::kFloat32) return v;
  const float r = weight == CudaWeightDType::kBFloat16 ? Bf16ToFloat(FloatToBf16(v))
                                                        : Fp16ToFloat(FloatToFp16(v));
  if (std::isinf(r)) *bad = true;  // finite, rounded past the dtype's range
  return r;
}

struct DeviceBuffers {
  void* src = nullptr;
  float* dst = nullptr;
  unsigned long long* first_bad = nullptr;
  ~DeviceBuffers() {
    cudaFree(src);
    cudaFree(dst);
    cudaFree(first_bad);
  }
};

// Widens `src` (count elements of `dtype`) on the GPU; returns dst and *first_bad.
// The source starts `src_offset` bytes into its allocation: 0 is 16-byte
// aligned (the launcher's vector kernel), one element's size is not (its
// element kernel).
std::vector<float> DeviceWiden(const std::vector<uint8_t>& src, CudaWeightDType dtype, int64_t count,
                               CudaWeightDType weight, unsigned long long* first_bad,
                               size_t src_offset = 0) {
  DeviceBuffers b;
  EXPECT_EQ(cudaMalloc(&b.src, src.size() + src_offset), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&b.dst), count * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&b.first_bad), sizeof(unsigned long long)), cudaSuccess);
  void* at = static_cast<char*>(b.src) + src_offset;
  EXPECT_EQ(cudaMemcpy(at, src.data(), src.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(LaunchWidenHiddenStates(at, dtype, count, weight, b.dst, b.first_bad, nullptr),
            KernelStatus::kOk);
  std::vector<float> out(static_cast<size_t>(count));
  EXPECT_EQ(cudaMemcpy(out.data(), b.dst, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(first_bad, b.first_bad, sizeof(*first_bad), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

const CudaWeightDType kDTypes[] = {CudaWeightDType::kFloat32, CudaWeightDType::kFloat16,
                                   CudaWeightDType::kBFloat16};

TEST(WidenHiddenStates, EqualsTheHostConversionBitForBitAndFindsTheFirstBadElement) {
  int devices = 0;
  ASSERT_TRUE(cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0)
      << "this GPU test needs a CUDA device (exclude label gpu)";
  // More elements than one pass of the grid (1024 blocks x 1024), odd-sized
  // (the vector kernel's tail); and a few elements, fewer than a vector.
  // Each from an aligned source and from one an element off (the element
  // kernel).
  std::mt19937_64 gen(11);
  struct Case {
    int64_t count;
    bool misaligned;
  };
  const Case cases[] = {{1'300'001, false}, {1'300'001, true}, {5, false}, {5, true}};
  for (const auto [count, misaligned] : cases) {
    for (CudaWeightDType dtype : kDTypes) {
      std::vector<uint8_t> src(count * Bytes(dtype));
      for (uint8_t& byte : src) byte = static_cast<uint8_t>(gen());
      // A few elements of random bits may all be finite: make the fourth NaN.
      if (count < 8) std::memset(src.data() + 3 * Bytes(dtype), 0xff, Bytes(dtype));
      for (CudaWeightDType weight : kDTypes) {
        SCOPED_TRACE(::testing::Message() << count << " elements, " << (misaligned ? "misaligned" : "aligned")
                                          << ", src dtype " << static_cast<int>(dtype) << ", weight dtype "
                                          << static_cast<int>(weight));
        unsigned long long first_bad = 0;
        const std::vector<float> got =
            DeviceWiden(src, dtype, count, weight, &first_bad, misaligned ? Bytes(dtype) : 0);
        int64_t want_first_bad = -1, compared = 0, differ = 0;
        for (int64_t i = 0; i < count; ++i) {
          bool bad = false;
          const float want = HostRound(HostWiden(src, dtype, i, &bad), weight, &bad);
          if (bad) {
            if (want_first_bad < 0) want_first_bad = i;
            continue;  // refused: the value written is never used
          }
          ++compared;
          differ += std::memcmp(&want, &got[i], sizeof(float)) != 0;
        }
        ASSERT_GE(want_first_bad, 0) << "random bits always hold a non-finite element";
        EXPECT_EQ(first_bad, static_cast<unsigned long long>(want_first_bad));
        if (count > 8) {
          EXPECT_GT(compared, count / 2);
        }
        EXPECT_EQ(differ, 0) << " of " << compared << " finite elements";
      }
    }
  }
}

TEST(WidenHiddenStates, AFiniteFp32ValueOutOfFp16RangeIsBadOnlyForFp16Weights) {
  std::vector<float> values(5000, 1.5f);
  values[4321] = 70000.0f;  // finite in fp32 and bf16; rounds to inf in fp16
  values[4999] = 65519.0f;  // the largest that still rounds to a finite fp16 (65504)
  std::vector<uint8_t> src(values.size() * 4);
  std::memcpy(src.data(), values.data(), src.size());
  unsigned long long first_bad = 0;
  DeviceWiden(src, CudaWeightDType::kFloat32, 5000, CudaWeightDType::kFloat16, &first_bad);
  EXPECT_EQ(first_bad, 4321u);
  for (CudaWeightDType weight : {CudaWeightDType::kFloat32, CudaWeightDType::kBFloat16}) {
    DeviceWiden(src, CudaWeightDType::kFloat32, 5000, weight, &first_bad);
    EXPECT_EQ(first_bad, kNoBadHiddenElement);
  }
  values[4321] = 1.0f;
  std::memcpy(src.data(), values.data(), src.size());
  DeviceWiden(src, CudaWeightDType::kFloat32, 5000, CudaWeightDType::kFloat16, &first_bad);
  EXPECT_EQ(first_bad, kNoBadHiddenElement);
}

// bf16 keeps fp32's exponent, so a finite fp32 value leaves bf16's range only
// within half a bf16 ulp of FLT_MAX: 0x1.ffp127 and above round to inf (the
// tie to even), 0x1.fefffep127 just below rounds to the largest bf16. Both
// kernels (aligned: vectors; misaligned: elements) refuse the first, as the
// host's RoundHiddenToWeightDType does.
TEST(WidenHiddenStates, AFiniteFp32ValueAtBf16sOverflowEdgeIsBadForBf16Weights) {
  std::vector<float> values(5000, 1.5f);
  values[1234] = 0x1.fefffep127f;  // rounds to 0x1.fep127, finite
  values[3210] = -0x1.ffp127f;     // rounds to -inf
  values[4000] = FLT_MAX;          // rounds to inf
  std::vector<uint8_t> src(values.size() * 4);
  std::memcpy(src.data(), values.data(), src.size());
  for (size_t offset : {size_t{0}, size_t{4}}) {
    unsigned long long first_bad = 0;
    const std::vector<float> got = DeviceWiden(src, CudaWeightDType::kFloat32, 5000,
                                               CudaWeightDType::kBFloat16, &first_bad, offset);
    EXPECT_EQ(first_bad, 3210u) << "offset " << offset;
    EXPECT_EQ(got[1234], 0x1.fep127f) << "offset " << offset;
    DeviceWiden(src, CudaWeightDType::kFloat32, 5000, CudaWeightDType::kFloat32, &first_bad, offset);
    EXPECT_EQ(first_bad, kNoBadHiddenElement) << "offset " << offset;
    DeviceWiden(src, CudaWeightDType::kFloat32, 5000, CudaWeightDType::kFloat16, &first_bad, offset);
    EXPECT_EQ(first_bad, 1234u) << "offset " << offset;  // fp16's range ends far lower
  }
}

// One bad bf16 element among finite ones, inside a vector (not its first
// element), in the tail past the last whole vector, and both: the smallest is
// reported, from an aligned source and a misaligned one.
TEST(WidenHiddenStates, TheFirstBadElementIsFoundInsideAVectorAndInTheTail) {
  const int64_t count = 100'003;  // 12 500 vectors of 8, and 3 elements
  const uint16_t one = 0x3f80, nan = 0x7fc1;
  struct Case {
    std::vector<int64_t> bad;
    unsigned long long want;
  };
  const Case cases[] = {{{77'777}, 77'777}, {{100'001}, 100'001}, {{100'002, 77'781}, 77'781}};
  for (const Case& c : cases) {
    std::vector<uint8_t> src(count * 2);
    for (int64_t i = 0; i < count; ++i) std::memcpy(src.data() + 2 * i, &one, 2);
    for (int64_t i : c.bad) std::memcpy(src.data() + 2 * i, &nan, 2);
    for (size_t offset : {size_t{0}, size_t{2}}) {
      unsigned long long first_bad = 0;
      const std::vector<float> got = DeviceWiden(src, CudaWeightDType::kBFloat16, count,
                                                 CudaWeightDType::kBFloat16, &first_bad, offset);
      EXPECT_EQ(first_bad, c.want) << "offset " << offset;
      int64_t differ = 0;
      for (int64_t i = 0; i < count; ++i) {
        const bool bad = std::find(c.bad.begin(), c.bad.end(), i) != c.bad.end();
        differ += !bad && got[i] != 1.0f;
      }
      EXPECT_EQ(differ, 0) << "offset " << offset;
    }
  }
}

// FirstBadReset::kByCaller: the launcher leaves *first_bad as the caller
// set it, and the kernel only lowers it. So a caller's kNoBadHiddenElement
// ends as the first bad index, and any other value it left is not cleared.
TEST(WidenHiddenStates, ACallersResetIsTheOnlyReset) {
  const int64_t count = 4099;
  std::vector<uint16_t> src(count, 0x3f80);
  src[2050] = 0x7f80;  // +inf
  DeviceBuffers b;
  ASSERT_EQ(cudaMalloc(&b.src, count * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&b.dst), count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&b.first_bad), sizeof(unsigned long long)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(b.src, src.data(), count * 2, cudaMemcpyHostToDevice), cudaSuccess);
  const auto widen_after = [&](unsigned long long preset) {
    EXPECT_EQ(cudaMemcpy(b.first_bad, &preset, sizeof(preset), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(LaunchWidenHiddenStates(b.src, CudaWeightDType::kBFloat16, count, CudaWeightDType::kBFloat16,
                                      b.dst, b.first_bad, nullptr, FirstBadReset::kByCaller),
              KernelStatus::kOk);
    unsigned long long got = 0;
    EXPECT_EQ(cudaMemcpy(&got, b.first_bad, sizeof(got), cudaMemcpyDeviceToHost), cudaSuccess);
    return got;
  };
  EXPECT_EQ(widen_after(kNoBadHiddenElement), 2050u);
  EXPECT_EQ(widen_after(7), 7u);
  src[2050] = 0x3f80;
  ASSERT_EQ(cudaMemcpy(b.src, src.data(), count * 2, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(widen_after(kNoBadHiddenElement), kNoBadHiddenElement);
}

// LaunchWidenHiddenStatesToHost: each launch writes its own first bad index
// (or kNoBadHiddenElement) into mapped host memory, with no reset before it
// and no copy after it, and leaves the device words as it found them, so the
// next launch starts clean. Grids of 1 to 1024 blocks (the launcher's cap),
// both kernels, bad elements in the first and last blocks,
// several per launch, and launches back to back on one stream with nothing
// in between.
TEST(WidenHiddenStates, ReportsEachLaunchsFirstBadIndexToTheHost) {
  struct Case {
    int64_t count;
    size_t offset;  // 0: the vector kernel; 2: the element kernel
    std::vector<int64_t> bad;
  };
  const std::vector<Case> cases = {
      {4099, 0, {2050}},
      {4099, 2, {4098, 5}},
      {1 << 20, 0, {}},
      {1 << 20, 0, {(1 << 20) - 1}},
      {(1 << 22) + 3, 0, {(1 << 22) + 2, 1 << 21, 3 << 20}},
      {(1 << 22) + 3, 2, {0}},
      {17, 0, {}},
      {300000, 2, {299999}},
  };
  size_t max_count = 0;
  for (const Case& c : cases) max_count = std::max(max_count, static_cast<size_t>(c.count));
  DeviceBuffers b;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&b.dst), max_count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&b.first_bad), sizeof(unsigned long long)), cudaSuccess);
  unsigned int* blocks_done = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&blocks_done), sizeof(unsigned int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(b.first_bad, 0xff, sizeof(unsigned long long)), cudaSuccess);
  ASSERT_EQ(cudaMemset(blocks_done, 0, sizeof(unsigned int)), cudaSuccess);
  unsigned long long* host = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&host), cases.size() * sizeof(unsigned long long),
                          cudaHostAllocMapped),
            cudaSuccess);
  unsigned long long* host_on_device = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_on_device), host, 0), cudaSuccess);
  for (size_t k = 0; k < cases.size(); ++k) host[k] = 12345;  // every launch must overwrite its word

  // Sources for all cases first (the copies are synchronous), then every
  // launch back to back: one source buffer per case so none is overwritten
  // while queued.
  std::vector<void*> sources(cases.size(), nullptr);
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    std::vector<uint16_t> src(static_cast<size_t>(c.count), 0x3f80);  // 1.0 in bf16
    for (int64_t i : c.bad) src[static_cast<size_t>(i)] = i % 2 == 0 ? 0x7f80 : 0x7fc1;  // inf, NaN
    ASSERT_EQ(cudaMalloc(&sources[k], src.size() * 2 + 16), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(sources[k]) + c.offset, src.data(), src.size() * 2,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (size_t k = 0; k < cases.size(); ++k) {
    const FirstBadToHost report{b.first_bad, blocks_done, host_on_device + k};
    EXPECT_EQ(LaunchWidenHiddenStatesToHost(static_cast<char*>(sources[k]) + cases[k].offset,
                                            CudaWeightDType::kBFloat16, cases[k].count,
                                            CudaWeightDType::kBFloat16, b.dst, report, stream),
              KernelStatus::kOk);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (size_t k = 0; k < cases.size(); ++k) {
    const std::vector<int64_t>& bad = cases[k].bad;
    const unsigned long long want =
        bad.empty() ? kNoBadHiddenElement
                    : static_cast<unsigned long long>(*std::min_element(bad.begin(), bad.end()));
    EXPECT_EQ(host[k], want) << "case " << k;
  }
  unsigned long long device_first_bad = 0;
  unsigned int device_blocks_done = 1;
  ASSERT_EQ(cudaMemcpy(&device_first_bad, b.first_bad, sizeof(device_first_bad), cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&device_blocks_done, blocks_done, sizeof(device_blocks_done), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(device_first_bad, kNoBadHiddenElement);
  EXPECT_EQ(device_blocks_done, 0u);

  const FirstBadToHost no_host{b.first_bad, blocks_done, nullptr};
  EXPECT_EQ(LaunchWidenHiddenStatesToHost(sources[0], CudaWeightDType::kBFloat16, 1, CudaWeightDType::kBFloat16,
                                          b.dst, no_host, stream),
            KernelStatus::kInvalidArgument);
  const FirstBadToHost no_counter{b.first_bad, nullptr, host_on_device};
  EXPECT_EQ(LaunchWidenHiddenStatesToHost(sources[0], CudaWeightDType::kBFloat16, 1, CudaWeightDType::kBFloat16,
                                          b.dst, no_counter, stream),
            KernelStatus::kInvalidArgument);
  for (void* p : sources) cudaFree(p);
  cudaFree(blocks_done);
  cudaFreeHost(host);
  cudaStreamDestroy(stream);
}

// RideAlongCopy: the widening kernel's threads copy the caller's words from
// mapped host memory to device memory, whatever the grid (one block, or
// fewer threads than words), and the widening is unchanged beside it.
TEST(WidenHiddenStates, CopiesRideAlongWords) {
  const size_t kWords = 64 * 1024 + 3;  // more words than a 17-element launch's threads
  uint32_t* host = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&host), kWords * 4, cudaHostAllocMapped), cudaSuccess);
  void* host_on_device = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&host_on_device, host, 0), cudaSuccess);
  for (size_t w = 0; w < kWords; ++w) host[w] = static_cast<uint32_t>(w * 2654435761u);
  DeviceBuffers b;
  uint32_t* copied = nullptr;
  unsigned int* blocks_done = nullptr;
  unsigned long long* first_bad_host = nullptr;
  const int64_t kMaxCount = 1 << 20;
  ASSERT_EQ(cudaMalloc(&b.src, kMaxCount * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&b.dst), kMaxCount * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&b.first_bad), sizeof(unsigned long long)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&copied), kWords * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&blocks_done), sizeof(unsigned int)), cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&first_bad_host), sizeof(unsigned long long), cudaHostAllocMapped),
            cudaSuccess);
  ASSERT_EQ(cudaMemset(b.first_bad, 0xff, sizeof(unsigned long long)), cudaSuccess);
  ASSERT_EQ(cudaMemset(blocks_done, 0, sizeof(unsigned int)), cudaSuccess);
  const std::vector<uint16_t> ones(kMaxCount, 0x3f80);  // 1.0 in bf16
  ASSERT_EQ(cudaMemcpy(b.src, ones.data(), kMaxCount * 2, cudaMemcpyHostToDevice), cudaSuccess);
  const FirstBadToHost report{b.first_bad, blocks_done, first_bad_host};
  for (const int64_t count : {int64_t{17}, kMaxCount}) {
    for (const size_t words : {size_t{1}, size_t{8}, kWords}) {
      SCOPED_TRACE(::testing::Message() << count << " elements, " << words << " words");
      ASSERT_EQ(cudaMemset(copied, 0, kWords * 4), cudaSuccess);
      ASSERT_EQ(cudaMemset(b.dst, 0, kMaxCount * sizeof(float)), cudaSuccess);
      EXPECT_EQ(LaunchWidenHiddenStatesToHost(b.src, CudaWeightDType::kBFloat16, count, CudaWeightDType::kBFloat16,
                                              b.dst, report, nullptr, RideAlongCopy{host_on_device, copied, words * 4}),
                KernelStatus::kOk);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint32_t> got(kWords);
      ASSERT_EQ(cudaMemcpy(got.data(), copied, kWords * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      size_t wrong = 0;
      for (size_t w = 0; w < kWords; ++w) wrong += got[w] != (w < words ? host[w] : 0u);
      EXPECT_EQ(wrong, 0u);
      std::vector<float> widened(static_cast<size_t>(count));
      ASSERT_EQ(cudaMemcpy(widened.data(), b.dst, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(std::count(widened.begin(), widened.end(), 1.0f), count);
      EXPECT_EQ(*first_bad_host, kNoBadHiddenElement);
    }
  }
  // Refused: misaligned, not whole words, a null end, and a destination
  // overlapping the widening's own buffers or the source.
  const std::vector<std::pair<const char*, RideAlongCopy>> bad = {
      {"misaligned src", RideAlongCopy{static_cast<char*>(host_on_device) + 2, copied, 8}},
      {"misaligned dst", RideAlongCopy{host_on_device, reinterpret_cast<char*>(copied) + 2, 8}},
      {"6 bytes", RideAlongCopy{host_on_device, copied, 6}},
      {"null src", RideAlongCopy{nullptr, copied, 8}},
      {"null dst", RideAlongCopy{host_on_device, nullptr, 8}},
      {"into dst", RideAlongCopy{host_on_device, b.dst + 4, 8}},
      {"into the source", RideAlongCopy{host_on_device, b.src, 8}},
      {"onto itself", RideAlongCopy{copied, copied + 1, 8}},
  };
  for (const auto& [name, ride] : bad) {
    EXPECT_EQ(LaunchWidenHiddenStatesToHost(b.src, CudaWeightDType::kBFloat16, 17, CudaWeightDType::kBFloat16,
                                            b.dst, report, nullptr, ride),
              KernelStatus::kInvalidArgument)
        << name;
  }
  cudaFree(copied);
  cudaFree(blocks_done);
  cudaFreeHost(first_bad_host);
  cudaFreeHost(host);
}

TEST(WidenHiddenStates, BadArgumentsAreRefused) {
  float dst = 0.0f;
  unsigned long long first_bad = 0;
  const uint16_t src = 0;
  EXPECT_EQ(LaunchWidenHiddenStates(nullptr, CudaWeightDType::kBFloat16, 1, CudaWeightDType::kBFloat16,
                                    &dst, &first_bad, nullptr),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(LaunchWidenHiddenStates(&src, CudaWeightDType::kBFloat16, 0, CudaWeightDType::kBFloat16, &dst,
                                    &first_bad, nullptr),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(LaunchWidenHiddenStates(&src, static_cast<CudaWeightDType>(7), 1, CudaWeightDType::kBFloat16,
                                    &dst, &first_bad, nullptr),
            KernelStatus::kInvalidArgument);
}

// A few bytes, at any alignment, from device memory and from host memory
// mapped into the device's address space (registered, read by the device).
TEST(CopyDeviceBytes, CopiesFromDeviceAndMappedHostMemory) {
  unsigned char host[16];
  for (int i = 0; i < 16; ++i) host[i] = static_cast<unsigned char>(0xa0 + i);
  ASSERT_EQ(cudaHostRegister(host, sizeof(host), cudaHostRegisterMapped), cudaSuccess);
  void* mapped = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&mapped, host, 0), cudaSuccess);
  void* device_memory = nullptr;
  ASSERT_EQ(cudaMalloc(&device_memory, 32), cudaSuccess);
  unsigned char* device = static_cast<unsigned char*>(device_memory);
  ASSERT_EQ(cudaMemcpy(device, host, sizeof(host), cudaMemcpyHostToDevice), cudaSuccess);
  for (const void* source : {static_cast<const void*>(device), static_cast<const void*>(mapped)}) {
    for (const int bytes : {1, 2, 4, 8}) {
      ASSERT_EQ(cudaMemset(device + 16, 0, 16), cudaSuccess);
      // Offset 3: a 2-, 4- or 8-byte element there would be misaligned.
      ASSERT_EQ(LaunchCopyDeviceBytes(static_cast<const unsigned char*>(source) + 3, bytes, device + 16, nullptr),
                KernelStatus::kOk);
      unsigned char got[16] = {};
      ASSERT_EQ(cudaMemcpy(got, device + 16, sizeof(got), cudaMemcpyDeviceToHost), cudaSuccess);
      for (int i = 0; i < 16; ++i) {
        EXPECT_EQ(got[i], i < bytes ? host[3 + i] : 0) << "byte " << i << " of " << bytes;
      }
    }
  }
  EXPECT_EQ(LaunchCopyDeviceBytes(device, 0, device + 16, nullptr), KernelStatus::kInvalidArgument);
  EXPECT_EQ(LaunchCopyDeviceBytes(device, 9, device + 16, nullptr), KernelStatus::kInvalidArgument);
  EXPECT_EQ(LaunchCopyDeviceBytes(nullptr, 1, device + 16, nullptr), KernelStatus::kInvalidArgument);
  cudaFree(device);
  cudaHostUnregister(host);
}

}  // namespace
}  // namespace flashsampler::kernels
