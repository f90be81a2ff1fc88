// FixedOrderLogits: the summation order is the contract, so the tests pin it
// bit for bit (against a plain scalar transcription of the contract, on every
// ISA variant the CPU runs), show that a row's logits do not depend on the
// other rows of its call or on where its tile starts, check the token-panel
// layout, and check the values against float64 dot products.
#include "kernels/cpu/fixed_order_logits.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/token_panels.h"

namespace flashsampler::kernels {
namespace {

using testing::TokenPanelsOf;

// Normal values spread over many binades (and, every 97th, a subnormal), so
// that any other summation order, or a flush to zero, shows in the low bits.
std::vector<float> Spread(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = normal(gen) * std::ldexp(1.0f, static_cast<int>(i % 23) - 11);
    if (i % 97 == 5) v[i] = std::ldexp(normal(gen), -130);
  }
  return v;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// The contract of fixed_order_logits.h, written out with no cleverness.
float ContractDot(const float* a, const float* b, int64_t hidden) {
  float acc = 0.0f;
  for (int64_t k = 0; k < hidden; ++k) acc = std::fma(a[k], b[k], acc);
  return acc;
}

// Every variant this CPU runs (the CI machine: scalar and AVX2; the GPU
// hosts: AVX-512 too).
std::vector<DotIsa> Variants() {
  std::vector<DotIsa> v;
  for (DotIsa isa : {DotIsa::kScalar, DotIsa::kAvx2, DotIsa::kAvx512}) {
    if (DotIsaSupported(isa)) v.push_back(isa);
  }
  return v;
}

TEST(FixedOrderLogits, PanelsHoldSixteenTokensKMajorAndZeroPadding) {
  constexpr int64_t kVocab = 35, kHidden = 3;
  std::vector<float> w(kVocab * kHidden);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i + 1);
  ASSERT_EQ(TokenPanelFloats(kVocab, kHidden), 48 * kHidden);
  const std::vector<float> panels = TokenPanelsOf(w, kHidden);
  for (int64_t p = 0; p < 3; ++p) {
    for (int64_t k = 0; k < kHidden; ++k) {
      for (int64_t t = 0; t < 16; ++t) {
        const int64_t token = 16 * p + t;
        const float want = token < kVocab ? w[token * kHidden + k] : 0.0f;
        ASSERT_EQ(panels[(p * kHidden + k) * 16 + t], want) << "token " << token << " k " << k;
      }
    }
  }
}

TEST(FixedOrderLogits, EveryVariantComputesTheContractBitForBit) {
  // Hidden sizes around the kernel's k blocks of 512, rows around its row
  // blocks (6 for AVX2, 12 for AVX-512), and token ranges that start and end inside a panel, on a
  // panel edge, and inside one panel.
  constexpr int64_t kVocab = 70;
  for (int64_t hidden : {1, 7, 16, 17, 100, 511, 512, 513, 1100}) {
    const std::vector<float> w = Spread(kVocab * hidden, 2 + static_cast<uint32_t>(hidden));
    const std::vector<float> panels = TokenPanelsOf(w, hidden);
    for (int64_t rows : {1, 2, 5, 6, 7, 12, 13, 25}) {
      const std::vector<float> h = Spread(rows * hidden, 1 + static_cast<uint32_t>(hidden));
      for (int64_t token0 : {0, 3, 16, 21}) {
        for (int64_t n : {1, 5, 13, 16, 29, 48}) {  // 48: pairs of whole panels
          for (DotIsa isa : Variants()) {
            std::vector<float> out(static_cast<size_t>(rows * n), NAN);
            FixedOrderLogits(h.data(), rows, panels.data(), token0, n, hidden, out.data(), isa);
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t j = 0; j < n; ++j) {
                const float want =
                    ContractDot(h.data() + r * hidden, w.data() + (token0 + j) * hidden, hidden);
                ASSERT_EQ(Bits(out[r * n + j]), Bits(want))
                    << DotIsaName(isa) << " hidden " << hidden << " rows " << rows << " tokens ["
                    << token0 << ", " << token0 + n << ") at (" << r << ", " << j << ")";
              }
            }
          }
        }
      }
    }
  }
}

TEST(FixedOrderLogits, ARowsLogitsDoNotDependOnItsBatchOrTile) {
  // 64 rows: each alone, and inside batches of 2, 3, 17, 128 and 1000 rows of
  // random companions at a random position; and over a tile that starts at
  // another token.
  constexpr int64_t kHidden = 1000, kTokens = 70;
  std::mt19937 gen(7);
  const std::vector<float> w = Spread(kTokens * kHidden, 3);
  const std::vector<float> panels = TokenPanelsOf(w, kHidden);
  const std::vector<float> rows = Spread(64 * kHidden, 4);
  for (int64_t r = 0; r < 64; ++r) {
    const float* row = rows.data() + r * kHidden;
    std::vector<float> alone(kTokens);
    FixedOrderLogits(row, 1, panels.data(), 0, kTokens, kHidden, alone.data());
    for (int64_t batch : {2, 3, 17, 128, 1000}) {
      std::vector<float> h = Spread(batch * kHidden, static_cast<uint32_t>(100 + r * 7 + batch));
      const int64_t at = std::uniform_int_distribution<int64_t>(0, batch - 1)(gen);
      std::copy(row, row + kHidden, h.begin() + at * kHidden);
      std::vector<float> out(static_cast<size_t>(batch * kTokens));
      FixedOrderLogits(h.data(), batch, panels.data(), 0, kTokens, kHidden, out.data());
      for (int64_t j = 0; j < kTokens; ++j) {
        ASSERT_EQ(Bits(out[at * kTokens + j]), Bits(alone[j])) << "row " << r << " batch " << batch;
      }
    }
    // The same tokens as part of a tile starting 5 tokens later.
    std::vector<float> tile(kTokens - 5);
    FixedOrderLogits(row, 1, panels.data(), 5, kTokens - 5, kHidden, tile.data());
    for (int64_t j = 5; j < kTokens; ++j) ASSERT_EQ(Bits(tile[j - 5]), Bits(alone[j]));
  }
}

TEST(FixedOrderLogits, ValuesAreTheDotProductsToFp32Rounding) {
  constexpr int64_t kHidden = 4096, kRows = 4, kTokens = 9;
  std::mt19937 gen(5);
  std::normal_distribution<float> normal;
  std::vector<float> h(kRows * kHidden), w(kTokens * kHidden);
  for (float& x : h) x = normal(gen);
  for (float& x : w) x = normal(gen);
  const std::vector<float> panels = TokenPanelsOf(w, kHidden);
  std::vector<float> out(kRows * kTokens);
  FixedOrderLogits(h.data(), kRows, panels.data(), 0, kTokens, kHidden, out.data());
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < kTokens; ++j) {
      // Each fma rounds once, by at most 2^-24 of the partial sum it
      // produces: the error is at most 2^-24 * sum_k |s_k| (to first order;
      // 1.01 covers the rest). That is ~0.015 here, where a lost or doubled
      // product is ~0.8.
      double exact = 0, partial_sums = 0;
      for (int64_t k = 0; k < kHidden; ++k) {
        exact += double(h[r * kHidden + k]) * w[j * kHidden + k];
        partial_sums += std::fabs(exact);
      }
      EXPECT_NEAR(out[r * kTokens + j], exact, 1.01 * partial_sums * 0x1p-24);
    }
  }
}

}  // namespace
}  // namespace flashsampler::kernels
