// An Objective whose loss is evaluated by Python on a live torch.nn.Module: the graph is the one
// torch's autograd records while the module's own forward runs, and the engine's second backward
// runs on it in C++. The engine's batches carry (batch, row) pairs into the user's batches, which
// Python keeps and slices (curv/_evaluator.py), so any batch structure and any micro-batch works.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <vector>

#include "curv/core/objective.h"

namespace curv::python {

namespace py = pybind11;

class PythonObjective : public Objective {
 public:
  // `evaluator`: a curv._evaluator.Evaluator, whose loss(rows), logits(rows) and
  // token_losses(rows) take an int64 [n, 2] tensor of (batch, row) pairs. `params`: the module's
  // parameters (leaves requiring grad) under `names`. `structure_json`: a mapping for
  // ModelStructure::from_mapping (head counts, role overrides); empty: the name rules.
  PythonObjective(py::object evaluator, const std::vector<std::string>& names, ParamVector params,
                  bool has_logits, std::string description, const std::string& structure_json);
  ~PythonObjective() override;

  const ParamSpace& space() const override { return space_; }
  ParamVector parameters() override { return params_; }
  at::Tensor loss(const Batch& batch) override;
  at::Tensor logits(const Batch& batch) override;
  at::Tensor token_losses(const Batch& batch) override;
  std::string describe() const override { return description_; }
  ModelStructure structure() const override { return structure_; }

  // Re-raises, with its traceback, a Python exception the evaluator raised during the last call
  // into libcurv (which saw it as a ModelError); a no-op when none is pending.
  void raise_pending();

 private:
  at::Tensor call(const char* method, const Batch& batch);
  // ModelError saying what `needs` logits when the objective returns a scalar loss.
  void require_logits(const char* needs) const;

  py::object evaluator_;
  ParamVector params_;
  ParamSpace space_;
  ModelStructure structure_;
  bool has_logits_;
  std::string description_;
  std::unique_ptr<py::error_already_set> pending_;
};

}  // namespace curv::python
