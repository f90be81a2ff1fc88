// FixedOrderLogits: the summation order is the contract, so the tests pin it
// bit for bit (against a plain scalar transcription of the contract, on every
// ISA variant the CPU runs, for fp32 panels and for bf16 and fp16 panels on
// their widened values), show that a row's logits do not depend on the other
// rows of its call or on where its tile starts, check the token-panel layout,
// and check the values against float64 dot products.
#include "kernels/cpu/fixed_order_logits.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/half_precision.h"
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

// W [35, 3] holding 1, 2, 3, ... (the bits 0x8001, 0x8002, ... for a 16-bit
// head) in three panels: 16 tokens k-major each, the last 13 tokens zero.
template <typename Element>
void ExpectPanelLayout(Element first) {
  constexpr int64_t kVocab = 35, kHidden = 3;
  std::vector<Element> w(kVocab * kHidden);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<Element>(first + i);
  ASSERT_EQ(TokenPanelElements(kVocab, kHidden), 48 * kHidden);
  const std::vector<Element> panels = TokenPanelsOf(w, kHidden);
  ASSERT_EQ(static_cast<int64_t>(panels.size()), 48 * kHidden);
  for (int64_t p = 0; p < 3; ++p) {
    for (int64_t k = 0; k < kHidden; ++k) {
      for (int64_t t = 0; t < 16; ++t) {
        const int64_t token = 16 * p + t;
        const Element want = token < kVocab ? w[token * kHidden + k] : Element{0};
        ASSERT_EQ(panels[(p * kHidden + k) * 16 + t], want) << "token " << token << " k " << k;
      }
    }
  }
}

TEST(FixedOrderLogits, PanelsHoldSixteenTokensKMajorAndZeroPadding) {
  ExpectPanelLayout<float>(1.0f);
  // A 16-bit head's bits, unchanged, in the same places.
  ExpectPanelLayout<uint16_t>(0x8001);
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

// ------------------------------------------------------ 16-bit panels ----
//
// A bf16 or fp16 head stays 16-bit in its panels and the kernels widen it in
// registers. Widening is exact, so the logits must be the contract's on the
// widened values, bit for bit, on every variant.

enum class Half { kBf16, kFp16 };

const char* HalfName(Half half) { return half == Half::kBf16 ? "bf16" : "fp16"; }

float Widen(Half half, uint16_t bits) {
  return half == Half::kBf16 ? Bf16ToFloat(bits) : Fp16ToFloat(bits);
}

TokenPanels PanelsOf(Half half, const std::vector<uint16_t>& panels) {
  return half == Half::kBf16 ? TokenPanels::BFloat16(panels.data())
                             : TokenPanels::Float16(panels.data());
}

// A 16-bit head [vocab, hidden] and a matching h: column k of W holds one
// kind of value (k % 5), and h's column k a scale that brings its products
// to the size of the others (|h w| ~ 2^-8 .. 2^8), so that every product
// reaches the low bits of the sums and a value widened wrongly shows:
//   0  ordinary values (fp32 values rounded: random low mantissa bits)
//   1  the low mantissa bits set (bf16: the low 4 of 7; fp16: the low 5 of 10)
//   2  subnormals (h scale 2^120 for bf16, 2^16 for fp16)
//   3  the largest finite magnitude, either sign (h scale 2^-124 / 2^-14,
//      so some h are fp32 subnormals)
//   4  +0 or -0 (a -0 widened to +0 could not show: the chain starts at +0
//      and fma(h, -0, acc) = fma(h, +0, acc) for finite h and acc; here for
//      coverage of the bit pattern)
struct HalfProblem {
  std::vector<uint16_t> w;  // [vocab, hidden] bits
  std::vector<float> h;     // [rows, hidden]
};

HalfProblem MakeHalfProblem(Half half, int64_t vocab, int64_t hidden, int64_t rows, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  auto bits = [&](int b) { return static_cast<uint16_t>(gen() & ((1u << b) - 1)); };
  const bool bf16 = half == Half::kBf16;
  const int mantissa_bits = bf16 ? 7 : 10;
  const uint16_t sign = 0x8000, largest = bf16 ? 0x7f7f : 0x7bff;
  HalfProblem p;
  p.w.resize(static_cast<size_t>(vocab * hidden));
  std::vector<float> column_scale(static_cast<size_t>(hidden), 1.0f);
  for (int64_t k = 0; k < hidden; ++k) {
    switch (k % 5) {
      case 2: column_scale[k] = bf16 ? 0x1p120f : 0x1p16f; break;
      case 3: column_scale[k] = bf16 ? 0x1p-124f : 0x1p-14f; break;
      default: break;
    }
  }
  for (int64_t t = 0; t < vocab; ++t) {
    for (int64_t k = 0; k < hidden; ++k) {
      const uint16_t s = (gen() & 1) ? sign : 0;
      uint16_t& w = p.w[t * hidden + k];
      switch (k % 5) {
        case 0: {
          const float v = normal(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 9) - 4);
          w = bf16 ? FloatToBf16(v) : FloatToFp16(v);
          break;
        }
        case 1: {  // exponent 2^-4 .. 2^4
          const int exponent = (bf16 ? 127 : 15) - 4 + static_cast<int>(gen() % 9);
          const uint16_t low = bf16 ? 0x0f : 0x1f;
          w = s | static_cast<uint16_t>(exponent << mantissa_bits) | bits(mantissa_bits) | low;
          break;
        }
        case 2: w = s | std::max<uint16_t>(bits(mantissa_bits), 1); break;
        case 3: w = s | largest; break;
        default: w = s; break;
      }
    }
  }
  p.h.resize(static_cast<size_t>(rows * hidden));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < hidden; ++k) {
      p.h[r * hidden + k] =
          normal(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 9) - 4) * column_scale[k];
    }
  }
  return p;
}

