// Spectrum of a symmetric LinearOperator (the Hessian, one block of it, or the Adam-preconditioned
// Hessian): extreme eigenpairs by Lanczos, trace by Hutchinson / Hutch++, spectral density by
// stochastic Lanczos quadrature, and the overlap of update directions with the top eigenspace.
#pragma once

#include <ATen/core/Tensor.h>

#include <Eigen/Core>
#include <cstdint>
#include <string>
#include <vector>

#include "curv/core/linear_operator.h"
#include "curv/core/param_space.h"

namespace curv {

struct SavedOptimizer;

enum class EigenMethod {
  // One Krylov space with full reorthogonalisation, no restarts: both ends of the spectrum come
  // from the same HVPs, and the run stops as soon as every requested Ritz pair has converged.
  kLanczos,
  // Spectra's implicitly restarted Lanczos (ARPACK-style), one solve per end of the spectrum.
  kSpectra,
  // PyHessian-style power iteration with deflation: converges to the largest |λ|, whatever its
  // sign; kept as the baseline that the Lanczos methods are compared with.
  kPower,
};
EigenMethod parse_eigen_method(const std::string& text);  // "lanczos" | "spectra" | "power"
std::string to_string(EigenMethod method);

// How a Lanczos method bounds the error of a Ritz value θ with residual r = ‖Hv − θv‖.
enum class ErrorBound {
  // |θ − λ| ≤ r: rigorous for any symmetric operator, pessimistic once θ is isolated.
  kResidual,
  // |θ − λ| ≤ min(r, r²/δ), δ the distance from θ to the nearest other Ritz value less r
  // (Parlett's gap theorem with the Ritz gap standing in for the unknown eigenvalue gap). Stops
  // well before kResidual when the wanted eigenvalue is separated from the rest.
  kGap,
};
ErrorBound parse_error_bound(const std::string& text);  // "residual" | "gap"
std::string to_string(ErrorBound bound);

// Where a Lanczos basis (EigenMethod::kLanczos, and each run of the spectral density) is kept.
enum class KrylovBasis {
  // On the operator's device: nothing crosses to the host per step; each step adds rows()
  // doubles of device memory (1 GB per step at 124M parameters).
  kDevice,
  // Spilled to host memory (pinned when the operator is on CUDA): the recurrence and the
  // reorthogonalisation still run on the device, which holds three vectors; each Gram–Schmidt
  // pass copies the spilled vectors in one at a time, and each step's new vector goes out.
  kHost,
  // No basis: the three-term recurrence alone, without reorthogonalisation, so the device holds
  // two vectors at any step count (a λ_max of a model whose float64 copies do not fit by the
  // dozen). Rounding makes converged Ritz values reappear as copies (Paige), so the eigen-solver
  // gives one eigenvalue per end (top, bottom <= 1); its Ritz vectors, when wanted (residual
  // checks, kept vectors), come from running the same recurrence again from the same start (as
  // many HVPs once more). Each spectral density run needs only T's entries; its moments keep
  // their accuracy without reorthogonalisation, its nodes may repeat. Not for Hutch++'s sketch.
  kNone,
};
KrylovBasis parse_krylov_basis(const std::string& text);  // "device" | "host" | "none"
std::string to_string(KrylovBasis basis);

struct EigenOptions {
  int64_t top = 1;     // largest (algebraic) eigenvalues wanted; power: largest |λ| wanted
  int64_t bottom = 0;  // smallest (algebraic) eigenvalues wanted; Lanczos methods only
  // Lanczos methods: a Ritz pair has converged when its error bound (see `bound`; Spectra: the
  // residual) is at most tol·|θ|.
  // Power: stops when successive Rayleigh quotients differ by less than tol relative (PyHessian's
  // rule, which bounds nothing). In (0, 1).
  double tol = 1e-6;
  ErrorBound bound = ErrorBound::kGap;  // Lanczos only (Spectra applies its residual rule)
  int64_t max_hvps = 300;  // HVP budget of the solver (residual checks not counted), ≥ 2
  // Spectra only: Krylov dimension per solve; 0 picks max(2k + 1, 20) capped at rows().
  int64_t ncv = 0;
  EigenMethod method = EigenMethod::kLanczos;
  uint64_t seed = 0;  // start vector
  // One extra HVP per returned pair to measure ‖Hv − θv‖ directly instead of trusting the
  // Lanczos relation's estimate |β_m s_m| (which rounding in the HVPs can make optimistic).
  bool check_residuals = true;
  bool keep_vectors = true;  // return the eigenvectors (rows() doubles each, on op.device())
  KrylovBasis basis = KrylovBasis::kDevice;  // Lanczos only

