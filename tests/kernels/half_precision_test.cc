// Tests of kernels/common/half_precision.h: exhaustive widening of bf16 / fp16
// against independent float64 references, and round-to-nearest-even narrowing
// of FloatToBf16 / FloatToFp16 against a reference that picks the nearer of
// the two neighbouring patterns.
#include "kernels/common/half_precision.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

namespace flashsampler {
namespace {

// Value of a bf16 bit pattern with an unbounded exponent (so 0x7f80 reads as
// 2^128, the IEEE rule for deciding overflow), NaN for NaN.
double Bf16Value(uint32_t h) {
  const int sign = (h >> 15) & 1;
  const int exponent = (h >> 7) & 0xff;
  const int mantissa = h & 0x7f;
  if (exponent == 0xff && mantissa != 0) return NAN;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -133)
                                         : std::ldexp(128 + mantissa, exponent - 134);
  return sign ? -magnitude : magnitude;
}

// IEEE binary16 value from its fields.
double Fp16Value(uint32_t h) {
  const int sign = (h >> 15) & 1;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) {
    magnitude = mantissa ? NAN : INFINITY;
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else {
    magnitude = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

// Round-to-nearest-even reference of FloatToBf16 for a non-NaN float: the two
// candidates around x, the nearer one, ties to the even pattern.
uint16_t ReferenceFloatToBf16(float x) {
  const uint32_t bits = FloatToBits(x);
  const uint32_t down = bits >> 16;  // truncation toward zero
  const uint32_t up = down + 1;      // away from zero (0x7f80 for the largest)
  if ((bits & 0xffffu) == 0) return static_cast<uint16_t>(down);
  const double xd = std::fabs(static_cast<double>(x));
  const double d_down = xd - std::fabs(Bf16Value(down));
  const double d_up = std::fabs(Bf16Value(up)) - xd;
  if (d_down < d_up) return static_cast<uint16_t>(down);
  if (d_up < d_down) return static_cast<uint16_t>(up);
  return static_cast<uint16_t>((down & 1) ? up : down);
}

// Round-to-nearest-even reference of FloatToFp16 for a non-NaN float: walk to
// the largest fp16 magnitude <= |x| (with 0x7c00 read as 2^16, the IEEE rule
// for overflow), then take the nearer of it and the next one, ties to even.
uint16_t ReferenceFloatToFp16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  auto value = [](uint32_t h) { return h == 0x7c00 ? 65536.0 : Fp16Value(h); };
  if (a >= 65536.0) return sign | 0x7c00;
  // Positive fp16 patterns are ordered like their values: binary search.
  uint32_t lo = 0, hi = 0x7c00;  // value(lo) <= a < value(hi)
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    (value(mid) <= a ? lo : hi) = mid;
  }
  const double d_lo = a - value(lo), d_hi = value(hi) - a;
  uint32_t h = d_lo < d_hi ? lo : d_hi < d_lo ? hi : ((lo & 1) ? hi : lo);
  return static_cast<uint16_t>(sign | h);
}

TEST(HalfPrecisionTest, Bf16WideningIsExhaustivelyExact) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(h));
    const double ref = Bf16Value(h);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
    } else if ((h & 0x7fff) == 0x7f80) {
      EXPECT_TRUE(std::isinf(f) && std::signbit(f) == ((h >> 15) != 0)) << std::hex << h;
    } else {
      EXPECT_EQ(static_cast<double>(f), ref) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h >> 15) != 0) << std::hex << h;  // -0 stays -0
    }
    EXPECT_EQ(FloatToBits(f), h << 16);  // payloads kept
  }
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0xc040), -3.0f);
  EXPECT_EQ(Bf16ToFloat(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
}

TEST(HalfPrecisionTest, Fp16WideningIsExhaustivelyExact) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    const double ref = Fp16Value(h);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      // The 10-bit payload sits in the top of the fp32 mantissa.
      EXPECT_EQ((FloatToBits(f) >> 13) & 0x3ff, h & 0x3ff) << std::hex << h;
    } else {
      EXPECT_EQ(static_cast<double>(f), ref) << std::hex << h;
    }
    if (!std::isnan(ref)) {
      EXPECT_EQ(std::signbit(f), (h >> 15) != 0) << std::hex << h;
    }
  }
  EXPECT_EQ(Fp16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Fp16ToFloat(0x7bff), 65504.0f);                 // largest finite
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));    // smallest subnormal
  EXPECT_EQ(Fp16ToFloat(0x03ff), 1023 * std::ldexp(1.0f, -24));  // largest subnormal
  EXPECT_EQ(Fp16ToFloat(0x0400), std::ldexp(1.0f, -14));    // smallest normal
  EXPECT_EQ(Fp16ToFloat(0x7c00), INFINITY);
  EXPECT_EQ(Fp16ToFloat(0xfc00), -INFINITY);
  EXPECT_TRUE(std::signbit(Fp16ToFloat(0x8000)));
}

