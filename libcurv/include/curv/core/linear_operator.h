// LinearOperator: a symmetric matrix known only through y = A x. Vectors are 1-D tensors of the
// operator's dtype (float64 unless it declares another: the Hessian of a 16-bit model takes
// float32) on the operator's device (the parameters' device for the Hessian), so the
// eigen-solvers and trace estimators, which take nothing else, move no vector between host and
// device per product; their dot products and norms accumulate in float64 whatever the dtype.
// Dense test matrices share the interface on the CPU.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <Eigen/Core>
#include <cstdint>
#include <vector>

namespace curv {

class CurvatureEngine;

class LinearOperator {
 public:
  virtual ~LinearOperator() = default;
  virtual int64_t rows() const = 0;
  // Where the vectors of apply() live, and their dtype.
  virtual c10::Device device() const { return c10::Device(c10::kCPU); }
  virtual at::ScalarType dtype() const { return at::kDouble; }
  // y = A x for a 1-D tensor x of rows() entries of dtype() on device(); y is a new tensor alike.
  // An x of another shape, dtype or device is an InvalidArgument.
  at::Tensor apply(const at::Tensor& x);
  // The same on host buffers of rows() doubles that do not alias: one copy of x to device() and
  // one of y back. For solvers that work on host memory (Spectra) and for to_dense.
  void apply_host(const double* x, double* y);
  // y ← y + A x in y's own memory, x and y as for apply() (each checked) and not aliased: a
  // recurrence forms A q − β q′ where q′ was, one vector less than apply() and a subtraction.
  // Counts as one application.
  void apply_add(const at::Tensor& x, const at::Tensor& y);
  int64_t num_applies() const { return applies_; }

 protected:
  // A x, for an x that apply() has checked.
  virtual at::Tensor product(const at::Tensor& x) = 0;
  // y += A x for checked x and y: apply()'s product added, unless the operator writes its
  // product into y directly.
  virtual void product_add(const at::Tensor& x, const at::Tensor& y) { y.add_(product(x)); }

 private:
  int64_t applies_ = 0;
};

// Options of a vector of `op`: op.dtype() on op.device().
at::TensorOptions vector_options(const LinearOperator& op);

// The Hessian of the engine's objective at its current parameters. With `params` given, the
// operator is the principal sub-matrix H_SS for those parameters (coordinates concatenated in
// the order given): x is zero outside S and y is read on S only. Vectors live on the engine's
// device in `dtype` (Undefined: krylov_dtype(engine)); each product converts x to the
// parameters' dtype there, and the engine adds each batch's (or, under layer-wise
// recomputation, each layer's) share of the product into the result's memory
// (CurvatureEngine::hvp_into): no vector is split off or concatenated.
class HessianOperator : public LinearOperator {
 public:
  explicit HessianOperator(CurvatureEngine& engine, std::vector<size_t> params = {},
                           at::ScalarType dtype = at::ScalarType::Undefined);
  int64_t rows() const override { return rows_; }
  c10::Device device() const override;
  at::ScalarType dtype() const override { return dtype_; }
  const std::vector<size_t>& params() const { return params_; }

 protected:
  at::Tensor product(const at::Tensor& x) override;
  void product_add(const at::Tensor& x, const at::Tensor& y) override;

 private:
  // x's and y's per-parameter views, written into by the engine.
  void write_product(const at::Tensor& x, const at::Tensor& y, bool add);

  CurvatureEngine& engine_;
  std::vector<size_t> params_;
  int64_t rows_ = 0;
  at::ScalarType dtype_ = at::kDouble;
};

// The dtype of the Hessian's solver vectors (Lanczos bases, Hutch++ sketches, probes) for an
// engine: the vector dtype a program declared (EngineOptions::vector_dtype), else float64, and
// float32 for a 16-bit model, whose float64 vectors would take four times its parameters' memory
// each.
at::ScalarType krylov_dtype(const CurvatureEngine& engine);
// The same rule before an engine exists: for parameters of dtype `params` and a declared vector
// dtype (Undefined when none was declared).
at::ScalarType krylov_dtype(at::ScalarType params, at::ScalarType declared);

// A dense symmetric matrix on the CPU (tests, small reference problems).
class DenseOperator : public LinearOperator {
 public:
  explicit DenseOperator(Eigen::MatrixXd matrix);
  int64_t rows() const override { return matrix_.rows(); }
  const Eigen::MatrixXd& matrix() const { return matrix_; }

 protected:
  at::Tensor product(const at::Tensor& x) override;

 private:
  Eigen::MatrixXd matrix_;
};

// y = D A D x for a diagonal D = diag(d): A in coordinates scaled by d. With d = P^-1/2 for
// Adam's preconditioner P, its top eigenvalue is the preconditioned sharpness. d is copied to
// the inner operator's device once.
class ScaledOperator : public LinearOperator {
 public:
  ScaledOperator(LinearOperator& inner, const Eigen::VectorXd& d);
  int64_t rows() const override { return inner_.rows(); }
  c10::Device device() const override { return inner_.device(); }
  at::ScalarType dtype() const override { return inner_.dtype(); }

 protected:
  at::Tensor product(const at::Tensor& x) override;

 private:
  LinearOperator& inner_;
  at::Tensor d_;
};

// The matrix of `op`, column by column (rows() applications).
Eigen::MatrixXd to_dense(LinearOperator& op);

// The dense Hessian by differentiating each gradient entry separately (one backward per row), a
// path independent of the HVP code, used as the reference in tests. Small models only.
Eigen::MatrixXd dense_hessian(CurvatureEngine& engine);

}  // namespace curv
