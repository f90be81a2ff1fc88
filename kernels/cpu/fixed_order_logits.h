// FixedOrderLogits: the CPU backend's logits, out[r * n + j] = h_r . w_j for
// r < rows, j < n (h [rows, hidden] and w [n, hidden], both row-major fp32),
// where every dot product is summed in ONE order that depends on nothing but
// `hidden`: not on `rows`, `n`, the tile, the thread or the instruction set.
//
// The order (the contract; tests/kernels/fixed_order_logits_test.cc pins it):
//   - the row is zero-padded to a multiple of kFixedOrderLanes = 16 elements;
//   - element k goes to lane k % 16, and each lane accumulates its products in
//     increasing k with fused multiply-adds from +0: lane = fma(h_k, w_k, lane);
//   - the 16 lanes are summed as a tree: l_i += l_{i+8} (i < 8), then
//     l_i += l_{i+4}, l_i += l_{i+2}, l_0 += l_1.
// A BLAS sgemm instead picks its kernel, blocking and so its summation order
// by the matrix shape, so a row's logits (and, at a near-tie, its token, and
// always its log Z and logprobs bits) changed with the rest of its batch.
// Here a row's logits are bit-identical in every batch, which makes the CPU
// backend batch-invariant by construction (the RNG contract already makes
// its noise so).
//
// Every ISA variant computes exactly these operations: AVX2 holds lanes 0-7
// and 8-15 in two registers and uses vfmadd; the scalar variant uses
// std::fma. IEEE fma and add are correctly rounded, so the bits agree.
//
// Thread safety: pure functions; `out` is the only memory written.
#pragma once

#include <cstdint>

namespace flashsampler::kernels {

inline constexpr int kFixedOrderLanes = 16;

enum class DotIsa {
  kScalar,  // any CPU
  kAvx2,    // x86-64 with AVX2 and FMA
};

// The widest variant this CPU runs (checked once).
DotIsa BestDotIsa();
const char* DotIsaName(DotIsa isa);

// out[r * n + j] = h[r, :] . w[j, :] in the order above. `isa` must be one the
// CPU runs (BestDotIsa() or kScalar); tests pass both to compare their bits.
void FixedOrderLogits(const float* h, int64_t rows, const float* w, int64_t n, int64_t hidden,
                      float* out, DotIsa isa);
inline void FixedOrderLogits(const float* h, int64_t rows, const float* w, int64_t n,
                             int64_t hidden, float* out) {
  FixedOrderLogits(h, rows, w, n, hidden, out, BestDotIsa());
}

}  // namespace flashsampler::kernels
