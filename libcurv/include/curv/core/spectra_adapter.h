// Adapter from curv::LinearOperator to Spectra's matrix-operation concept (rows(), cols(),
// perform_op), so Spectra's Lanczos solvers run on Hessians without forming them.
#pragma once

#include <Eigen/Core>

#include "curv/core/linear_operator.h"

namespace curv {

class SpectraOperator {
 public:
  using Scalar = double;
  explicit SpectraOperator(LinearOperator& op) : op_(&op) {}
  Eigen::Index rows() const { return op_->rows(); }
  Eigen::Index cols() const { return op_->rows(); }
  // Spectra calls this const; the operator's counters still advance.
  void perform_op(const Scalar* x_in, Scalar* y_out) const { op_->apply_host(x_in, y_out); }

 private:
  LinearOperator* op_;
};

}  // namespace curv
