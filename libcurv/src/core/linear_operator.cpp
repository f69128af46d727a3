#include "curv/core/linear_operator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <numeric>

#include "core/fmt_torch.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"

namespace curv {

HessianOperator::HessianOperator(CurvatureEngine& engine, std::vector<size_t> params)
    : engine_(engine), params_(std::move(params)) {
  const auto& space = engine_.space();
  if (params_.empty()) {
    params_.resize(space.size());
    std::iota(params_.begin(), params_.end(), 0);
  }
  for (size_t i : params_) {
    if (i >= space.size()) {
      throw InvalidArgument(
          fmt::format("HessianOperator: parameter index {} out of range [0, {})", i, space.size()));
    }
    rows_ += space[i].numel;
  }
}

void HessianOperator::apply(const double* x, double* y) {
  const auto& space = engine_.space();
  const ParamVector& like = engine_.gradient();
  ParamVector v = zeros_like(like);
  int64_t offset = 0;
  for (size_t i : params_) {
    auto chunk = at::from_blob(const_cast<double*>(x) + offset, space[i].shape, at::kDouble);
    v[i] = chunk.to(like[i].device(), like[i].scalar_type(), false, /*copy=*/true);
    offset += space[i].numel;
  }
  ParamVector hv = engine_.hvp(v);
  offset = 0;
  for (size_t i : params_) {
    auto flat = hv[i].detach().to(at::kCPU, at::kDouble).contiguous();
    std::copy_n(flat.data_ptr<double>(), flat.numel(), y + offset);
    offset += space[i].numel;
  }
  ++applies_;
}

DenseOperator::DenseOperator(Eigen::MatrixXd matrix) : matrix_(std::move(matrix)) {
  if (matrix_.rows() != matrix_.cols()) {
    throw InvalidArgument(fmt::format("DenseOperator: matrix is {}x{}, must be square",
                                      matrix_.rows(), matrix_.cols()));
  }
}

void DenseOperator::apply(const double* x, double* y) {
  Eigen::Map<Eigen::VectorXd>(y, matrix_.rows()) =
      matrix_ * Eigen::Map<const Eigen::VectorXd>(x, matrix_.cols());
  ++applies_;
}

Eigen::MatrixXd to_dense(LinearOperator& op) {
  const int64_t n = op.rows();
  Eigen::MatrixXd out(n, n);
  Eigen::VectorXd e = Eigen::VectorXd::Zero(n);
  for (int64_t j = 0; j < n; ++j) {
    e[j] = 1.0;
    op.apply(e.data(), out.col(j).data());
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
