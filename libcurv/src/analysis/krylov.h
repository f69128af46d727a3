// The Krylov machinery that the eigen-solvers, the trace estimators and the spectral density share:
// random probes generated on the operator's device, the checked product, and Lanczos with full
// reorthogonalisation on device vectors (or a basis spilled to the host).
#pragma once

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "curv/analysis/spectrum.h"
#include "curv/core/error.h"
#include "curv/core/param_space.h"

namespace curv::krylov {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
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

// a·b as a 0-dim tensor on the vectors' device: BLAS's in float64, accumulated in float64 for
// vectors of a narrower dtype.
inline at::Tensor dot_tensor(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == at::kDouble ? at::dot(a, b) : float64_dot(a, b);
}
inline double dot_value(const at::Tensor& a, const at::Tensor& b) {
  return dot_tensor(a, b).item<double>();
}
inline double norm_value(const at::Tensor& a) {
  return a.scalar_type() == at::kDouble ? a.norm().item<double>()
                                        : std::sqrt(float64_dot(a, a).item<double>());
}

// A NumericalError for a product that holds NaN or Inf (`where` names the step).
[[noreturn]] inline void throw_non_finite_product(const std::string& where) {
  throw NumericalError(fmt::format(
      "operator product holds NaN or Inf ({}): is the loss twice differentiable at these "
      "parameters?",
      where));
}

// op's product, checked through its float64 norm (NaN and Inf reach it; no mask of the vector's
// size is formed).
inline at::Tensor apply(LinearOperator& op, const at::Tensor& x) {
  at::Tensor y = op.apply(x);
  if (!std::isfinite(norm_value(y))) {
    throw_non_finite_product(fmt::format("input norm {:.6g}", norm_value(x)));
  }
  return y;
}

// w ← A q − β q′ for the three-term recurrence: with `previous` (q′, the caller's to give up) the
// product is added into q′'s own memory after scaling it by −β, one vector less than forming A q
// apart; without, A q alone.
inline at::Tensor recurrence_product(LinearOperator& op, const at::Tensor& current,
                                     at::Tensor previous, double beta) {
  if (!previous.defined()) return op.apply(current);
  previous.mul_(-beta);
  op.apply_add(current, previous);
  return previous;
}

// Lanczos tridiagonalisation with full reorthogonalisation (two Gram–Schmidt passes, which keep
// the basis orthonormal to working precision, so no spurious copies of converged Ritz values
// appear). T has diagonal alpha and off-diagonal beta[0..m-2]; beta[m-1] couples to the next,
// not yet formed vector and gives the residual estimates. The basis lives on the operator's
// device, or in pinned host memory when spilled there; the recurrence runs on the device either
// way, with a spilled vector copied into one staging buffer as each pass reaches it (the copies
// queue on the stream behind the arithmetic: no synchronisation per vector).
struct Krylov {
  std::vector<at::Tensor> q;
  std::vector<double> alpha, beta;
  bool invariant = false;  // the Krylov space is invariant: its Ritz pairs are exact
};

inline at::TensorOptions basis_options(const LinearOperator& op, KrylovBasis where) {
  at::TensorOptions o = vector_options(op);
  if (where != KrylovBasis::kHost) return o;
  return o.device(c10::kCPU).pinned_memory(op.device().is_cuda());
}

// A copy of `x` with `options` (device and pinning), or `x` itself when it already has them.
inline at::Tensor moved(const at::Tensor& x, const at::TensorOptions& options) {
  // is_pinned() asks the CUDA driver: only where pinned memory is wanted.
  if (x.device() == options.device() && (!options.pinned_memory() || x.is_pinned())) return x;
  return at::empty(x.sizes(), options).copy_(x);
}

// Runs until `max_steps` steps, an invariant subspace, or `stop(krylov)` returns true after a step.
// `start` is the run's own: normalised in place, it becomes the first vector. Without a basis on
// the device (kNone, or kHost on a GPU) q_{j−1} is the recurrence's alone, and each product is
// added into its memory (w = A q_j − β q_{j−1}, then α_j = q_jᵀ w: Paige's ordering of the
// recurrence), so the device holds two vectors during a product; a device basis keeps every q, w
// apart.
template <class Stop>
void lanczos(LinearOperator& op, at::Tensor start, int64_t max_steps, KrylovBasis where, Krylov& k,
             Stop stop) {
  const int64_t n = op.rows();
  const bool kept = where != KrylovBasis::kNone;
  const at::TensorOptions basis = basis_options(op, where), device = vector_options(op);
  max_steps = std::min(max_steps, n);
  const double start_norm = norm_value(start);
  if (!(start_norm > 0)) throw InvalidArgument("Lanczos: start vector is zero");
  // A basis in host memory on a CPU device is the device's: its vectors are the recurrence's.
  const bool spilled = basis.device() != device.device(), in_place = !kept || spilled;
  // q_j and q_{j−1} on the device: the recurrence's own terms, never staged.
  at::Tensor current = moved(start, device), previous;
  start = at::Tensor();
  current.div_(start_norm);
  at::Tensor staging = spilled ? at::empty({n}, device) : at::Tensor();
  if (kept) k.q.push_back(moved(current, basis));
  double scale = 0.0;  // largest |α| or β seen: what "negligibly small β" is relative to
  for (int64_t j = 0; j < max_steps; ++j) {
    at::Tensor w =
        in_place ? recurrence_product(op, current, std::move(previous), j > 0 ? k.beta[j - 1] : 0.0)
                 : op.apply(current);
    const double a = dot_value(current, w);
    w.sub_(current, a);
    if (j > 0 && !in_place) w.sub_(previous, k.beta[j - 1]);
    for (int pass = 0; pass < 2; ++pass) {  // over no vectors when no basis is kept
      for (size_t i = 0; i < k.q.size(); ++i) {
        const auto ii = static_cast<int64_t>(i);
        const at::Tensor& q = !spilled  ? k.q[i]
                              : ii == j ? current
                                        : staging.copy_(k.q[i], /*non_blocking=*/true);
        // w −= (qᵀw) q with the coefficient left on the device: no synchronisation per vector.
        w.addcmul_(q, dot_tensor(q, w), -1);
      }
    }
    const double b = norm_value(w);
    // NaN or Inf in a product reaches α or β.
    if (!std::isfinite(a) || !std::isfinite(b)) {
      throw_non_finite_product(fmt::format("Lanczos step {}", j + 1));
    }
    k.alpha.push_back(a);
    k.beta.push_back(b);
    scale = std::max({scale, std::abs(a), b});
    // A full-dimensional Krylov space is invariant too; its last β is rounding noise.
    k.invariant = b <= 1e-12 * scale || j + 1 == n;
    if (stop(k) || k.invariant) return;
    if (j + 1 < max_steps) {
      previous = current;
      current = w.div_(b);
      if (kept) k.q.push_back(spilled ? moved(current, basis) : current);
    }
  }
}

// The Ritz vectors Σ_l c(l) q_l, one per column of coefficients c, of a Lanczos run `k` that kept
// no basis (KrylovBasis::kNone): the recurrence run again from the same `start` (given up as in
// lanczos()) with k's own α and β, each q_l added into the vectors as it is formed; m − 1 HVPs
// for m steps, two vectors besides the results.
inline std::vector<at::Tensor> rerun_ritz_vectors(
    LinearOperator& op, at::Tensor start, const Krylov& k,
    const std::vector<Eigen::VectorXd>& coefficients) {
  const int64_t m = static_cast<int64_t>(k.alpha.size());
  const at::TensorOptions device = vector_options(op);
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < coefficients.size(); ++i) out.push_back(at::zeros({op.rows()}, device));
  at::Tensor current = moved(start, device), previous;
  start = at::Tensor();
  current.div_(norm_value(current));
  for (int64_t l = 0; l < m; ++l) {
    for (size_t i = 0; i < coefficients.size(); ++i) out[i].add_(current, coefficients[i][l]);
    if (l + 1 == m) break;
    at::Tensor w =
        recurrence_product(op, current, std::move(previous), l > 0 ? k.beta[l - 1] : 0.0);
    w.sub_(current, k.alpha[l]);
    previous = current;
    current = w.div_(k.beta[l]);
  }
  return out;
}

// Eigen-decomposition of the current tridiagonal T_m (ascending eigenvalues).
inline Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> tridiagonal_eigen(const Krylov& k,
                                                                        bool vectors) {
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

inline double sample_std(const std::vector<double>& x) {
  if (x.size() < 2) return std::numeric_limits<double>::quiet_NaN();
  const double mean = std::accumulate(x.begin(), x.end(), 0.0) / x.size();
  double ss = 0.0;
  for (double v : x) ss += (v - mean) * (v - mean);
  return std::sqrt(ss / (x.size() - 1));
}

inline double mean_of(const std::vector<double>& x) {
  return std::accumulate(x.begin(), x.end(), 0.0) / static_cast<double>(x.size());
}

}  // namespace curv::krylov
