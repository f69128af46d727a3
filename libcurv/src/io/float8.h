// Decoding of the two 8-bit float formats safetensors stores (F8_E4M3, F8_E5M2) into float32.
#pragma once

#include <array>

namespace curv {

using Float8Table = std::array<float, 256>;

// The float32 value of each of the 256 codes of E4M3 "fn" (e4m3 = true: bias 7, no infinities,
// S.1111.111 the only NaN) or E5M2 (IEEE-754 layout, bias 15), built once: decoding is then one
// load per element.
const Float8Table& float8_table(bool e4m3);

}  // namespace curv
