#include "curv/analysis/spectrum.h"

#include <ATen/ATen.h>
#include <Spectra/SymEigsSolver.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/splitmix.h"
#include "curv/core/error.h"
#include "curv/core/spectra_adapter.h"

namespace curv {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Random vectors from SplitMix64, so a seed gives the same probes with every standard library and
// on every device. The generator is counter-based (output k is a function of seed + k·γ), so a
// vector is made where it is used, on the operator's device, entry by entry equal to the scalar
// sequence: Rademacher signs exactly, Gaussians (Box–Muller) to the rounding of log and cos.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  at::Tensor rademacher(int64_t n, const at::TensorOptions& options) {
    at::Tensor out = at::empty({n}, options);
    for (int64_t begin = 0; begin < n; begin += kChunk) {
      const int64_t count = std::min(kChunk, n - begin);
      // The top bit set gives +1, clear −1.
      out.narrow(0, begin, count).copy_(next(count, options).lt(0).to(at::kDouble).mul_(2).sub_(1));
    }
    return out;
  }
  at::Tensor gaussian(int64_t n, const at::TensorOptions& options) {
    at::Tensor out = at::empty({n}, options);
    for (int64_t begin = 0; begin < n; begin += kChunk) {
      const int64_t count = std::min(kChunk, n - begin);
      // Uniforms in (0, 1) from the top 53 bits; two per value, the radius's first.
      const at::Tensor u = shift_right(next(2 * count, options), 11)
                               .to(at::kDouble)
                               .add_(0.5)
                               .mul_(0x1.0p-53)
                               .view({count, 2});
      const at::Tensor radius = u.select(1, 0).log().mul_(-2.0).sqrt_();
      out.narrow(0, begin, count).copy_(radius.mul_(u.select(1, 1).mul(2.0 * M_PI).cos_()));
    }
    return out;
  }

 private:
  static constexpr int64_t kChunk = int64_t{1} << 22;  // bounds the generator's scratch memory
  static constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;

  static int64_t bits(uint64_t value) {
    int64_t out;
    std::memcpy(&out, &value, sizeof out);
    return out;
  }
  // Logical (unsigned) right shift of int64 bit patterns.
  static at::Tensor shift_right(const at::Tensor& z, int k) {
    return z.__rshift__(k).bitwise_and_(bits((~uint64_t{0}) >> k));
  }
  // The next `count` outputs of splitmix64 as int64 bit patterns: int64 products and sums wrap
  // as the uint64 ones do.
  at::Tensor next(int64_t count, const at::TensorOptions& options) {
    at::Tensor z =
        at::arange(1, count + 1, options.dtype(at::kLong)).mul_(bits(kGamma)).add_(bits(state_));
    state_ += static_cast<uint64_t>(count) * kGamma;
    z = z.bitwise_xor(shift_right(z, 30)).mul_(bits(0xbf58476d1ce4e5b9ULL));
    z = z.bitwise_xor(shift_right(z, 27)).mul_(bits(0x94d049bb133111ebULL));
    return z.bitwise_xor(shift_right(z, 31));
  }

  uint64_t state_;
};

double dot_value(const at::Tensor& a, const at::Tensor& b) { return at::dot(a, b).item<double>(); }
double norm_value(const at::Tensor& a) { return a.norm().item<double>(); }

at::Tensor apply(LinearOperator& op, const at::Tensor& x) {
  at::Tensor y = op.apply(x);
  if (!at::isfinite(y).all().item<bool>()) {
    throw NumericalError(
        fmt::format("operator product holds NaN or Inf (input norm {:.6g}): is the loss twice "
                    "differentiable at these parameters?",
                    norm_value(x)));
  }
  return y;
}

// Lanczos tridiagonalisation with full reorthogonalisation (two Gram–Schmidt passes, which keep
// the basis orthonormal to working precision, so no spurious copies of converged Ritz values
// appear). T has diagonal alpha and off-diagonal beta[0..m-2]; beta[m-1] couples to the next,
// not yet formed vector and gives the residual estimates. The basis and the recurrence live on
// the operator's device, or on the host when the basis is spilled there.
struct Krylov {
  std::vector<at::Tensor> q;
  std::vector<double> alpha, beta;
  bool invariant = false;  // the Krylov space is invariant: its Ritz pairs are exact
};

