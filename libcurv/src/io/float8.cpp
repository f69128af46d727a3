#include "io/float8.h"

#include <cmath>
#include <cstdint>
#include <limits>

namespace curv {

namespace {

// E4M3 "fn" variant (the one safetensors and torch.float8_e4m3fn mean): bias 7, no infinities,
// only S.1111.111 is NaN, so the largest finite value is 448.
float decode_e4m3(uint8_t bits) {
  const bool negative = bits & 0x80;
  const int exponent = (bits >> 3) & 0xF;
  const int mantissa = bits & 0x7;
  float value;
  if (exponent == 0xF && mantissa == 0x7) {
    value = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m/8 * 2^-6
  } else {
    value = std::ldexp(static_cast<float>(8 + mantissa), exponent - 7 - 3);
  }
  return negative ? -value : value;
}

// E5M2: IEEE-754 layout with bias 15, so exponent 31 means inf (mantissa 0) or NaN.
float decode_e5m2(uint8_t bits) {
  const bool negative = bits & 0x80;
  const int exponent = (bits >> 2) & 0x1F;
  const int mantissa = bits & 0x3;
  float value;
  if (exponent == 0x1F) {
    value = mantissa == 0 ? std::numeric_limits<float>::infinity()
                          : std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -16);  // subnormal: m/4 * 2^-14
  } else {
    value = std::ldexp(static_cast<float>(4 + mantissa), exponent - 15 - 2);
  }
  return negative ? -value : value;
}

template <float (*Decode)(uint8_t)>
Float8Table make_float8_table() {
  Float8Table table{};
  for (int code = 0; code < 256; ++code) table[code] = Decode(static_cast<uint8_t>(code));
  return table;
}

}  // namespace

const Float8Table& float8_table(bool e4m3) {
  static const Float8Table e4m3_table = make_float8_table<decode_e4m3>();
  static const Float8Table e5m2_table = make_float8_table<decode_e5m2>();
  return e4m3 ? e4m3_table : e5m2_table;
}

}  // namespace curv