TEST(FixedOrderLogits, SixteenBitPanelsGiveTheContractOnTheWidenedHeadBitForBit) {
  // The sweep of EveryVariantComputesTheContractBitForBit: hidden sizes
  // around the k blocks, rows around the row blocks, token ranges cut inside
  // a panel, on its edges, and pairs of whole panels.
  constexpr int64_t kVocab = 70, kMaxRows = 25;
  for (Half half : {Half::kBf16, Half::kFp16}) {
    for (int64_t hidden : {1, 7, 16, 17, 100, 511, 512, 513, 1100}) {
      const HalfProblem p =
          MakeHalfProblem(half, kVocab, hidden, kMaxRows, 11 + static_cast<uint32_t>(hidden));
      std::vector<float> widened(p.w.size());
      for (size_t i = 0; i < p.w.size(); ++i) widened[i] = Widen(half, p.w[i]);
      const std::vector<uint16_t> panels = TokenPanelsOf(p.w, hidden);
      // want[r * kVocab + t]: the contract on the widened values.
      std::vector<float> want(static_cast<size_t>(kMaxRows * kVocab));
      for (int64_t r = 0; r < kMaxRows; ++r) {
        for (int64_t t = 0; t < kVocab; ++t) {
          want[r * kVocab + t] =
              ContractDot(p.h.data() + r * hidden, widened.data() + t * hidden, hidden);
          ASSERT_TRUE(std::isfinite(want[r * kVocab + t])) << "the problem overflows";
        }
      }
      for (int64_t rows : {1, 2, 5, 6, 7, 12, 13, 25}) {
        for (int64_t token0 : {0, 3, 16, 21}) {
          for (int64_t n : {1, 5, 13, 16, 29, 48}) {
            for (DotIsa isa : Variants()) {
              std::vector<float> out(static_cast<size_t>(rows * n), NAN);
              FixedOrderLogits(p.h.data(), rows, PanelsOf(half, panels), token0, n, hidden,
                               out.data(), isa);
              for (int64_t r = 0; r < rows; ++r) {
                for (int64_t j = 0; j < n; ++j) {
                  ASSERT_EQ(Bits(out[r * n + j]), Bits(want[r * kVocab + token0 + j]))
                      << HalfName(half) << " " << DotIsaName(isa) << " hidden " << hidden
                      << " rows " << rows << " tokens [" << token0 << ", " << token0 + n
                      << ") at (" << r << ", " << j << ")";
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace flashsampler::kernels
