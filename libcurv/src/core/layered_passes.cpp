// Gradients and Hessian-vector products of a staged loss (Objective::loss_stages), one stage's
// graph at a time.
//
// The loss is a chain x_{s+1} = f_s(x_s, θ), L = f_last(x_last, θ). The forward sweep keeps only
// the boundaries x_s and, for an HVP along v, their tangents ẋ_{s+1} = J_x f_s ẋ_s + J_θ f_s v
// (a Jacobian-vector product, formed as the derivative of a vector-Jacobian product toward its
// cotangent). The reverse sweep recomputes each stage from x_s and carries the adjoint a_s =
// ∂L/∂x_s and its tangent ȧ_s. With φ_s = ⟨a_{s+1}, f_s(x_s, θ)⟩ and a_{s+1} held constant,
//   (a_s, g_s) = ∇φ_s            (g_s: the stage's share of the gradient),
//   (ȧ_s, (Hv)_s) = ∇²φ_s (ẋ_s, v) + J_{f_s}ᵀ ȧ_{s+1} = ∇(⟨∇_x φ_s, ẋ_s⟩ + ⟨∇_θ φ_s, v⟩ + ⟨f_s,
//   ȧ_{s+1}⟩),
// the derivative of (a_s, g_s) along (ẋ_s, v, ȧ_{s+1}). Summed over the stages, g and Hv are the
// loss's gradient and Hessian-vector product, exact to rounding as Pearlmutter's double backward
// of the whole graph is; what is held at once is one stage's graph (and its backward graph)
// beside the boundaries.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <utility>

#include "core/engine_internal.h"
#include "curv/core/error.h"