at::TensorOptions basis_options(const LinearOperator& op, KrylovBasis where) {
  at::TensorOptions o = vector_options(op);
  if (where == KrylovBasis::kDevice) return o;
  return o.device(c10::kCPU).pinned_memory(op.device().is_cuda());
}

// A copy of `x` with `options` (device and pinning), or `x` itself when it already has them.
at::Tensor moved(const at::Tensor& x, const at::TensorOptions& options) {
  if (x.device() == options.device() && x.is_pinned() == options.pinned_memory()) return x;
  return at::empty(x.sizes(), options).copy_(x);
}

// Runs until `max_steps` steps, an invariant subspace, or `stop(krylov)` returns true after a step.
template <class Stop>
void lanczos(LinearOperator& op, const at::Tensor& start, int64_t max_steps, KrylovBasis where,
             Krylov& k, Stop stop) {
  const int64_t n = op.rows();
  const at::TensorOptions basis = basis_options(op, where), device = vector_options(op);
  max_steps = std::min(max_steps, n);
  const double start_norm = norm_value(start);
  if (!(start_norm > 0)) throw InvalidArgument("Lanczos: start vector is zero");
  k.q.push_back(moved(start / start_norm, basis));
  double scale = 0.0;  // largest |α| or β seen: what "negligibly small β" is relative to
  for (int64_t j = 0; j < max_steps; ++j) {
    at::Tensor w = moved(apply(op, moved(k.q[j], device)), basis);
    const double a = dot_value(k.q[j], w);
    w.sub_(k.q[j], a);
    if (j > 0) w.sub_(k.q[j - 1], k.beta[j - 1]);
    for (int pass = 0; pass < 2; ++pass) {
      // w −= (qᵀw) q with the coefficient left on the device: no synchronisation per vector.
      for (const auto& q : k.q) w.addcmul_(q, at::dot(q, w), -1);
    }
    const double b = norm_value(w);
    k.alpha.push_back(a);
    k.beta.push_back(b);
    scale = std::max({scale, std::abs(a), b});
    // A full-dimensional Krylov space is invariant too; its last β is rounding noise.
    k.invariant = b <= 1e-12 * scale || j + 1 == n;
    if (stop(k) || k.invariant) return;
    if (j + 1 < max_steps) k.q.push_back(w.div_(b));
  }
}

// Eigen-decomposition of the current tridiagonal T_m (ascending eigenvalues).
Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> tridiagonal_eigen(const Krylov& k, bool vectors) {
  const int64_t m = static_cast<int64_t>(k.alpha.size());
  Eigen::VectorXd diag = Eigen::Map<const Eigen::VectorXd>(k.alpha.data(), m);
  Eigen::VectorXd sub =
      m > 1 ? Eigen::VectorXd(Eigen::Map<const Eigen::VectorXd>(k.beta.data(), m - 1))
            : Eigen::VectorXd();
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig;
  eig.computeFromTridiagonal(diag, sub,
                             vectors ? Eigen::ComputeEigenvectors : Eigen::EigenvaluesOnly);
  return eig;
}

// Residual ‖Ay − θy‖ of Ritz pair i of T_m, from the Lanczos relation: |β_m · s_{m,i}|.
double lanczos_residual(const Krylov& k, const Eigen::MatrixXd& s, int64_t i) {
  return k.invariant ? 0.0 : std::abs(k.beta.back() * s(s.rows() - 1, i));
}

// Bound on |θ_i − λ| for Ritz value i of the ascending `theta`, whose residual is r.
double error_bound(const Eigen::VectorXd& theta, int64_t i, double r, ErrorBound kind) {
  if (kind == ErrorBound::kResidual || r == 0.0) return r;
  double gap = std::numeric_limits<double>::infinity();
  if (i > 0) gap = std::min(gap, theta[i] - theta[i - 1]);
  if (i + 1 < theta.size()) gap = std::min(gap, theta[i + 1] - theta[i]);
  gap -= r;
  return gap > 0 ? std::min(r, r * r / gap) : r;
}

