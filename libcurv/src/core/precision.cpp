#include "curv/core/precision.h"

#include <ATen/Context.h>
#include <fmt/format.h>

#include <cmath>

#include "curv/core/engine.h"
#include "curv/core/error.h"

namespace curv {

MatmulPrecision parse_matmul_precision(const std::string& text) {
  if (text == "highest") return MatmulPrecision::kHighest;
  if (text == "high") return MatmulPrecision::kHigh;
  if (text == "medium") return MatmulPrecision::kMedium;
  throw InvalidArgument(
      fmt::format("matmul precision '{}': expected highest, high or medium", text));
}

std::string to_string(MatmulPrecision precision) {
  switch (precision) {
    case MatmulPrecision::kHighest:
      return "highest";
    case MatmulPrecision::kHigh:
      return "high";
    case MatmulPrecision::kMedium:
      return "medium";
  }
  return "?";
}

void set_matmul_precision(MatmulPrecision precision) {
  at::globalContext().setFloat32MatmulPrecision(to_string(precision));
}

MatmulPrecision matmul_precision() {
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGHEST:
      return MatmulPrecision::kHighest;
    case at::Float32MatmulPrecision::HIGH:
      return MatmulPrecision::kHigh;
    case at::Float32MatmulPrecision::MEDIUM:
      return MatmulPrecision::kMedium;
  }
  return MatmulPrecision::kHighest;
}

ScopedMatmulPrecision::ScopedMatmulPrecision(MatmulPrecision precision)
    : before_(matmul_precision()) {
  set_matmul_precision(precision);
}

ScopedMatmulPrecision::~ScopedMatmulPrecision() { set_matmul_precision(before_); }

namespace {

double relative(double got, double want) {
  return want != 0.0 ? std::abs(got - want) / std::abs(want) : std::abs(got - want);
}

double relative(const ParamVector& got, const ParamVector& want) {
  const double reference = norm(want);
  const double difference = norm(sub(got, want));
  return reference > 0 ? difference / reference : difference;
}

struct Measured {
  double loss = 0.0, curvature = 0.0;
  ParamVector gradient, hvp;
};

Measured measure(CurvatureEngine& engine, MatmulPrecision precision, const ParamVector* along) {
  ScopedMatmulPrecision scope(precision);
  CurvatureEngine one(engine.objective(), ProbeSet({engine.probe()[0]}));
  Measured m;
  m.loss = one.loss();
  m.gradient = clone(one.gradient());
  const ParamVector& v = along != nullptr ? *along : m.gradient;
  m.hvp = one.hvp(v);
  m.curvature = dot(v, m.hvp);
  return m;
}

}  // namespace

PrecisionError matmul_precision_error(CurvatureEngine& engine, MatmulPrecision reduced) {
  const Measured highest = measure(engine, MatmulPrecision::kHighest, nullptr);
  const Measured low = measure(engine, reduced, &highest.gradient);
  PrecisionError e;
  e.loss = relative(low.loss, highest.loss);
  e.gradient = relative(low.gradient, highest.gradient);
  e.hvp = relative(low.hvp, highest.hvp);
  e.curvature = relative(low.curvature, highest.curvature);
  return e;
}

}  // namespace curv
