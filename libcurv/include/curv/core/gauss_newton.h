// The Gauss-Newton part of the curvature of a cross-entropy objective: uᵀGu = (Ju)ᵀ H_out (Ju),
// J the Jacobian of the logits w.r.t. the parameters and H_out the loss's Hessian in logit space.
// Per-batch building blocks; the loop over the probe set (weights N_b / N) is the engine's.
#pragma once

#include <ATen/core/Tensor.h>

#include <Eigen/Core>
#include <cstddef>
#include <vector>

#include "curv/core/objective.h"
#include "curv/core/param_space.h"

namespace curv {

// J v: the directional derivative of `outputs` along v, a tensor of the outputs' shape, dtype and
// device, without a graph. `outputs` must carry an autograd graph to `params` (computed with grad
// mode on); v is read only on the parameters `support` (indices into params, no repeats; the
// other entries may be undefined) and converted to each parameter's dtype and device. Parameters
// the outputs do not depend on contribute zero.
//
// LibTorch 1.13 has no forward-mode AD usable here, so this is the double vector-Jacobian
// product: r(y) = Jᵀy by a create_graph backward from a dummy y, then J v = ∂(vᵀr)/∂y. Both
// backward passes leave the graph of `outputs` in place, so several JVPs (one per block) can be
// taken from one forward pass; each costs about two backward passes. Every operation must have a
// double backward, as for Hessian-vector products. Throws InvalidArgument on misaligned or
// misshapen vectors and on outputs without a graph, ModelError when a backward is not
// differentiable.
at::Tensor jacobian_vector_product(const at::Tensor& outputs, const ParamVector& params,
                                   const ParamVector& v, const std::vector<size_t>& support);

// aᵀ H_out b for the mean cross-entropy of `logits` [..., C]:
//   H_out = (1/n) Σ_i (diag(p_i) − p_i p_iᵀ),  p_i = softmax(logits_i),
// over the n positions i (rows of logits.reshape({-1, C})) whose target is not kIgnoreIndex, the
// positions and the mean the loss uses. `targets` (integer, one per position) only selects the
// positions; undefined keeps them all. a and b have the logits' shape. Computed in float64 on the
// logits' device, a chunk of positions at a time, as (1/n) Σ_i Σ_c p_ic (a_ic − ā_i)(b_ic − b̄_i)
// with ā_i = Σ_c p_ic a_ic (equal to Σ_c p a b − ā b̄, without its cancellation). Throws
// InvalidArgument on mismatched shapes or when every target is ignored (the loss is 0/0).
double cross_entropy_gauss_newton(const at::Tensor& logits, const at::Tensor& targets,
                                  const at::Tensor& a, const at::Tensor& b);

// The L × L matrix of the same form over `tangents` (each of the logits' shape): entry (l, m) is
// tangents[l]ᵀ H_out tangents[m]. It is the Gram matrix of the centred, √p-weighted tangents, so
// it is symmetric and positive semi-definite to rounding, and the sum of its entries,
// (Σ_l t_l)ᵀ H_out (Σ_l t_l), is ≥ 0.
Eigen::MatrixXd cross_entropy_gauss_newton_matrix(const at::Tensor& logits,
                                                  const at::Tensor& targets,
                                                  const std::vector<at::Tensor>& tangents);

// The Gauss-Newton coupling of u's blocks on one batch: G_lm = (J u_l)ᵀ H_out (J u_m), u_l being
// u restricted to the parameters supports[l] (indices into objective.space()). One forward pass
// (objective.logits(batch)) and one JVP per support; u is read only on the supports. When the
// supports partition u's non-zero parameters, the sum of all entries is this batch's uᵀGu (with a
// single support holding every parameter the matrix is 1 × 1: uᵀGu itself). The result is the
// batch's mean, to be weighted by N_b / N across a probe set. Like the matrix above it is
// symmetric positive semi-definite. Holds L tensors the size of the logits at once. Throws what
// objective.logits throws (ModelError for objectives not scored by cross-entropy on logits),
// InvalidArgument for a misaligned u or support, NumericalError when an entry is NaN or Inf.
Eigen::MatrixXd gauss_newton_coupling(Objective& objective, const Batch& batch,
                                      const ParamVector& u,
                                      const std::vector<std::vector<size_t>>& supports);

}  // namespace curv