bool ritz_converged(double theta, double bound, double tol, double scale) {
  // The floor keeps eigenvalues near zero from demanding a bound below rounding.
  const double floor = std::pow(std::numeric_limits<double>::epsilon(), 2.0 / 3.0) * scale;
  return bound <= tol * std::max(std::abs(theta), floor);
}

void measure_residuals(LinearOperator& op, std::vector<RitzPair>& pairs, EigenResult& result) {
  for (auto& p : pairs) {
    if (!p.vector.defined()) continue;
    const double length = norm_value(p.vector);
    if (!(length > 0)) continue;
    const at::Tensor v = p.vector / length;
    p.residual = norm_value(apply(op, v).sub_(v, p.value));
    ++result.residual_hvps;
  }
}

EigenResult solve_lanczos(LinearOperator& op, const EigenOptions& o) {
  EigenResult result;
  const int64_t n = op.rows();
  const int64_t top = std::min(o.top, n), bottom = std::min(o.bottom, n);
  Random rng(o.seed);
  Krylov k;
  bool converged = false;
  lanczos(op, rng.gaussian(n, vector_options(op)), o.max_hvps, o.basis, k, [&](const Krylov& kr) {
    const int64_t m = static_cast<int64_t>(kr.alpha.size());
    auto eig = tridiagonal_eigen(kr, true);
    const Eigen::VectorXd& theta = eig.eigenvalues();
    result.largest_history.push_back(theta[m - 1]);
    result.smallest_history.push_back(theta[0]);
    if (kr.invariant) {
      converged = true;
      return true;
    }
    // Wait for enough Ritz values that the top and bottom sets do not overlap.
    if (m < std::max<int64_t>(top + bottom, 1) + 1) return false;
    const double scale = std::max(std::abs(theta[0]), std::abs(theta[m - 1]));
    const Eigen::MatrixXd& s = eig.eigenvectors();
    auto converged_at = [&](int64_t i) {
      return ritz_converged(theta[i], error_bound(theta, i, lanczos_residual(kr, s, i), o.bound),
                            o.tol, scale);
    };
    for (int64_t i = 0; i < top; ++i) {
      if (!converged_at(m - 1 - i)) return false;
    }
    for (int64_t i = 0; i < bottom; ++i) {
      if (!converged_at(i)) return false;
    }
    converged = true;
    return true;
  });
  const int64_t m = static_cast<int64_t>(k.alpha.size());
  result.hvps = m;
  result.iterations = m;
  result.status = converged ? EigenStatus::kConverged : EigenStatus::kNotConverging;
  if (k.invariant) {
    result.message = fmt::format("Krylov space invariant after {} steps: Ritz pairs are exact", m);
  } else if (converged) {
    result.message = fmt::format(
        "all requested Ritz pairs within tol {:g} ({} bound) after {} "
        "steps",
        o.tol, to_string(o.bound), m);
  } else {
    result.message =
        fmt::format("HVP budget {} spent before convergence to tol {:g}", o.max_hvps, o.tol);
  }
  auto eig = tridiagonal_eigen(k, true);
  const Eigen::VectorXd& theta = eig.eigenvalues();
  const Eigen::MatrixXd& s = eig.eigenvectors();
  auto pair = [&](int64_t i) {
    RitzPair p;
    p.value = theta[i];
    p.residual = lanczos_residual(k, s, i);
    p.error_bound = error_bound(theta, i, p.residual, o.bound);
    if (o.keep_vectors || o.check_residuals) {
      at::Tensor v = at::zeros({n}, k.q[0].options());
      for (int64_t l = 0; l < m; ++l) v.add_(k.q[l], s(l, i));
      p.vector = moved(v, vector_options(op));
    }
    return p;
  };
  for (int64_t i = 0; i < std::min(top, m); ++i) result.largest.push_back(pair(m - 1 - i));
  for (int64_t i = 0; i < std::min(bottom, m); ++i) result.smallest.push_back(pair(i));
  return result;
}