  void validate() const;  // InvalidArgument naming the field and its value
};

struct RitzPair {
  double value = 0.0;
  double residual = 0.0;  // ‖Hv − θv‖ with ‖v‖ = 1 (measured, or the Lanczos estimate)
  double error_bound = 0.0;  // Lanczos: the bound on |θ − λ| that the stopping rule used; else NaN
  // 1-D float64 on the operator's device; undefined unless EigenOptions::keep_vectors.
  at::Tensor vector;
};

// How an eigen-solve ended, as Spectra's CompInfo reports it: not converging is a status with
// the best pairs found, not an error.
enum class EigenStatus {
  kNotComputed,     // no solve ran (nothing was requested)
  kConverged,       // every requested pair met the tolerance, or the Krylov space became invariant
  kNotConverging,   // the HVP budget ran out first; the pairs are the best found
  kNumericalIssue,  // the solver broke down (Spectra's NumericalIssue)
};
std::string to_string(EigenStatus status);  // "converged", "not_converging", ...

struct EigenResult {
  EigenMethod method = EigenMethod::kLanczos;
  EigenStatus status = EigenStatus::kNotComputed;
  std::string message;              // why it stopped
  std::vector<RitzPair> largest;    // descending
  std::vector<RitzPair> smallest;   // ascending
  std::vector<RitzPair> dominant;   // power iteration: by decreasing |λ|
  bool residuals_measured = false;  // residuals from extra HVPs, not the Lanczos relation
  int64_t hvps = 0;                 // spent by the solver
  int64_t residual_hvps = 0;        // spent on measured residuals
  int64_t iterations = 0;           // Lanczos steps, restarts (Spectra) or power iterations
  double seconds = 0.0;
  // Lanczos: the largest and smallest Ritz values after each HVP (for convergence studies).
  // Power: the Rayleigh quotient after each HVP of the first (dominant) pair.
  std::vector<double> largest_history, smallest_history;

