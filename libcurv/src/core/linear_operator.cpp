#include "curv/core/linear_operator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>

#include <numeric>

#include "core/fmt_torch.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"

namespace curv {

namespace {

// An InvalidArgument unless `x` is a 1-D vector of op's rows, dtype and device.
void check_vector(const LinearOperator& op, const at::Tensor& x, const char* what) {
  if (x.dim() != 1 || x.size(0) != op.rows() || x.scalar_type() != op.dtype() ||
      x.device() != op.device()) {
    throw InvalidArgument(fmt::format(
        "LinearOperator::{} {} tensor of shape [{}] on {}; the operator takes a {} vector of {} "
        "entries on {}",
        what, c10::toString(x.scalar_type()), fmt::join(x.sizes(), ", "), x.device().str(),
        dtype_name(op.dtype()), op.rows(), op.device().str()));
  }
}

}  // namespace

at::Tensor LinearOperator::apply(const at::Tensor& x) {
  check_vector(*this, x, "apply: x is a");
  at::Tensor y = product(x);
  ++applies_;
  return y;
}

void LinearOperator::apply_add(const at::Tensor& x, const at::Tensor& y) {
  check_vector(*this, x, "apply_add: x is a");
  check_vector(*this, y, "apply_add: y is a");
  if (!y.is_contiguous() || x.is_same(y) || (x.storage().is_alias_of(y.storage()))) {
    throw InvalidArgument(
        "LinearOperator::apply_add: y must be a contiguous vector that does not share x's memory");
  }
  product_add(x, y);
  ++applies_;
}

void LinearOperator::apply_host(const double* x, double* y) {
  const int64_t n = rows();
  const at::Tensor in = at::from_blob(const_cast<double*>(x), {n}, at::kDouble)
                            .to(device(), dtype(), false,
                                /*copy=*/true);
  const at::Tensor out = apply(in).to(at::kCPU, at::kDouble).contiguous();
  std::copy_n(out.data_ptr<double>(), n, y);
}

at::TensorOptions vector_options(const LinearOperator& op) {
  return at::TensorOptions().dtype(op.dtype()).device(op.device());
}

at::ScalarType krylov_dtype(at::ScalarType params, at::ScalarType declared) {
  if (declared != at::ScalarType::Undefined) return declared;
  return is_16_bit(params) ? at::kFloat : at::kDouble;
}

at::ScalarType krylov_dtype(const CurvatureEngine& engine) {
  return krylov_dtype(engine.parameter_dtype(), engine.options().vector_dtype);
}

HessianOperator::HessianOperator(CurvatureEngine& engine, std::vector<size_t> params,
                                 at::ScalarType dtype)
    : engine_(engine),
      params_(std::move(params)),
      dtype_(dtype == at::ScalarType::Undefined ? krylov_dtype(engine) : dtype) {
  const auto& space = engine_.space();
  if (params_.empty()) {
    params_.resize(space.size());
    std::iota(params_.begin(), params_.end(), 0);
  }
  std::vector<bool> seen(space.size(), false);
  for (size_t i : params_) {
    if (i >= space.size()) {
      throw InvalidArgument(
          fmt::format("HessianOperator: parameter index {} out of range [0, {})", i, space.size()));
    }
    if (seen[i]) {
      throw InvalidArgument(
          fmt::format("HessianOperator: parameter '{}' (index {}) listed twice", space[i].name, i));
    }
    seen[i] = true;
    rows_ += space[i].numel;
  }
}

c10::Device HessianOperator::device() const { return engine_.device(); }

at::Tensor HessianOperator::product(const at::Tensor& x) {
  at::Tensor out = at::empty({rows_}, x.options());
  write_product(x, out, /*add=*/false);
  return out;
}

void HessianOperator::product_add(const at::Tensor& x, const at::Tensor& y) {
  write_product(x, y, /*add=*/true);
}

void HessianOperator::write_product(const at::Tensor& x, const at::Tensor& y, bool add) {
  const auto& space = engine_.space();
  // x and y as per-parameter views of the flat vectors: the engine converts each view of x to the
  // parameters' dtype (no copy when it is theirs) and adds the product's shares into y's views in
  // the operator's dtype. A sub-matrix's views exist on S alone: the second backward starts from
  // S's gradients and differentiates toward S only, so autograd skips every product that cannot
  // reach H_SS x.
  ParamVector v(space.size()), hv(space.size());
  int64_t offset = 0;
  for (size_t i : params_) {
    v[i] = x.narrow(0, offset, space[i].numel).reshape(space[i].shape);
    hv[i] = y.narrow(0, offset, space[i].numel).view(space[i].shape);
    offset += space[i].numel;
  }
  engine_.hvp_into(v, params_, params_, hv, add);
}

ScaledOperator::ScaledOperator(LinearOperator& inner, const Eigen::VectorXd& d) : inner_(inner) {
  if (d.size() != inner_.rows()) {
    throw InvalidArgument(fmt::format("ScaledOperator: scaling has {} entries, operator {} rows",
                                      d.size(), inner_.rows()));
  }
  d_ = at::from_blob(const_cast<double*>(d.data()), {d.size()}, at::kDouble)
           .to(inner_.device(), inner_.dtype(), false, /*copy=*/true);
}

at::Tensor ScaledOperator::product(const at::Tensor& x) { return inner_.apply(x * d_).mul_(d_); }

DenseOperator::DenseOperator(Eigen::MatrixXd matrix) : matrix_(std::move(matrix)) {
  if (matrix_.rows() != matrix_.cols()) {
    throw InvalidArgument(fmt::format("DenseOperator: matrix is {}x{}, must be square",
                                      matrix_.rows(), matrix_.cols()));
  }
}

at::Tensor DenseOperator::product(const at::Tensor& x) {
  const at::Tensor in = x.contiguous();
  at::Tensor y = at::empty({matrix_.rows()}, at::kDouble);
  Eigen::Map<Eigen::VectorXd>(y.data_ptr<double>(), matrix_.rows()) =
      matrix_ * Eigen::Map<const Eigen::VectorXd>(in.data_ptr<double>(), matrix_.cols());
  return y;
}

Eigen::MatrixXd to_dense(LinearOperator& op) {
  const int64_t n = op.rows();
  Eigen::MatrixXd out(n, n);
  Eigen::VectorXd e = Eigen::VectorXd::Zero(n);
  for (int64_t j = 0; j < n; ++j) {
    e[j] = 1.0;
    op.apply_host(e.data(), out.col(j).data());
    e[j] = 0.0;
  }
  return out;
}

Eigen::MatrixXd dense_hessian(CurvatureEngine& engine) {
  Objective& objective = engine.objective();
  ParamVector params = objective.parameters();
  const int64_t n = engine.space().numel();
  Eigen::MatrixXd h = Eigen::MatrixXd::Zero(n, n);
  const ProbeSet probe = engine.probe();
  for (size_t b = 0; b < probe.size(); ++b) {
    at::Tensor loss = objective.loss(probe[b]);
    auto grads = torch::autograd::grad({loss}, params, {}, true, true, true);
    std::vector<at::Tensor> flat_parts;
    for (size_t i = 0; i < grads.size(); ++i) {
      flat_parts.push_back(grads[i].defined()
                               ? grads[i].reshape(-1)
                               : at::zeros({params[i].numel()}, params[i].options()));
    }
    at::Tensor flat = at::cat(flat_parts);
    const double w = probe.weight(b);
    for (int64_t r = 0; r < n; ++r) {
      if (!flat[r].requires_grad()) continue;
      auto row = torch::autograd::grad({flat[r]}, params, {}, true, false, true);
      int64_t offset = 0;
      for (size_t i = 0; i < row.size(); ++i) {
        if (row[i].defined()) {
          auto values = row[i].to(at::kCPU, at::kDouble).contiguous();
          for (int64_t k = 0; k < values.numel(); ++k) {
            h(r, offset + k) += w * values.data_ptr<double>()[k];
          }
        }
        offset += params[i].numel();
      }
    }
  }
  return h;
}

}  // namespace curv
