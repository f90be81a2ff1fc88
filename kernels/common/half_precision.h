// Bit-exact conversions from the 16-bit storage formats to fp32.
//
// bf16 is the top half of an fp32, so widening is a shift. fp16 (IEEE binary16)
// widens exactly too: every fp16 value, subnormals included, is an fp32 value.
// NaNs stay NaNs with their payload bits (a signalling NaN is not quietened);
// infinities stay infinities. FloatToBf16 (for writers and tests) and
// FloatToFp16 (for clients) round to nearest even, as PyTorch does, keep NaN a
// NaN, and FloatToFp16 overflows to infinity.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/host_device.h"

namespace flashsampler {

FS_HOST_DEVICE FS_FORCE_INLINE float BitsToFloat(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

FS_HOST_DEVICE FS_FORCE_INLINE uint32_t FloatToBits(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return bits;
}

FS_HOST_DEVICE FS_FORCE_INLINE float Bf16ToFloat(uint16_t h) {
  return BitsToFloat(static_cast<uint32_t>(h) << 16);
}

FS_HOST_DEVICE FS_FORCE_INLINE uint16_t FloatToBf16(float f) {
  uint32_t bits = FloatToBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a (quiet) NaN
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);  // round half to even
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

FS_HOST_DEVICE FS_FORCE_INLINE float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {  // inf or NaN
    return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0) {  // normal: rebias 15 -> 127
    return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }
  if (mantissa == 0) return BitsToFloat(sign);  // signed zero
  // Subnormal: value = mantissa * 2^-24, exact in fp32.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

// IEEE binary16 from fp32, round to nearest even; overflow becomes inf.
FS_HOST_DEVICE FS_FORCE_INLINE uint16_t FloatToFp16(float f) {
  uint32_t x = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u;           // NaN
  if (x >= 0x477ff000u) return sign | 0x7c00u;          // rounds to >= 65520: inf
  if (x < 0x38800000u) {                                // below 2^-14: subnormal or zero
    if (x < 0x33000000u) return sign;                   // below 2^-25: rounds to zero
    const uint32_t exponent = x >> 23;
    const uint32_t mantissa = (x & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;              // 14..24
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  // Normal: rebias 127 -> 15 and round the 13 dropped bits to nearest even.
  uint32_t half = ((x >> 13) - (112u << 10));
  const uint32_t rest = x & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

}  // namespace flashsampler