EigenResult solve_spectra(LinearOperator& op, const EigenOptions& o) {
  EigenResult result;
  const int64_t n = op.rows();
  SpectraOperator adapter(op);
  Random rng(o.seed);
  const at::Tensor start = rng.gaussian(n, at::TensorOptions().dtype(at::kDouble));
  const int64_t before = op.num_applies();
  bool all_converged = true;
  bool numerical_issue = false;
  std::vector<std::string> notes;
  auto solve = [&](int64_t nev, Spectra::SortRule rule, std::vector<RitzPair>& out) {
    // Spectra needs nev < ncv <= n: an operator of n rows gives at most n − 1 pairs per end.
    nev = std::min(nev, n - 1);
    if (nev <= 0) return;
    const int64_t ncv = std::min(n, o.ncv > 0 ? o.ncv : std::max<int64_t>(2 * nev + 1, 20));
    if (ncv <= nev) {
      throw InvalidArgument(
          fmt::format("--eig-ncv {} must exceed the number of eigenvalues {}", ncv, nev));
    }
    const int64_t spent = op.num_applies() - before;
    // The first factorisation costs ncv products, each restart about ncv − nev more.
    const int64_t budget = std::max<int64_t>(o.max_hvps - spent, ncv);
    const int64_t maxit =
        std::max<int64_t>(1, (budget - ncv) / std::max<int64_t>(ncv - nev, 1) + 1);
    Spectra::SymEigsSolver<SpectraOperator> solver(adapter, nev, ncv);
    solver.init(start.data_ptr<double>());
    const Eigen::Index nconv = solver.compute(rule, maxit, o.tol, rule);
    result.iterations += solver.num_iterations();
    if (solver.info() != Spectra::CompInfo::Successful) {
      all_converged = false;
      numerical_issue = numerical_issue || solver.info() == Spectra::CompInfo::NumericalIssue;
      notes.push_back(
          fmt::format("{} of {} converged after {} restarts", nconv, nev, solver.num_iterations()));
    }
    if (nconv == 0) return;
    const Eigen::VectorXd values = solver.eigenvalues();
    const Eigen::MatrixXd vectors = solver.eigenvectors();
    for (Eigen::Index i = 0; i < values.size(); ++i) {
      RitzPair p;
      p.value = values[i];
      const Eigen::VectorXd column = vectors.col(i);
      p.vector = at::from_blob(const_cast<double*>(column.data()), {n}, at::kDouble)
                     .to(op.device(), false, /*copy=*/true);
      p.residual = std::numeric_limits<double>::quiet_NaN();  // Spectra does not expose it
      p.error_bound = std::numeric_limits<double>::quiet_NaN();
      out.push_back(std::move(p));
    }
  };
  solve(o.top, Spectra::SortRule::LargestAlge, result.largest);
  solve(o.bottom, Spectra::SortRule::SmallestAlge, result.smallest);
  result.hvps = op.num_applies() - before;
  result.status = all_converged     ? EigenStatus::kConverged
                  : numerical_issue ? EigenStatus::kNumericalIssue
                                    : EigenStatus::kNotConverging;
  result.message = all_converged
                       ? fmt::format("converged to tol {:g} with {} HVPs", o.tol, result.hvps)
                       : fmt::format("not converged within the budget: {}", fmt::join(notes, "; "));
  return result;
}

