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

#include "analysis/krylov.h"
#include "curv/core/error.h"
#include "curv/core/spectra_adapter.h"

namespace curv {

namespace {

using namespace krylov;

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
    // Normalised in place (a Ritz vector is a unit vector up to rounding): its product is the
    // one vector more.
    p.vector.div_(length);
    p.residual = norm_value(apply(op, p.vector).sub_(p.vector, p.value));
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
  // The start vector is not kept: a rerun for the Ritz vectors draws it again from the seed.
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
    if ((o.keep_vectors || o.check_residuals) && !k.q.empty()) {
      at::Tensor v = at::zeros({n}, k.q[0].options());
      for (int64_t l = 0; l < m; ++l) v.add_(k.q[l], s(l, i));
      p.vector = moved(v, vector_options(op));
    }
    return p;
  };
  // The wanted Ritz values' indices in theta: the largest first, then the smallest.
  std::vector<int64_t> wanted;
  for (int64_t i = 0; i < std::min(top, m); ++i) wanted.push_back(m - 1 - i);
  for (int64_t i = 0; i < std::min(bottom, m); ++i) wanted.push_back(i);
  const size_t largest = static_cast<size_t>(std::min(top, m));
  for (size_t j = 0; j < wanted.size(); ++j) {
    (j < largest ? result.largest : result.smallest).push_back(pair(wanted[j]));
  }
  if (k.q.empty() && (o.keep_vectors || o.check_residuals)) {
    // No basis was kept: the vectors from the same recurrence again.
    std::vector<Eigen::VectorXd> coefficients;
    for (int64_t i : wanted) coefficients.push_back(s.col(i));
    std::vector<at::Tensor> vectors =
        rerun_ritz_vectors(op, Random(o.seed).gaussian(n, vector_options(op)), k, coefficients);
    result.hvps += m - 1;
    for (size_t j = 0; j < wanted.size(); ++j) {
      RitzPair& p = j < largest ? result.largest[j] : result.smallest[j - largest];
      p.vector = std::move(vectors[j]);
    }
  }
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
      throw InvalidOption(fmt::format("{{0}} must exceed the number of eigenvalues {}", nev),
                          {{"EigenOptions.ncv", std::to_string(ncv)}});
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

}  // namespace

KrylovBasis parse_krylov_basis(const std::string& text) {
  if (text == "device") return KrylovBasis::kDevice;
  if (text == "host") return KrylovBasis::kHost;
  if (text == "none") return KrylovBasis::kNone;
  throw InvalidArgument(fmt::format("Krylov basis '{}': expected device, host or none", text));
}

std::string to_string(KrylovBasis basis) {
  switch (basis) {
    case KrylovBasis::kDevice:
      return "device";
    case KrylovBasis::kHost:
      return "host";
    default:
      return "none";
  }
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
  if (method == EigenMethod::kLanczos && basis == KrylovBasis::kNone && (top > 1 || bottom > 1)) {
    throw InvalidOption(
        "{0}: Lanczos without a basis repeats converged eigenvalues, so it finds one per end "
        "(top, bottom <= 1); keep a basis (device or host) for more",
        {{"EigenOptions.basis", "none"}});
  }
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

}  // namespace curv
