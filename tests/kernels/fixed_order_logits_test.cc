// FixedOrderLogits: the summation order is the contract, so the tests pin it
// bit for bit (against a plain scalar transcription of the contract, on every
// ISA variant the CPU runs), show that a row's logits do not depend on the
// other rows of its call or on where its tile starts, and check the values
// against float64 dot products.
#include "kernels/cpu/fixed_order_logits.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace flashsampler::kernels {
namespace {

std::vector<float> Normal(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(gen);
  return v;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// The contract of fixed_order_logits.h, written out with no cleverness.
float ContractDot(const float* a, const float* b, int64_t hidden) {
  float lane[16] = {};
  const int64_t padded = (hidden + 15) / 16 * 16;
  for (int64_t k = 0; k < padded; ++k) {
    const float x = k < hidden ? a[k] : 0.0f, y = k < hidden ? b[k] : 0.0f;
    lane[k % 16] = std::fma(x, y, lane[k % 16]);
  }
  for (int i = 0; i < 8; ++i) lane[i] += lane[i + 8];
  for (int i = 0; i < 4; ++i) lane[i] += lane[i + 4];
  for (int i = 0; i < 2; ++i) lane[i] += lane[i + 2];
  return lane[0] + lane[1];
}

std::vector<DotIsa> Variants() {
  std::vector<DotIsa> v = {DotIsa::kScalar};
  if (BestDotIsa() != DotIsa::kScalar) v.push_back(BestDotIsa());
  return v;
}

TEST(FixedOrderLogits, EveryVariantComputesTheContractBitForBit) {
  // Hidden sizes around the 16-lane groups (tails of every length), rows and
  // tokens around the 2 x 3 register blocks.
  for (int64_t hidden : {1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 1024}) {
    for (int64_t rows : {1, 2, 3, 5}) {
      for (int64_t n : {1, 2, 3, 4, 7}) {
        const std::vector<float> h = Normal(rows * hidden, 1 + hidden);
        const std::vector<float> w = Normal(n * hidden, 2 + hidden);
        for (DotIsa isa : Variants()) {
          std::vector<float> out(static_cast<size_t>(rows * n), NAN);
          FixedOrderLogits(h.data(), rows, w.data(), n, hidden, out.data(), isa);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t j = 0; j < n; ++j) {
              const float want = ContractDot(h.data() + r * hidden, w.data() + j * hidden, hidden);
              ASSERT_EQ(Bits(out[r * n + j]), Bits(want))
                  << DotIsaName(isa) << " hidden " << hidden << " rows " << rows << " n " << n
                  << " at (" << r << ", " << j << ")";
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
  // another token. Values spread over many magnitudes, so that any change of
  // summation order would show in the low bits.
  constexpr int64_t kHidden = 1000, kTokens = 70;
  std::mt19937 gen(7);
  std::vector<float> w = Normal(kTokens * kHidden, 3);
  for (size_t i = 0; i < w.size(); ++i) w[i] *= std::ldexp(1.0f, static_cast<int>(i % 23) - 11);
  const std::vector<float> rows = Normal(64 * kHidden, 4);
  for (int64_t r = 0; r < 64; ++r) {
    const float* row = rows.data() + r * kHidden;
    std::vector<float> alone(kTokens);
    FixedOrderLogits(row, 1, w.data(), kTokens, kHidden, alone.data());
    for (int64_t batch : {2, 3, 17, 128, 1000}) {
      std::vector<float> h = Normal(batch * kHidden, static_cast<uint32_t>(100 + r * 7 + batch));
      const int64_t at = std::uniform_int_distribution<int64_t>(0, batch - 1)(gen);
      std::copy(row, row + kHidden, h.begin() + at * kHidden);
      std::vector<float> out(static_cast<size_t>(batch * kTokens));
      FixedOrderLogits(h.data(), batch, w.data(), kTokens, kHidden, out.data());
      for (int64_t j = 0; j < kTokens; ++j) {
        ASSERT_EQ(Bits(out[at * kTokens + j]), Bits(alone[j])) << "row " << r << " batch " << batch;
      }
    }
    // The same tokens as part of a tile starting 5 tokens earlier.
    std::vector<float> tile(kTokens - 5);
    FixedOrderLogits(row, 1, w.data() + 5 * kHidden, kTokens - 5, kHidden, tile.data());
    for (int64_t j = 5; j < kTokens; ++j) ASSERT_EQ(Bits(tile[j - 5]), Bits(alone[j]));
  }
}

TEST(FixedOrderLogits, ValuesAreTheDotProductsToFp32Rounding) {
  constexpr int64_t kHidden = 4096, kRows = 4, kTokens = 9;
  const std::vector<float> h = Normal(kRows * kHidden, 5), w = Normal(kTokens * kHidden, 6);
  std::vector<float> out(kRows * kTokens);
  FixedOrderLogits(h.data(), kRows, w.data(), kTokens, kHidden, out.data());
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < kTokens; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t k = 0; k < kHidden; ++k) {
        exact += double(h[r * kHidden + k]) * w[j * kHidden + k];
        magnitude += std::fabs(double(h[r * kHidden + k]) * w[j * kHidden + k]);
      }
      // Each of the (hidden / 16 + 4) roundings on a lane's path adds at most
      // 2^-24 of the magnitude summed so far.
      EXPECT_NEAR(out[r * kTokens + j], exact, magnitude * (kHidden / 16 + 4) * 0x1p-24);
    }
  }
}

}  // namespace
}  // namespace flashsampler::kernels