EigenResult solve_power(LinearOperator& op, const EigenOptions& o) {
  EigenResult result;
  const int64_t n = op.rows();
  Random rng(o.seed);
  std::vector<at::Tensor> found;
  bool converged = true;
  int64_t spent = 0;
  for (int64_t pair = 0; pair < std::min(o.top, n); ++pair) {
    at::Tensor v = rng.gaussian(n, vector_options(op));
    v.div_(norm_value(v));
    double value = std::numeric_limits<double>::quiet_NaN();
    bool stopped = false;
    while (spent < o.max_hvps) {
      // Deflation as PyHessian does it: project out the pairs already found, every iteration.
      for (const auto& f : found) v.sub_(f, dot_value(f, v));
      v.div_(norm_value(v));
      at::Tensor hv = apply(op, v);
      ++spent;
      ++result.iterations;
      const double rayleigh = dot_value(v, hv);
      if (pair == 0) result.largest_history.push_back(rayleigh);
      const double hv_norm = norm_value(hv);
      if (hv_norm > 0) v = hv.div_(hv_norm);
      if (std::isfinite(value) && std::abs(value - rayleigh) / (std::abs(value) + 1e-6) < o.tol) {
        value = rayleigh;
        stopped = true;
        break;
      }
      value = rayleigh;
      if (!(hv_norm > 0)) break;
    }
    if (!stopped) converged = false;
    if (!std::isfinite(value)) break;  // budget spent before this pair got one product
    RitzPair p;
    p.value = value;
    p.vector = v;
    p.residual = std::numeric_limits<double>::quiet_NaN();
    p.error_bound = std::numeric_limits<double>::quiet_NaN();  // power iteration bounds nothing
    found.push_back(v);
    result.dominant.push_back(std::move(p));
  }
  result.hvps = spent;
  result.status = converged ? EigenStatus::kConverged : EigenStatus::kNotConverging;
  result.message =
      converged ? fmt::format("relative change below {:g} for every pair ({} HVPs)", o.tol, spent)
                : fmt::format("HVP budget {} spent before the relative change fell below {:g}",
                              o.max_hvps, o.tol);
  return result;
}

double sample_std(const std::vector<double>& x) {
  if (x.size() < 2) return std::numeric_limits<double>::quiet_NaN();
  const double mean = std::accumulate(x.begin(), x.end(), 0.0) / x.size();
  double ss = 0.0;
  for (double v : x) ss += (v - mean) * (v - mean);
  return std::sqrt(ss / (x.size() - 1));
}

double mean_of(const std::vector<double>& x) {
  return std::accumulate(x.begin(), x.end(), 0.0) / static_cast<double>(x.size());
}

}  // namespace

KrylovBasis parse_krylov_basis(const std::string& text) {
  if (text == "device") return KrylovBasis::kDevice;
  if (text == "host") return KrylovBasis::kHost;
  throw InvalidArgument(fmt::format("Krylov basis '{}': expected device or host", text));
}

std::string to_string(KrylovBasis basis) {
  return basis == KrylovBasis::kDevice ? "device" : "host";
}

EigenMethod parse_eigen_method(const std::string& text) {
  if (text == "lanczos") return EigenMethod::kLanczos;
  if (text == "spectra") return EigenMethod::kSpectra;
  if (text == "power") return EigenMethod::kPower;
  throw InvalidArgument(fmt::format("eigen method '{}': expected lanczos, spectra or power", text));
}

ErrorBound parse_error_bound(const std::string& text) {
  if (text == "residual") return ErrorBound::kResidual;
  if (text == "gap") return ErrorBound::kGap;
  throw InvalidArgument(fmt::format("error bound '{}': expected residual or gap", text));
}

std::string to_string(ErrorBound bound) {
  return bound == ErrorBound::kResidual ? "residual" : "gap";
}

std::string to_string(EigenMethod method) {
  switch (method) {
    case EigenMethod::kLanczos:
      return "lanczos";
    case EigenMethod::kSpectra:
      return "spectra";
    case EigenMethod::kPower:
      return "power";
  }
  return "?";
}

void EigenOptions::validate() const {
  if (top < 0)
    throw InvalidOption("{0} must be >= 0", {{"EigenOptions.top", fmt::format("{}", top)}});
  if (bottom < 0)
    throw InvalidOption("{0} must be >= 0", {{"EigenOptions.bottom", fmt::format("{}", bottom)}});
  if (top + bottom == 0)
    throw InvalidOption("{0}: top = bottom = 0 asks for nothing", {{"EigenOptions", ""}});
  if (!(tol > 0 && tol < 1))
    throw InvalidOption("{0} must be in (0, 1)", {{"EigenOptions.tol", fmt::format("{}", tol)}});
  if (max_hvps < 2)
    throw InvalidOption("{0} must be >= 2",
                        {{"EigenOptions.max_hvps", fmt::format("{}", max_hvps)}});
  if (ncv < 0)
    throw InvalidOption("{0} must be >= 0", {{"EigenOptions.ncv", fmt::format("{}", ncv)}});
  if (method == EigenMethod::kPower && bottom > 0) {
    throw InvalidOption(
        "{0}: power iteration finds the largest |λ| only; use the lanczos or spectra method",
        {{"EigenOptions.bottom", fmt::format("{}", bottom)}});
  }
}

