// LinearOperator: a symmetric matrix known only through y = A x on float64 buffers. The Hessian
// (whole, or restricted to a set of parameters) and dense test matrices share this interface; the
// eigen-solvers and trace estimators take nothing else.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <vector>

namespace curv {

class CurvatureEngine;

class LinearOperator {
 public:
  virtual ~LinearOperator() = default;
  virtual int64_t rows() const = 0;
  // y = A x; x and y hold rows() doubles and do not alias.
  virtual void apply(const double* x, double* y) = 0;
  int64_t num_applies() const { return applies_; }

 protected:
  int64_t applies_ = 0;
};

// The Hessian of the engine's objective at its current parameters. With `params` given, the
// operator is the principal sub-matrix H_SS for those parameters (coordinates concatenated in
// the order given): x is zero outside S and y is read on S only.
class HessianOperator : public LinearOperator {
 public:
  explicit HessianOperator(CurvatureEngine& engine, std::vector<size_t> params = {});
  int64_t rows() const override { return rows_; }
  void apply(const double* x, double* y) override;
  const std::vector<size_t>& params() const { return params_; }

 private:
  CurvatureEngine& engine_;
  std::vector<size_t> params_;
  int64_t rows_ = 0;
};

class DenseOperator : public LinearOperator {
 public:
  explicit DenseOperator(Eigen::MatrixXd matrix);
  int64_t rows() const override { return matrix_.rows(); }
  void apply(const double* x, double* y) override;
  const Eigen::MatrixXd& matrix() const { return matrix_; }

 private:
  Eigen::MatrixXd matrix_;
};

// The matrix of `op`, column by column (rows() applications).
Eigen::MatrixXd to_dense(LinearOperator& op);

// The dense Hessian by differentiating each gradient entry separately (one backward per row), a
// path independent of the HVP code, used as the reference in tests. Small models only.
Eigen::MatrixXd dense_hessian(CurvatureEngine& engine);

}  // namespace curv