namespace curv {
namespace engine_detail {

namespace {

// acc += t where either may be undefined (zero). The first term is held as it is: autograd may
// hand back a tensor it was given (a tangent, an adjoint), which is then summed out of place.
void add_to(at::Tensor& acc, const at::Tensor& t) {
  if (!t.defined()) return;
  if (!acc.defined()) {
    acc = t;
  } else if (acc.storage().use_count() == 1) {
    acc.add_(t);
  } else {
    acc = acc + t;
  }
}

// x_s as the leaf a stage's recomputation differentiates toward (undefined for the first stage).
at::Tensor stage_input(const at::Tensor& boundary) {
  return boundary.defined() ? boundary.detach().requires_grad_(true) : at::Tensor();
}

// The stage's inputs for torch::autograd::grad: x_s (when defined), then every parameter.
std::vector<at::Tensor> stage_inputs(const at::Tensor& x, const ParamVector& params) {
  std::vector<at::Tensor> inputs;
  inputs.reserve(params.size() + 1);
  if (x.defined()) inputs.push_back(x);
  inputs.insert(inputs.end(), params.begin(), params.end());
  return inputs;
}

size_t stage_count(Objective& objective) {
  const size_t stages = objective.loss_stages();
  if (stages < 2) {
    throw InvalidArgument(fmt::format(
        "EngineOptions.recompute_layers: {} is not computed in layer stages (the built-in "
        "transformers are); probe it without layer-wise recomputation",
        objective.describe()));
  }
  return stages;
}

// ẏ = J_x f ẋ + J_θ f v for y = f(x, θ) computed with a graph: the derivative of the
// vector-Jacobian product (J_x, J_θ)ᵀ r toward r, along (ẋ, v). Only the inputs that move are
// differentiated toward, so a stage below a direction's parameters costs no backward. Undefined
// when nothing moves.
at::Tensor stage_tangent(const at::Tensor& y, const at::Tensor& x, const at::Tensor& x_dot,
                         const ParamVector& params, const ParamVector& v) {
  std::vector<at::Tensor> inputs, directions;
  if (x.defined() && x_dot.defined()) {
    inputs.push_back(x);
    directions.push_back(x_dot);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (v[i].defined()) {
      inputs.push_back(params[i]);
      directions.push_back(v[i]);
    }
  }
  if (inputs.empty() || !y.requires_grad()) return {};
  const at::Tensor r = at::zeros_like(y).requires_grad_(true);
  const ParamVector vjp = torch::autograd::grad({y}, inputs, {r}, /*retain_graph=*/true,
                                                /*create_graph=*/true, /*allow_unused=*/true);
  std::vector<at::Tensor> outputs, tangents;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (vjp[k].defined() && vjp[k].requires_grad()) {
      outputs.push_back(vjp[k]);
      tangents.push_back(directions[k]);
    }
  }
  if (outputs.empty()) return {};
  at::Tensor y_dot = torch::autograd::grad(outputs, {r}, tangents, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true)[0];
  return y_dot.defined() ? y_dot.detach() : y_dot;
}

}  // namespace

StagedPass staged_pass(Objective& objective, const Batch& batch, const ParamVector& params,
                       const ParamVector* v, bool want_gradient, const StageSink* sink) {
  const size_t stages = stage_count(objective);
  const bool hvp = v != nullptr;
  bool v_moves = false;
  if (hvp) {
    for (const auto& t : *v) v_moves = v_moves || t.defined();
  }
  // Forward sweep: the boundaries x_1 … x_last and, for an HVP, their tangents.
  std::vector<at::Tensor> xs(stages), x_dots(stages);
  for (size_t s = 0; s + 1 < stages; ++s) {
    if (v_moves || (hvp && x_dots[s].defined())) {
      const at::Tensor x = stage_input(xs[s]);
      const at::Tensor y = objective.loss_stage(s, x, batch);
      x_dots[s + 1] = stage_tangent(y, x, x_dots[s], params, *v);
      xs[s + 1] = y.detach();
    } else {
      c10::NoGradGuard no_grad;
      xs[s + 1] = objective.loss_stage(s, xs[s], batch);
    }
  }
  // Reverse sweep: a = ∂L/∂x_{s+1} and its tangent ȧ (undefined: zero, and above the last stage
  // the loss itself needs no cotangent).
  StagedPass out;
  out.grads.resize(params.size());
  out.first_stage.assign(params.size(), stages);
  if (hvp) out.hv.resize(params.size());
  const size_t lowest = sink != nullptr && !want_gradient ? sink->lowest_stage : 0;
  at::Tensor a, a_dot;
  for (size_t s = stages; s-- > lowest;) {
    const bool last = s + 1 == stages;
    const at::Tensor x = stage_input(xs[s]);
    xs[s] = at::Tensor();
    if (!last && !a.defined()) break;  // nothing below reaches the loss
    const at::Tensor y = objective.loss_stage(s, x, batch);
    if (last) out.loss = y.detach();
    if (!y.requires_grad()) break;
    const bool second = hvp && (v_moves || x_dots[s].defined() || a_dot.defined());
    const std::vector<at::Tensor> inputs = stage_inputs(x, params);
    const size_t offset = x.defined() ? 1 : 0;
    ParamVector grads = torch::autograd::grad(
        {y}, inputs, last ? std::vector<at::Tensor>{} : std::vector<at::Tensor>{a},
        /*retain_graph=*/second, /*create_graph=*/second, /*allow_unused=*/true);
    for (size_t i = 0; i < params.size(); ++i) {
      if (grads[offset + i].defined()) out.first_stage[i] = s;
    }
    at::Tensor next_a_dot;
    if (second) {
      std::vector<at::Tensor> outputs, tangents;
      if (x.defined() && x_dots[s].defined() && grads[0].defined() && grads[0].requires_grad()) {
        outputs.push_back(grads[0]);
        tangents.push_back(x_dots[s]);
      }
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& g = grads[offset + i];
        if ((*v)[i].defined() && g.defined() && g.requires_grad()) {
          outputs.push_back(g);
          tangents.push_back((*v)[i]);
        }
      }
      if (a_dot.defined()) {
        outputs.push_back(y);
        tangents.push_back(a_dot);
      }
      if (!outputs.empty()) {
        ParamVector parts = torch::autograd::grad(outputs, inputs, tangents,
                                                  /*retain_graph=*/false,
                                                  /*create_graph=*/false, /*allow_unused=*/true);
        if (x.defined()) next_a_dot = parts[0];
        for (size_t i = 0; i < params.size(); ++i) {
          const at::Tensor& part = parts[offset + i];
          if (!part.defined()) continue;
          if (sink != nullptr && sink->product) {
            c10::NoGradGuard no_grad;
            sink->product(i, part);
          } else {
            add_to(out.hv[i], part);
          }
        }
      }
    }
    c10::NoGradGuard no_grad;
    a = x.defined() && grads[0].defined() ? grads[0].detach() : at::Tensor();
    a_dot = next_a_dot;
    if (want_gradient) {
      for (size_t i = 0; i < params.size(); ++i) {
        if (!grads[offset + i].defined()) continue;
        if (sink != nullptr && sink->gradient) {
          sink->gradient(i, grads[offset + i].detach());
        } else {
          add_to(out.grads[i], grads[offset + i].detach());
        }
      }
    }
    x_dots[s] = at::Tensor();
  }
  return out;
}