  bool converged() const { return status == EigenStatus::kConverged; }
  std::string brief() const;
};

EigenResult extreme_eigenpairs(LinearOperator& op, const EigenOptions& options);

enum class TraceMethod { kHutchinson, kHutchPlusPlus };
TraceMethod parse_trace_method(const std::string& text);  // "hutchinson" | "hutchpp"
std::string to_string(TraceMethod method);

struct TraceOptions {
  TraceMethod method = TraceMethod::kHutchPlusPlus;
  // Total HVPs. Hutch++ spends a third on a sketch S, a third on H·Q for the basis Q of HS, and
  // the rest on Hutchinson samples of the deflated remainder. ≥ 2 (Hutchinson), ≥ 6 (Hutch++).
  int64_t matvecs = 99;
  uint64_t seed = 0;
  // Where Hutch++'s sketch and its orthonormal basis (matvecs/3 float64 vectors) live: on the
  // operator's device, or spilled to (pinned) host memory, where the QR and the projections of
  // the Hutchinson samples then run; each product still runs on the device.
  KrylovBasis basis = KrylovBasis::kDevice;
  void validate() const;
};

struct TraceResult {
  TraceMethod method = TraceMethod::kHutchPlusPlus;
  double estimate = 0.0;
  // Sample standard deviation of the random part over sqrt(its samples). Hutch++'s low-rank
  // part tr(QᵀHQ) is exact given Q, so only the remainder's samples contribute.
  double standard_error = 0.0;
  int64_t matvecs = 0;
  int64_t samples = 0;      // Rademacher samples in the stochastic part
  int64_t sketch_rank = 0;  // Hutch++: columns of Q
  double seconds = 0.0;
  std::string brief() const;
};

TraceResult estimate_trace(LinearOperator& op, const TraceOptions& options);

struct DensityOptions {
  int64_t runs = 10;   // independent Rademacher start vectors, ≥ 1 (≥ 2 for a standard error)
  int64_t steps = 80;  // Lanczos steps per run (HVPs per run), ≥ 1
  // Gaussian smoothing width in eigenvalue units; 0 picks 1% of the spread of the Ritz nodes.
  double sigma = 0.0;
  int64_t grid = 1024;  // points of the smoothed curve, ≥ 2
  uint64_t seed = 0;
  KrylovBasis basis = KrylovBasis::kDevice;
  void validate() const;
};

struct DensityResult {
  // Per run: Ritz values θ_j of the m-step tridiagonal and weights τ_j² (squared first
  // components of its eigenvectors; they sum to 1 per run). Row-major runs × steps; a run that
  // met an invariant subspace early pads with weight 0.
  std::vector<double> nodes, weights;
  int64_t runs = 0, steps = 0;
  double sigma = 0.0;                 // smoothing width used
  std::vector<double> grid, density;  // φ(t) = mean over runs of Σ_j τ_j² N(t; θ_j, σ²)
  // n·Σ_j τ_j² θ_j^k per run estimates tr(H^k); mean over runs and its standard error.
  double trace = 0.0, trace_standard_error = 0.0;
  int64_t hvps = 0;
  double seconds = 0.0;
  // Σ_j τ_j² θ_j^k averaged over runs: an estimate of (1/n) Σ λ^k.
  double moment(int k) const;
  std::string brief() const;
};

DensityResult spectral_density(LinearOperator& op, const DensityOptions& options);

// How the Adam-preconditioned sharpness of a checkpoint came out (the status of its results).
enum class PrecondStatus {
  kConverged,     // the top eigenpair met the tolerance
  kNotConverged,  // the HVP budget ran out first: the best Ritz pair found
  kUnavailable,   // no usable Adam state (adam_preconditioner says why)
};
std::string to_string(PrecondStatus status);  // "converged" | "not_converged" | "unavailable"

// Adam's preconditioner P = sqrt(v̂) + ε with v̂ = exp_avg_sq / (1 − β₂ᵗ), read from a checkpoint.
struct AdamPreconditioner {
  Eigen::VectorXd inverse_sqrt;  // P^-1/2, flat in the ParamSpace's order
  double lr = 0.0, beta1 = 0.0, beta2 = 0.0, eps = 0.0;
  int64_t step_count = 0;
  // Adaptive edge of stability: preconditioned sharpness of full-batch Adam settles near
  // (2 + 2β₁) / ((1 − β₁)·lr).
  double edge_of_stability() const;
};

// Fills `out` and returns "" when the saved state holds Adam's second moment (exp_avg_sq) for every
// parameter, was saved by "adam" or "adamw" and has a positive step count; otherwise returns why
// not, for an "unavailable" status. lr, beta1, beta2 and eps come from the record's
// hyper-parameters (PyTorch's Adam defaults when absent). A state whose shape differs from its
// parameter is an InvalidArgument. A checkpoint's: adam_preconditioner(saved_optimizer(ckpt), ...).
std::string adam_preconditioner(const SavedOptimizer& saved, const ParamSpace& space,
                                AdamPreconditioner* out);

struct Overlap {
  // Share of ‖u‖² inside the span of the (orthonormal) eigenvectors: Σ_i (v_iᵀu)² / ‖u‖².
  double eigenspace_share = 0.0;
  std::vector<double> per_vector;  // (v_iᵀu)² / ‖u‖², one per eigenvector
  double gradient_cosine = 0.0;    // gᵀu / (‖g‖‖u‖)
};

// NaN entries when ‖u‖ = 0 (or ‖g‖ = 0 for the cosine): a zero direction has no share. The
// eigenvectors are flat float64 vectors (RitzPair::vector) on the device of u and the gradient.
Overlap direction_overlap(const ParamVector& u, const std::vector<at::Tensor>& eigenvectors,
                          const ParamVector& gradient);

}  // namespace curv
