#include "curv/analysis/spectrum.h"

#include <Spectra/SymEigsSolver.h>
#include <fmt/format.h>

#include <Eigen/Eigenvalues>
#include <Eigen/QR>
#include <algorithm>
#include <chrono>
#include <cmath>
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

// Random vectors from SplitMix64, so a seed gives the same probes with every standard library.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  double rademacher() { return (splitmix64(state_) >> 63) ? 1.0 : -1.0; }
  double uniform_open() {  // in (0, 1)
    return (static_cast<double>(splitmix64(state_) >> 11) + 0.5) * 0x1.0p-53;
  }
  double gaussian() {  // Box–Muller
    const double r = std::sqrt(-2.0 * std::log(uniform_open()));
    return r * std::cos(2.0 * M_PI * uniform_open());
  }
  Eigen::VectorXd rademacher(int64_t n) {
    Eigen::VectorXd v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = rademacher();
    return v;
  }
  Eigen::VectorXd gaussian(int64_t n) {
    Eigen::VectorXd v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = gaussian();
    return v;
  }

 private:
  uint64_t state_;
};

Eigen::VectorXd apply(LinearOperator& op, const Eigen::VectorXd& x) {
  Eigen::VectorXd y(op.rows());
  op.apply(x.data(), y.data());
  if (!y.allFinite()) {
    throw NumericalError(
        fmt::format("operator product holds NaN or Inf (input norm {:.6g}): is the loss twice "
                    "differentiable at these parameters?",
                    x.norm()));
  }
  return y;
}

// Lanczos tridiagonalisation with full reorthogonalisation (two Gram–Schmidt passes, which keep
// the basis orthonormal to working precision, so no spurious copies of converged Ritz values
// appear). T has diagonal alpha and off-diagonal beta[0..m-2]; beta[m-1] couples to the next,
// not yet formed vector and gives the residual estimates.
struct Krylov {
  std::vector<Eigen::VectorXd> q;
  std::vector<double> alpha, beta;
  bool invariant = false;  // the Krylov space is invariant: its Ritz pairs are exact
};

// Runs until `max_steps` steps, an invariant subspace, or `stop(krylov)` returns true after a step.
template <class Stop>
void lanczos(LinearOperator& op, Eigen::VectorXd start, int64_t max_steps, Krylov& k, Stop stop) {
  const int64_t n = op.rows();
  max_steps = std::min(max_steps, n);
  const double start_norm = start.norm();
  if (!(start_norm > 0)) throw InvalidArgument("Lanczos: start vector is zero");
  k.q.push_back(start / start_norm);
  double scale = 0.0;  // largest |α| or β seen: what "negligibly small β" is relative to
  for (int64_t j = 0; j < max_steps; ++j) {
    Eigen::VectorXd w = apply(op, k.q[j]);
    const double a = k.q[j].dot(w);
    w -= a * k.q[j];
    if (j > 0) w -= k.beta[j - 1] * k.q[j - 1];
    for (int pass = 0; pass < 2; ++pass) {
      for (const auto& q : k.q) w -= q.dot(w) * q;
    }
    const double b = w.norm();
    k.alpha.push_back(a);
    k.beta.push_back(b);
    scale = std::max({scale, std::abs(a), b});
    // A full-dimensional Krylov space is invariant too; its last β is rounding noise.
    k.invariant = b <= 1e-12 * scale || j + 1 == n;
    if (stop(k) || k.invariant) return;
    if (j + 1 < max_steps) k.q.push_back(w / b);
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
    const double norm = p.vector.norm();
    if (!(norm > 0)) continue;
    Eigen::VectorXd v = p.vector / norm;
    p.residual = (apply(op, v) - p.value * v).norm();
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
  lanczos(op, rng.gaussian(n), o.max_hvps, k, [&](const Krylov& kr) {
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
      p.vector = Eigen::VectorXd::Zero(n);
      for (int64_t l = 0; l < m; ++l) p.vector += s(l, i) * k.q[l];
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
  const Eigen::VectorXd start = rng.gaussian(n);
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
    solver.init(start.data());
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
      p.vector = vectors.col(i);
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
  std::vector<Eigen::VectorXd> found;
  bool converged = true;
  int64_t spent = 0;
  for (int64_t pair = 0; pair < std::min(o.top, n); ++pair) {
    Eigen::VectorXd v = rng.gaussian(n);
    v /= v.norm();
    double value = std::numeric_limits<double>::quiet_NaN();
    bool stopped = false;
    while (spent < o.max_hvps) {
      // Deflation as PyHessian does it: project out the pairs already found, every iteration.
      for (const auto& f : found) v -= f.dot(v) * f;
      v /= v.norm();
      Eigen::VectorXd hv = apply(op, v);
      ++spent;
      ++result.iterations;
      const double rayleigh = v.dot(hv);
      if (pair == 0) result.largest_history.push_back(rayleigh);
      const double hv_norm = hv.norm();
      if (hv_norm > 0) v = hv / hv_norm;
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
      for (auto& p : *pairs) p.vector = Eigen::VectorXd();
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
      const Eigen::VectorXd z = rng.rademacher(n);
      samples.push_back(z.dot(apply(op, z)));
    }
    result.matvecs = options.matvecs;
  } else {
    // Meyer, Musco, Musco & Woodruff (2021): k = m/3 sketch columns, k products for Q's
    // quadratic form, the remaining m − 2k for Hutchinson on (I − QQᵀ)A(I − QQᵀ).
    const int64_t k = std::min(options.matvecs / 3, n);
    const int64_t r = options.matvecs - 2 * k;
    Eigen::MatrixXd y(n, k);
    for (int64_t j = 0; j < k; ++j) y.col(j) = apply(op, rng.rademacher(n));
    Eigen::HouseholderQR<Eigen::MatrixXd> qr(y);
    const Eigen::MatrixXd q = qr.householderQ() * Eigen::MatrixXd::Identity(n, k);
    y.resize(0, 0);
    for (int64_t j = 0; j < k; ++j) {
      const Eigen::VectorXd qj = q.col(j);
      exact_part += qj.dot(apply(op, qj));
    }
    for (int64_t i = 0; i < r; ++i) {
      Eigen::VectorXd g = rng.rademacher(n);
      g -= q * (q.transpose() * g);
      samples.push_back(g.dot(apply(op, g)));
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
    lanczos(op, rng.rademacher(n), result.steps, k, [](const Krylov&) { return false; });
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