TEST(HalfPrecisionTest, FloatToBf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81).
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 0x3f81 (odd) and 0x3f82 (even).
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just off halfway goes to the nearer side.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(FloatToBf16(-1.0f - 0x1p-8f), 0xbf80);  // symmetric for negatives
  // The largest floats round up to infinity; infinities and zeros stay.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x7f7fffffu)), 0x7f80);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(FloatToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(FloatToBf16(-INFINITY), 0xff80);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  // Subnormals round the same way (halfway to even).
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x00008000u)), 0x0000);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x00018000u)), 0x0002);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x00018001u)), 0x0002);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x00010001u)), 0x0001);
  // The smallest normal float rounds within the normal range.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x00800000u)), 0x0080);
}

TEST(HalfPrecisionTest, FloatToBf16MatchesReferenceOnRandomAndHalfwayInputs) {
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    uint32_t bits = rng();
    if (i % 4 == 0) bits = (bits & 0xffff0000u) | 0x8000u;  // exact halfway cases
    const float x = BitsToFloat(bits);
    if (std::isnan(x)) continue;
    ASSERT_EQ(FloatToBf16(x), ReferenceFloatToBf16(x)) << std::hex << bits;
  }
}

TEST(HalfPrecisionTest, FloatToBf16KeepsNaNsNaN) {
  // Payloads only in the low 16 bits would truncate to an infinity; the quiet
  // bit keeps them NaN. The sign is kept.
  for (uint32_t bits : {0x7f800001u, 0x7f80ffffu, 0x7fc00000u, 0xff800001u, 0x7fffffffu}) {
    const uint16_t h = FloatToBf16(BitsToFloat(bits));
    EXPECT_TRUE(std::isnan(Bf16ToFloat(h))) << std::hex << bits;
    EXPECT_EQ(h >> 15, bits >> 31) << std::hex << bits;
  }
  // Round trip bf16 -> float -> bf16 is the identity on every non-NaN pattern.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(FloatToBf16(f), h) << std::hex << h;
    }
  }
}

TEST(HalfPrecisionTest, FloatToFp16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(f)))) << std::hex << h;
    } else {
      ASSERT_EQ(FloatToFp16(f), h) << std::hex << h;
    }
  }
}

TEST(HalfPrecisionTest, FloatToFp16RoundsToNearestEven) {
  EXPECT_EQ(FloatToFp16(1.0f + 0x1p-11f), 0x3c00);      // halfway, to even (down)
  EXPECT_EQ(FloatToFp16(1.0f + 3 * 0x1p-11f), 0x3c02);  // halfway, to even (up)
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65519.996f), 0x7bff);           // just below the overflow midpoint
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);             // midpoint, to even: infinity
  EXPECT_EQ(FloatToFp16(-1e9f), 0xfc00);
  EXPECT_EQ(FloatToFp16(0x1p-25f), 0x0000);             // half the smallest subnormal: even
  EXPECT_EQ(FloatToFp16(0x1.000002p-25f), 0x0001);
  EXPECT_EQ(FloatToFp16(3 * 0x1p-25f), 0x0002);         // 1.5 subnormal units: to even
  EXPECT_EQ(FloatToFp16(0x1.ff8p-15f), 0x03ff);         // the largest subnormal
  EXPECT_EQ(FloatToFp16(0x1.ffcp-15f), 0x0400);         // its midpoint to 2^-14: to even, a normal
  EXPECT_EQ(FloatToFp16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(NAN))));

  std::mt19937 rng(8);
  for (int i = 0; i < 1000000; ++i) {
    uint32_t bits = rng();
    // Bias towards the fp16 range (|x| in [2^-26, 2^17)) and exact midpoints.
    if (i % 2 == 0) bits = (bits & 0x807fffffu) | ((101u + (bits >> 8) % 43u) << 23);
    if (i % 8 == 0) bits = (bits & 0xffffe000u) | 0x1000u;
    const float x = BitsToFloat(bits);
    if (std::isnan(x)) continue;
    ASSERT_EQ(FloatToFp16(x), ReferenceFloatToFp16(x)) << std::hex << bits;
  }
}

}  // namespace
}  // namespace flashsampler
