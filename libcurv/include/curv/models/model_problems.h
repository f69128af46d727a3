// The two model problems of the seed papers, built in so their curvature can be checked in
// closed form and so ndsprobe and curvtrain run on them like on any model (configs in models.h):
//  - the structured quadratic of the curvature paper: one matrix block, Hessian of Kronecker
//    rank 2 with jointly diagonal factors, curvature w_H on a fraction α of the modes and w_L on
//    the rest;
//  - the one-layer linear associative memory with softmax retrieval of the tail-end paper, with
//    power-law class frequencies and per-class (head vs tail) loss.
// See docs/concepts.md ("Model problems") for the derivations of the closed forms below.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "curv/core/objective.h"
#include "curv/models/models.h"

namespace curv {

// Throw InvalidArgument naming the field and value.
void validate_quadratic(const QuadraticConfig& config);
void validate_memory(const MemoryConfig& config);

// The objectives behind make_model for arch "quadratic" and "memory". The quadratic's loss does
// not depend on the batch (any batch is accepted); its single parameter is "quadratic.weight",
// started at W_0. The memory's inputs and targets are int64 class ids of one shape; its single
// parameter is "memory.weight", started at zero.
std::unique_ptr<Objective> make_quadratic_problem(const QuadraticConfig& config,
                                                  const ModelInit& init);
std::unique_ptr<Objective> make_memory_problem(const MemoryConfig& config, const ModelInit& init);

// The structured quadratic in float64 on the CPU, for closed forms and tests.
class QuadraticProblem {
 public:
  explicit QuadraticProblem(const QuadraticConfig& config);

  const QuadraticConfig& config() const { return config_; }
  const at::Tensor& left_basis() const { return u_; }   // U, rows × rows, orthogonal
  const at::Tensor& right_basis() const { return v_; }  // V, cols × cols, orthogonal
  at::Tensor initial_weight() const;                    // W_0 = U diag(d) Vᵀ

  double loss(const at::Tensor& w) const;
  at::Tensor gradient(const at::Tensor& w) const;
  at::Tensor hvp(const at::Tensor& z) const;
  // Share of ‖Z‖² in the high-curvature subspace, ‖U_kᵀ Z V_k‖² / ‖Z‖².
  double high_share(const at::Tensor& z) const;
  // NDS along any Z: w_L + (w_H − w_L)·high_share(Z).
  double nds(const at::Tensor& z) const;
  // NDS of the exact Muon step −polar(G) whenever G is diagonal in (U, V) with no zero singular
  // value (true along every gradient or Muon trajectory from W_0): α·w_H + (1 − α)·w_L.
  double muon_step_nds() const;
  // NDS of the gradient step at W_0: w_L + (w_H − w_L)·a, a = k·(w_H d_H)² /
  // (k·(w_H d_H)² + (r − k)·(w_L d_L)²), the share of the gradient's energy in the sharp modes.
  double gradient_step_nds() const;

 private:
  QuadraticConfig config_;
  at::Tensor u_, v_;
};

// Power-law class frequencies p_c ∝ (c + 1)^(−s), c = 0 … classes − 1 (float64, sum 1).
at::Tensor memory_class_probabilities(int64_t classes, double s);
// `n` classes drawn from those frequencies, deterministic in `seed`: inputs = targets, shape
// (n, 1) int64 (one "token" per example, so per-token tooling applies unchanged).
Batch sample_memory_batch(int64_t classes, double s, int64_t n, uint64_t seed);
// Every class once, shape (classes, 1): the balanced validation and probe set.
Batch memory_all_classes(int64_t classes);
// Bucket per class: the most frequent classes holding `head_mass` of the probability at s are
// bucket 0 (head), the rest bucket 1 (tail) — the ids ZipfPcfg::frequency_buckets uses.
at::Tensor memory_class_buckets(int64_t classes, double s, double head_mass = 0.5);

// Closed forms of the memory with orthonormal embeddings at W = 0, for a batch whose classes
// have shares `freq` (float64, all > 0, sum 1):
// NDS of the gradient step, (1/K)·Σ p³ / Σ p².
double memory_gradient_nds_at_zero(const at::Tensor& freq);
// NDS of the exact Muon step −polar(G): Σ_c p_c (1 − q_c²) / (K (K − 1)), q = (1/p) / ‖1/p‖.
double memory_polar_nds_at_zero(const at::Tensor& freq);
// Per-class loss after one gradient step of size lr from zero: log(1 + (K − 1)·exp(−lr·p_c)).
at::Tensor memory_class_loss_after_gradient_step(const at::Tensor& freq, double lr);

}  // namespace curv
