// FixedOrderLogits: the CPU backend's logits, out[r * n + j] = h_r . w_{token0+j}
// for r < rows, j < n, where every dot product is summed in ONE order that
// depends on nothing but `hidden`: not on `rows`, `n`, `token0`, the tile, the
// thread or the instruction set. This is what makes the CPU backend
// batch-invariant by construction: a row's logits, and so its token, log Z,
// logprobs, top logprobs and draft log-probability, are bit-identical in every
// batch (the RNG contract already makes its noise so).
//
// The order (the contract; tests/kernels/fixed_order_logits_test.cc pins it):
// one chain of fused multiply-adds in increasing k, starting from +0:
//   acc = +0;  for k = 0 .. hidden-1:  acc = fma(h[k], w[k], acc);
// No split of k, no lanes, no tree: the parallelism is across rows and tokens,
// never across k, so no blocking of the batch or the vocabulary can regroup a
// sum. (A BLAS sgemm picks its kernel, blocking and so its summation order by
// the matrix shape; a row's logits changed with the rest of its batch.)
//
// W lives in TOKEN PANELS, laid out once when the engine loads the head: the
// vocabulary is cut into panels of kTokenPanelWidth = 16 consecutive tokens,
// and panel p stores its tokens k-major,
//   panels[(p * hidden + k) * 16 + t] = W[16 p + t][k]   (t < 16),
// with the tokens past the vocabulary zero. One k step of a panel is then 16
// contiguous elements, loaded once and multiplied by a broadcast h[r][k] for
// several rows at a time (a GEMM micro-kernel, with W packed once for the
// life of the process instead of on every call).
//
// The panels keep the head's element type (PanelType): fp32, or the raw bits
// of a bf16 or fp16 head, in the same layout (2 bytes an element: half the
// memory and half the cache footprint of fp32 panels). The kernels widen a
// 16-bit k step to fp32 in registers before its fma. Widening is exact (every
// bf16 and fp16 value, subnormals included, is an fp32 value: the conversions
// of kernels/common/half_precision.h), so the 16-bit panels give exactly the
// logits of fp32 panels holding the widened head: the contract below is on
// the widened values, w[k] = widen(W[token][k]).
//
// Every ISA variant computes exactly these operations: the AVX2 and AVX-512
// variants keep one fp32 chain per (row, token) in a register lane and use
// vfmadd; the scalar variant uses std::fma. Both are correctly rounded IEEE operations on
// the same operands in the same order, so the bits agree. Blocking over k
// stores a chain to memory and reloads it, which is exact; so is moving a
// chain between register lanes (the AVX2 bf16 kernel holds a panel's tokens
// in even/odd order, fixed_order_logits.cc).
//
// Thread safety: pure functions; `out` (and `panels` for PackTokenPanels) is
// the only memory written. Concurrent calls on disjoint outputs are safe.
#pragma once

#include <cstdint>

namespace flashsampler::kernels {

inline constexpr int kTokenPanelWidth = 16;

// The element type of W's token panels.
enum class PanelType {
  kFloat32,   // float
  kBFloat16,  // uint16_t: bf16 bits
  kFloat16,   // uint16_t: IEEE binary16 bits
};

// W in the token-panel layout, and its element type. Not owning.
struct TokenPanels {
  TokenPanels() = default;
  // fp32 panels. Implicit: a float pointer can only be fp32 panels (the
  // tests build fp32 panels from float vectors and pass their data()).
  TokenPanels(const float* fp32) : data(fp32), type(PanelType::kFloat32) {}
  // The raw bits of a 16-bit head.
  static TokenPanels BFloat16(const uint16_t* bits) { return {bits, PanelType::kBFloat16}; }
  static TokenPanels Float16(const uint16_t* bits) { return {bits, PanelType::kFloat16}; }

  const void* data = nullptr;
  PanelType type = PanelType::kFloat32;

 private:
  TokenPanels(const void* d, PanelType t) : data(d), type(t) {}
};

// Elements of the token-panel layout of a [vocab, hidden] W (vocab rounded up
// to a whole panel), whatever their type.
int64_t TokenPanelElements(int64_t vocab, int64_t hidden);

// Copies `count` rows of W (row-major [count, hidden], tokens first_token ..
// first_token + count - 1) into their places in `panels`, which holds
// TokenPanelElements(vocab, hidden) elements, zero-initialised by the caller
// (the padding tokens of the last panel must read as 0; +0 is the all-zero
// bit pattern in all three types). The uint16_t overload copies a 16-bit
// head's bits unchanged, bf16 or fp16 alike.
void PackTokenPanels(const float* rows, int64_t first_token, int64_t count, int64_t hidden,
                     float* panels);
void PackTokenPanels(const uint16_t* rows, int64_t first_token, int64_t count, int64_t hidden,
                     uint16_t* panels);

enum class DotIsa {
  kScalar,  // any CPU
  kAvx2,    // x86-64 with AVX2, FMA and F16C (fp16 panels: vcvtph2ps)
  kAvx512,  // x86-64 with AVX-512F
};

// Whether this CPU runs `isa`; the widest such variant (checked once).
bool DotIsaSupported(DotIsa isa);
DotIsa BestDotIsa();
const char* DotIsaName(DotIsa isa);

// out[r * n + j] = h[r, :] . widen(W[token0 + j, :]) in the order above; h
// is row-major [rows, hidden], `panels` W in the token-panel layout, and
// tokens token0 .. token0 + n - 1 must lie inside it. `isa` must be one the
// CPU runs (DotIsaSupported); tests pass each to compare their bits.
void FixedOrderLogits(const float* h, int64_t rows, TokenPanels panels, int64_t token0, int64_t n,
                      int64_t hidden, float* out, DotIsa isa);
inline void FixedOrderLogits(const float* h, int64_t rows, TokenPanels panels, int64_t token0,
                             int64_t n, int64_t hidden, float* out) {
  FixedOrderLogits(h, rows, panels, token0, n, hidden, out, BestDotIsa());
}

}  // namespace flashsampler::kernels