ParamVector staged_slice_hvp(Objective& objective, const Batch& batch, const ParamVector& params,
                             const ParamVector& v, const std::vector<size_t>* targets,
                             ParamVector* gradient, const StageSink* sink) {
  ParamVector hv(params.size());
  auto on_target = [&](size_t i) {
    return targets == nullptr || std::binary_search(targets->begin(), targets->end(), i);
  };
  StageSink to_targets;
  if (sink != nullptr) {
    to_targets.product = [&](size_t i, const at::Tensor& part) {
      if (on_target(i)) sink->product(i, part);
    };
  } else if (targets != nullptr) {
    to_targets.product = [&](size_t i, const at::Tensor& part) {
      if (on_target(i)) hv[i] = hv[i].defined() ? hv[i] + part : part;
    };
  }
  StagedPass pass = staged_pass(objective, batch, params, &v, gradient != nullptr,
                                to_targets.product ? &to_targets : nullptr);
  if (gradient != nullptr) *gradient = fill_undefined(std::move(pass.grads), params);
  if (!to_targets.product) hv = std::move(pass.hv);
  return hv;
}

Eigen::MatrixXd staged_block_products(Objective& objective, const Batch& batch,
                                      const ParamVector& params, const BlockReader& reader,
                                      size_t blocks, const std::vector<BlockProduct>& products,
                                      Eigen::VectorXd* first_order, int64_t& passes) {
  const auto L = static_cast<Eigen::Index>(blocks);
  const auto K = static_cast<Eigen::Index>(products.size());
  // The float64 dots as 0-dim tensors with their (row, column), read back once: column K holds
  // g·u_l. No host synchronisation per stage.
  std::vector<at::Tensor> values;
  std::vector<std::pair<Eigen::Index, Eigen::Index>> cells;
  auto dot_into = [&](size_t i, const at::Tensor& part, Eigen::Index column, size_t first_block) {
    const int64_t l = reader.block_of[i];
    if (l < static_cast<int64_t>(first_block) || !reader.v[i].defined()) return;
    const at::Tensor& u = reader.v[i];
    values.push_back(float64_dot(part, u).reshape({1}));
    cells.emplace_back(static_cast<Eigen::Index>(l), column);
  };
  bool first_done = first_order == nullptr;
  // From the first pass, which runs every stage: where each parameter's shares are formed, so
  // that a product wanted on the blocks from first_block up stops its reverse sweep below them.
  std::vector<size_t> first_stage;
  for (Eigen::Index k = 0; k < K; ++k) {
    const BlockProduct& product = products[static_cast<size_t>(k)];
    if (product.support.empty()) continue;
    ParamVector d(params.size());
    for (size_t i : product.support) d[i] = (*product.direction)[i];
    StageSink sink;
    sink.product = [&](size_t i, const at::Tensor& part) {
      dot_into(i, part, k, product.first_block);
    };
    if (!first_done) sink.gradient = [&](size_t i, const at::Tensor& g) { dot_into(i, g, K, 0); };
    if (!first_stage.empty()) {
      sink.lowest_stage = objective.loss_stages();
      for (size_t i = 0; i < params.size(); ++i) {
        const bool wanted = reader.block_of[i] >= static_cast<int64_t>(product.first_block) &&
                            reader.v[i].defined();
        if (wanted) sink.lowest_stage = std::min(sink.lowest_stage, first_stage[i]);
      }
    }
    StagedPass pass = staged_pass(objective, batch, params, &d, !first_done, &sink);
    if (first_stage.empty()) first_stage = std::move(pass.first_stage);
    first_done = true;
    ++passes;
  }
  if (!first_done) {
    StageSink sink;
    sink.gradient = [&](size_t i, const at::Tensor& g) { dot_into(i, g, K, 0); };
    staged_pass(objective, batch, params, nullptr, /*want_gradient=*/true, &sink);
    ++passes;
  }
  Eigen::MatrixXd m = Eigen::MatrixXd::Zero(L, K + 1);
  if (!values.empty()) {
    const at::Tensor host = at::cat(values).cpu();
    const double* x = host.data_ptr<double>();
    for (size_t q = 0; q < cells.size(); ++q) m(cells[q].first, cells[q].second) += x[q];
  }
  if (first_order != nullptr) *first_order = m.col(K);
  return m.leftCols(K);
}

}  // namespace engine_detail
}  // namespace curv
