#include "curv/core/gauss_newton.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/fmt_torch.h"
#include "curv/core/error.h"

namespace curv {

namespace {

// Float64 elements per tangent and chunk of positions: bounds the temporaries of the output-space
// forms (a few of these per tangent) whatever the number of positions.
constexpr int64_t kChunkElements = int64_t{1} << 22;

// The positions of `logits` [..., C] as rows, with a float64 mask of the kept ones (target not
// kIgnoreIndex) and their count n.
struct Positions {
  at::Tensor logits;  // [N, C]
  at::Tensor kept;    // [N], float64 0/1, on the logits' device
  int64_t n = 0;
};

Positions positions(const at::Tensor& logits, const at::Tensor& targets, const char* what) {
  if (!logits.defined() || logits.dim() < 1 || !at::isFloatingType(logits.scalar_type()) ||
      logits.size(-1) < 1) {
    throw InvalidArgument(fmt::format(
        "{}: logits must be a floating tensor [..., classes]; got {}", what,
        logits.defined() ? fmt::format("{} of shape {}", logits.scalar_type(), logits.sizes())
                         : std::string("an undefined tensor")));
  }
  Positions out;
  const int64_t classes = logits.size(-1);
  out.logits = logits.detach().reshape({-1, classes});
  const int64_t rows = out.logits.size(0);
  auto f64 = at::TensorOptions().dtype(at::kDouble).device(logits.device());
  if (!targets.defined()) {
    out.kept = at::ones({rows}, f64);
    out.n = rows;
    return out;
  }
  if (!at::isIntegralType(targets.scalar_type(), /*includeBool=*/false) ||
      targets.numel() != rows) {
    throw InvalidArgument(
        fmt::format("{}: targets must be integer class ids, one per row of the logits "
                    "{} ({} rows); got {} of shape {}",
                    what, logits.sizes(), rows, targets.scalar_type(), targets.sizes()));
  }
  out.kept = targets.reshape({-1}).to(logits.device()).ne(kIgnoreIndex).to(at::kDouble);
  out.n = static_cast<int64_t>(std::llround(out.kept.sum().item<double>()));
  if (out.n == 0) {
    throw InvalidArgument(
        fmt::format("{}: every one of the {} targets is the ignore index {}: the mean "
                    "cross-entropy is 0/0",
                    what, rows, kIgnoreIndex));
  }
  return out;
}

void check_tangent(const at::Tensor& t, const at::Tensor& logits, const char* what,
                   const std::string& name) {
  if (!t.defined() || !t.sizes().equals(logits.sizes())) {
    throw InvalidArgument(fmt::format(
        "{}: {} must have the logits' shape {}; got {}", what, name, logits.sizes(),
        t.defined() ? fmt::format("{}", t.sizes()) : std::string("an undefined tensor")));
  }
}

// Calls body(p, rows) for consecutive chunks of positions: p [r, C] the float64 softmax of those
// rows with ignored rows zeroed (they then add nothing to any form), rows = (start, r).
void for_each_chunk(const Positions& pos, int64_t tangents,
                    const std::function<void(const at::Tensor&, int64_t, int64_t)>& body) {
  const int64_t total = pos.logits.size(0), classes = pos.logits.size(1);
  const int64_t step =
      std::max<int64_t>(1, kChunkElements / (classes * std::max<int64_t>(1, tangents)));
  for (int64_t start = 0; start < total; start += step) {
    const int64_t r = std::min(step, total - start);
    at::Tensor p = at::softmax(pos.logits.narrow(0, start, r).to(at::kDouble), -1) *
                   pos.kept.narrow(0, start, r).unsqueeze(-1);
    body(p, start, r);
  }
}

// t's rows [start, start + r) as float64 [r, C] on the logits' device.
at::Tensor rows_of(const at::Tensor& t, const Positions& pos, int64_t start, int64_t r) {
  return t.detach()
      .reshape({-1, pos.logits.size(1)})
      .narrow(0, start, r)
      .to(pos.logits.device(), at::kDouble);
}

}  // namespace

at::Tensor jacobian_vector_product(const at::Tensor& outputs, const ParamVector& params,
                                   const ParamVector& v, const std::vector<size_t>& support) {
  constexpr const char* what = "jacobian_vector_product";
  if (!outputs.defined()) throw InvalidArgument(fmt::format("{}: outputs are undefined", what));
  if (v.size() != params.size()) {
    throw InvalidArgument(
        fmt::format("{}: v has {} tensors for {} parameters", what, v.size(), params.size()));
  }
  std::vector<bool> seen(params.size(), false);
  for (size_t i : support) {
    if (i >= params.size()) {
      throw InvalidArgument(fmt::format("{}: support index {} is out of range for {} parameters",
                                        what, i, params.size()));
    }
    if (seen[i]) {
      throw InvalidArgument(fmt::format("{}: support lists parameter {} twice", what, i));
    }
    seen[i] = true;
    if (!v[i].defined() || !v[i].sizes().equals(params[i].sizes())) {
      throw InvalidArgument(fmt::format(
          "{}: v[{}] must have the parameter's shape {}; got {}", what, i, params[i].sizes(),
          v[i].defined() ? fmt::format("{}", v[i].sizes()) : std::string("an undefined tensor")));
    }
  }
  auto zero = [&] { return at::zeros_like(outputs, at::MemoryFormat::Contiguous); };
  if (support.empty()) return zero();
  if (!outputs.requires_grad()) {
    throw InvalidArgument(
        fmt::format("{}: the outputs (shape {}) carry no autograd graph to the parameters; "
                    "compute them with grad mode on",
                    what, outputs.sizes()));
  }
  c10::AutoGradMode grad_mode(true);
  std::vector<at::Tensor> inputs;
  for (size_t i : support) inputs.push_back(params[i]);
  // r(y) = Jᵀy is linear in y, so y's value is irrelevant; zeros as torch.autograd.functional.jvp.
  at::Tensor y = at::zeros_like(outputs).requires_grad_(true);
  auto r = torch::autograd::grad({outputs}, inputs, {y}, /*retain_graph=*/true,
                                 /*create_graph=*/true, /*allow_unused=*/true);
  std::vector<at::Tensor> rs, vs;
  for (size_t k = 0; k < r.size(); ++k) {
    if (!r[k].defined()) continue;  // the outputs do not depend on this parameter
    if (!r[k].requires_grad()) {
      throw ModelError(
          fmt::format("{}: the vector-Jacobian product for parameter {} is not differentiable "
                      "in its upstream gradient; does every operation of the model have a "
                      "double backward?",
                      what, support[k]));
    }
    rs.push_back(r[k]);
    vs.push_back(v[support[k]].to(r[k].options()));
  }
  if (rs.empty()) return zero();
  // This backward runs only through the graph the first one built (from r back to y), so the
  // forward graph of `outputs` stays intact for further JVPs.
  auto jv = torch::autograd::grad(rs, {y}, vs, /*retain_graph=*/false, /*create_graph=*/false,
                                  /*allow_unused=*/true);
  return jv[0].defined() ? jv[0] : zero();
}

double cross_entropy_gauss_newton(const at::Tensor& logits, const at::Tensor& targets,
                                  const at::Tensor& a, const at::Tensor& b) {
  constexpr const char* what = "cross_entropy_gauss_newton";
  Positions pos = positions(logits, targets, what);
  check_tangent(a, logits, what, "a");
  check_tangent(b, logits, what, "b");
  at::Tensor sum = at::zeros({}, pos.kept.options());
  for_each_chunk(pos, 2, [&](const at::Tensor& p, int64_t start, int64_t r) {
    at::Tensor ac = rows_of(a, pos, start, r), bc = rows_of(b, pos, start, r);
    ac = ac - (p * ac).sum(-1, /*keepdim=*/true);
    bc = bc - (p * bc).sum(-1, /*keepdim=*/true);
    sum += (p * ac * bc).sum();
  });
  return sum.item<double>() / static_cast<double>(pos.n);
}

Eigen::MatrixXd cross_entropy_gauss_newton_matrix(const at::Tensor& logits,
                                                  const at::Tensor& targets,
                                                  const std::vector<at::Tensor>& tangents) {
  constexpr const char* what = "cross_entropy_gauss_newton_matrix";
  Positions pos = positions(logits, targets, what);
  const int64_t count = static_cast<int64_t>(tangents.size());
  for (int64_t l = 0; l < count; ++l) {
    check_tangent(tangents[l], logits, what, fmt::format("tangents[{}]", l));
  }
  if (count == 0) return Eigen::MatrixXd(0, 0);
  at::Tensor gram = at::zeros({count, count}, pos.kept.options());
  for_each_chunk(pos, count, [&](const at::Tensor& p, int64_t start, int64_t r) {
    std::vector<at::Tensor> parts;
    for (const auto& t : tangents) parts.push_back(rows_of(t, pos, start, r));
    at::Tensor x = at::stack(parts);  // [L, r, C]
    // Centred and √p-weighted, so that Σ_c x_l x_m = Σ_c p t_l t_m − t̄_l t̄_m per position.
    x = (x - (x * p).sum(-1, /*keepdim=*/true)) * p.sqrt();
    x = x.reshape({count, -1});
    gram += at::matmul(x, x.t());
  });
  gram = (gram + gram.t()) / (2.0 * static_cast<double>(pos.n));
  gram = gram.to(at::kCPU).contiguous();
  // at::Tensor is row-major; the matrix is symmetric, so the layouts agree.
  return Eigen::Map<const Eigen::MatrixXd>(gram.data_ptr<double>(), count, count);
}

Eigen::MatrixXd gauss_newton_coupling(Objective& objective, const Batch& batch,
                                      const ParamVector& u,
                                      const std::vector<std::vector<size_t>>& supports) {
  ParamVector params = objective.parameters();
  if (u.size() != params.size()) {
    throw InvalidArgument(
        fmt::format("gauss_newton_coupling: u has {} tensors for {} parameters "
                    "of {}",
                    u.size(), params.size(), objective.describe()));
  }
  c10::AutoGradMode grad_mode(true);
  at::Tensor logits = objective.logits(batch);
  std::vector<at::Tensor> tangents;
  tangents.reserve(supports.size());
  for (const auto& support : supports) {
    tangents.push_back(jacobian_vector_product(logits, params, u, support));
  }
  Eigen::MatrixXd g = cross_entropy_gauss_newton_matrix(logits, batch.targets, tangents);
  if (!g.allFinite()) {
    throw NumericalError(
        fmt::format("gauss_newton_coupling: NaN or Inf in the Gauss-Newton coupling of {} on a "
                    "batch of {} examples (are the logits and u finite?)",
                    objective.describe(), batch.size()));
  }
  return g;
}

}  // namespace curv
