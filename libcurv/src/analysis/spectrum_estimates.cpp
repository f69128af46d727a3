// Trace estimators (Hutchinson, Hutch++) and the spectral density by stochastic Lanczos
// quadrature, on any LinearOperator, with their vectors on the operator's device.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "analysis/krylov.h"
#include "curv/analysis/spectrum.h"
#include "curv/core/error.h"

namespace curv {

using namespace krylov;

TraceMethod parse_trace_method(const std::string& text) {
  if (text == "hutchinson") return TraceMethod::kHutchinson;
  if (text == "hutchpp") return TraceMethod::kHutchPlusPlus;
  throw InvalidArgument(fmt::format("trace method '{}': expected hutchinson or hutchpp", text));
}

std::string to_string(TraceMethod method) {
  return method == TraceMethod::kHutchinson ? "hutchinson" : "hutchpp";
}

void TraceOptions::validate() const {
  if (method == TraceMethod::kHutchPlusPlus && basis == KrylovBasis::kNone) {
    throw InvalidOption("{0}: Hutch++ keeps its sketch and basis; give device or host",
                        {{"TraceOptions.basis", "none"}});
  }
  const int64_t least = method == TraceMethod::kHutchinson ? 2 : 6;
  if (matvecs < least) {
    throw InvalidOption(fmt::format("{{0}} must be >= {} for {}", least, to_string(method)),
                        {{"TraceOptions.matvecs", fmt::format("{}", matvecs)}});
  }
}

std::string TraceResult::brief() const {
  return fmt::format("{} trace {:.8g} ± {:.3g} (SE, {} matvecs)", to_string(method), estimate,
                     standard_error, matvecs);
}

TraceResult estimate_trace(LinearOperator& op, const TraceOptions& options) {
  options.validate();
  const auto start = Clock::now();
  const int64_t n = op.rows();
  Random rng(options.seed);
  TraceResult result;
  result.method = options.method;
  std::vector<double> samples;
  double exact_part = 0.0;
  if (options.method == TraceMethod::kHutchinson) {
    for (int64_t i = 0; i < options.matvecs; ++i) {
      const at::Tensor z = rng.rademacher(n, vector_options(op));
      samples.push_back(dot_value(z, apply(op, z)));
    }
    result.matvecs = options.matvecs;
  } else {
    // Meyer, Musco, Musco & Woodruff (2021): k = m/3 sketch columns, k products for Q's
    // quadratic form, the remaining m − 2k for Hutchinson on (I − QQᵀ)A(I − QQᵀ).
    const int64_t k = std::min(options.matvecs / 3, n);
    const int64_t r = options.matvecs - 2 * k;
    const at::TensorOptions device = vector_options(op);
    const at::TensorOptions store = basis_options(op, options.basis);
    // Yᵀ, k × n: each product is one contiguous row, and Y = Yᵀ.t() is the column-major matrix
    // LAPACK's QR takes.
    at::Tensor yt = at::empty({k, n}, store);
    for (int64_t j = 0; j < k; ++j) yt.select(0, j).copy_(apply(op, rng.rademacher(n, device)));
    // Q: an orthonormal basis of range(Y), n × k (Householder QR; column signs do not matter),
    // where Y is.
    // LAPACK has no 16-bit QR: a 16-bit sketch is factored in float32.
    const at::Tensor y = yt.t();
    const at::Tensor q =
        std::get<0>(at::linalg_qr(is_16_bit(y.scalar_type()) ? y.to(at::kFloat) : y));
    yt = at::Tensor();
    for (int64_t j = 0; j < k; ++j) {
      const at::Tensor qj = moved(q.select(1, j).contiguous(), device).to(op.dtype());
      exact_part += dot_value(qj, apply(op, qj));
    }
    for (int64_t i = 0; i < r; ++i) {
      at::Tensor g = rng.rademacher(n, device);
      const at::Tensor gs = moved(g, store).to(q.scalar_type());
      g.sub_(moved(at::mv(q, at::mv(q.t(), gs)), device));
      samples.push_back(dot_value(g, apply(op, g)));
    }
    result.sketch_rank = k;
    result.matvecs = 2 * k + r;
  }
  result.samples = static_cast<int64_t>(samples.size());
  result.estimate = exact_part + mean_of(samples);
  result.standard_error = sample_std(samples) / std::sqrt(static_cast<double>(samples.size()));
  result.seconds = seconds_since(start);
  return result;
}

void DensityOptions::validate() const {
  if (runs < 1)
    throw InvalidOption("{0} must be >= 1", {{"DensityOptions.runs", fmt::format("{}", runs)}});
  if (steps < 1)
    throw InvalidOption("{0} must be >= 1", {{"DensityOptions.steps", fmt::format("{}", steps)}});
  if (!(sigma >= 0) || !std::isfinite(sigma))
    throw InvalidOption("{0} must be finite and >= 0",
                        {{"DensityOptions.sigma", fmt::format("{}", sigma)}});
  if (grid < 2)
    throw InvalidOption("{0} must be >= 2", {{"DensityOptions.grid", fmt::format("{}", grid)}});
}

double DensityResult::moment(int k) const {
  double total = 0.0;
  for (int64_t r = 0; r < runs; ++r) {
    for (int64_t j = 0; j < steps; ++j) {
      total += weights[r * steps + j] * std::pow(nodes[r * steps + j], k);
    }
  }
  return total / static_cast<double>(runs);
}

std::string DensityResult::brief() const {
  return fmt::format("SLQ {} runs × {} steps, σ = {:.4g}, trace {:.8g} ± {:.3g} (SE, {} HVPs)",
                     runs, steps, sigma, trace, trace_standard_error, hvps);
}

DensityResult spectral_density(LinearOperator& op, const DensityOptions& options) {
  options.validate();
  const auto start = Clock::now();
  const int64_t n = op.rows();
  Random rng(options.seed);
  DensityResult result;
  result.runs = options.runs;
  result.steps = std::min(options.steps, n);
  result.nodes.assign(result.runs * result.steps, 0.0);
  result.weights.assign(result.runs * result.steps, 0.0);
  std::vector<double> traces;
  const int64_t before = op.num_applies();
  for (int64_t r = 0; r < result.runs; ++r) {
    Krylov k;
    lanczos(op, rng.rademacher(n, vector_options(op)), result.steps, options.basis, k,
            [](const Krylov&) { return false; });
    auto eig = tridiagonal_eigen(k, true);
    const int64_t m = eig.eigenvalues().size();
    double trace = 0.0;
    for (int64_t j = 0; j < m; ++j) {
      const double theta = eig.eigenvalues()[j];
      const double tau = eig.eigenvectors()(0, j);
      result.nodes[r * result.steps + j] = theta;
      result.weights[r * result.steps + j] = tau * tau;
      trace += tau * tau * theta;
    }
    // Padding of a run stopped early by an invariant subspace: weight 0 at its last node.
    for (int64_t j = m; j < result.steps; ++j) {
      result.nodes[r * result.steps + j] = eig.eigenvalues()[m - 1];
    }
    traces.push_back(static_cast<double>(n) * trace);
  }
  result.hvps = op.num_applies() - before;
  result.trace = mean_of(traces);
  result.trace_standard_error = sample_std(traces) / std::sqrt(static_cast<double>(traces.size()));
  const auto [lo_it, hi_it] = std::minmax_element(result.nodes.begin(), result.nodes.end());
  const double lo = *lo_it, hi = *hi_it;
  result.sigma =
      options.sigma > 0 ? options.sigma : 0.01 * std::max(hi - lo, std::max(std::abs(hi), 1e-12));
  const double a = lo - 5 * result.sigma, b = hi + 5 * result.sigma;
  result.grid.resize(options.grid);
  result.density.assign(options.grid, 0.0);
  const double norm = 1.0 / (result.sigma * std::sqrt(2 * M_PI) * result.runs);
  for (int64_t g = 0; g < options.grid; ++g) {
    const double t = a + (b - a) * g / (options.grid - 1);
    result.grid[g] = t;
    double sum = 0.0;
    for (size_t i = 0; i < result.nodes.size(); ++i) {
      if (result.weights[i] == 0.0) continue;
      const double z = (t - result.nodes[i]) / result.sigma;
      sum += result.weights[i] * std::exp(-0.5 * z * z);
    }
    result.density[g] = sum * norm;
  }
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace curv