std::string to_string(EigenStatus status) {
  switch (status) {
    case EigenStatus::kNotComputed:
      return "not_computed";
    case EigenStatus::kConverged:
      return "converged";
    case EigenStatus::kNotConverging:
      return "not_converging";
    case EigenStatus::kNumericalIssue:
      return "numerical_issue";
  }
  return "unknown";
}

std::string EigenResult::brief() const {
  auto values = [](const std::vector<RitzPair>& pairs) {
    std::vector<std::string> parts;
    for (const auto& p : pairs) parts.push_back(fmt::format("{:.8g}", p.value));
    return fmt::format("[{}]", fmt::join(parts, ", "));
  };
  std::string out = fmt::format("{} {}: ", to_string(method), to_string(status));
  if (!largest.empty()) out += "largest " + values(largest) + " ";
  if (!smallest.empty()) out += "smallest " + values(smallest) + " ";
  if (!dominant.empty()) out += "dominant " + values(dominant) + " ";
  out += fmt::format("({} HVPs + {} for residuals, {:.3g} s)", hvps, residual_hvps, seconds);
  return out;
}

EigenResult extreme_eigenpairs(LinearOperator& op, const EigenOptions& options) {
  options.validate();
  if (op.rows() < 1) throw InvalidArgument("extreme_eigenpairs: operator has no rows");
  const auto start = Clock::now();
  EigenResult result;
  switch (options.method) {
    case EigenMethod::kLanczos:
      result = solve_lanczos(op, options);
      break;
    case EigenMethod::kSpectra:
      result = solve_spectra(op, options);
      break;
    case EigenMethod::kPower:
      result = solve_power(op, options);
      break;
  }
  result.method = options.method;
  if (options.check_residuals) {
    measure_residuals(op, result.largest, result);
    measure_residuals(op, result.smallest, result);
    measure_residuals(op, result.dominant, result);
    result.residuals_measured = true;
  }
  if (!options.keep_vectors) {
    for (auto* pairs : {&result.largest, &result.smallest, &result.dominant})
      for (auto& p : *pairs) p.vector = at::Tensor();
  }
  result.seconds = seconds_since(start);
  return result;
}

TraceMethod parse_trace_method(const std::string& text) {
  if (text == "hutchinson") return TraceMethod::kHutchinson;
  if (text == "hutchpp") return TraceMethod::kHutchPlusPlus;
  throw InvalidArgument(fmt::format("trace method '{}': expected hutchinson or hutchpp", text));
}

std::string to_string(TraceMethod method) {
  return method == TraceMethod::kHutchinson ? "hutchinson" : "hutchpp";
}

void TraceOptions::validate() const {
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
    const at::TensorOptions options = vector_options(op);
    at::Tensor y = at::empty({n, k}, options);
    for (int64_t j = 0; j < k; ++j) y.select(1, j).copy_(apply(op, rng.rademacher(n, options)));
    // Q: an orthonormal basis of range(Y), n × k (Householder QR; column signs do not matter).
    const at::Tensor q = std::get<0>(at::linalg_qr(y));
    y = at::Tensor();
    for (int64_t j = 0; j < k; ++j) {
      const at::Tensor qj = q.select(1, j).contiguous();
      exact_part += dot_value(qj, apply(op, qj));
    }
    for (int64_t i = 0; i < r; ++i) {
      at::Tensor g = rng.rademacher(n, options);
      g.sub_(at::mv(q, at::mv(q.t(), g)));
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
