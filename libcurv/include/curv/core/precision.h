// Reduced precision for float32 matrix products, as torch.set_float32_matmul_precision sets it:
// on CUDA, "high" lets cuBLAS use TF32 tensor cores (inputs rounded to a 10-bit mantissa,
// float32 accumulation) and "medium" bfloat16 as well; float64 and (with these LibTorch builds)
// the CPU's products are unchanged. Opt-in and process-wide; the error it brings is measured
// where it is used (matmul_precision_error) and written beside the numbers.
#pragma once

#include <string>

namespace curv {

class CurvatureEngine;

enum class MatmulPrecision { kHighest, kHigh, kMedium };
MatmulPrecision parse_matmul_precision(const std::string& text);  // "highest" | "high" | "medium"
std::string to_string(MatmulPrecision precision);

void set_matmul_precision(MatmulPrecision precision);
MatmulPrecision matmul_precision();

// Sets a precision for its lifetime and restores the one before.
class ScopedMatmulPrecision {
 public:
  explicit ScopedMatmulPrecision(MatmulPrecision precision);
  ~ScopedMatmulPrecision();
  ScopedMatmulPrecision(const ScopedMatmulPrecision&) = delete;
  ScopedMatmulPrecision& operator=(const ScopedMatmulPrecision&) = delete;

 private:
  MatmulPrecision before_;
};

// Relative errors of `reduced` against kHighest on the engine's first probe batch at its current
// parameters: the loss, its gradient g, the HVP H g (along the highest-precision g) and the
// curvature gᵀHg, each |reduced − highest| / |highest| (norms for vectors). One gradient and one
// HVP in each precision, on an engine of its own (the engine's counters and caches untouched).
struct PrecisionError {
  double loss = 0.0, gradient = 0.0, hvp = 0.0, curvature = 0.0;
};
PrecisionError matmul_precision_error(CurvatureEngine& engine, MatmulPrecision reduced);

}  // namespace curv
