#include "python_objective.h"

#include <fmt/format.h>

#include "curv/core/error.h"

namespace curv::python {

PythonObjective::PythonObjective(py::object evaluator, const std::vector<std::string>& names,
                                 ParamVector params, bool has_logits, std::string description,
                                 const std::string& structure_json)
    : evaluator_(std::move(evaluator)),
      params_(std::move(params)),
      has_logits_(has_logits),
      description_(std::move(description)) {
  if (names.size() != params_.size()) {
    throw InvalidArgument(
        fmt::format("{} parameter names for {} parameters", names.size(), params_.size()));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].defined() || !params_[i].requires_grad() || !params_[i].is_leaf()) {
      throw InvalidArgument(
          fmt::format("parameter '{}' is not a leaf tensor that requires grad", names[i]));
    }
  }
  space_ = ParamSpace(names, params_);
  structure_ = structure_json.empty()
                   ? ModelStructure::from_names(space_)
                   : ModelStructure::from_mapping(structure_json, space_, "the roles");
}

PythonObjective::~PythonObjective() {
  // The evaluator and a pending exception are Python objects: released under the GIL.
  py::gil_scoped_acquire gil;
  pending_.reset();
  evaluator_ = py::object();
}

at::Tensor PythonObjective::call(const char* method, const Batch& batch) {
  py::gil_scoped_acquire gil;
  try {
    py::object out = evaluator_.attr(method)(batch.inputs);
    return out.cast<at::Tensor>();
  } catch (py::error_already_set& e) {
    const std::string what = e.what();
    pending_ = std::make_unique<py::error_already_set>(std::move(e));
    throw ModelError(fmt::format("{}: {} raised {}", description_, method, what));
  } catch (const py::cast_error&) {
    throw ModelError(fmt::format("{}: {} did not return a tensor", description_, method));
  }
}

at::Tensor PythonObjective::loss(const Batch& batch) {
  at::Tensor value = call("loss", batch);
  if (value.numel() != 1) {
    throw ModelError(fmt::format("{}: the loss has shape {}, expected a scalar", description_,
                                 fmt::join(value.sizes(), ", ")));
  }
  return value.reshape({});
}

void PythonObjective::require_logits(const char* needs) const {
  if (!has_logits_) {
    throw ModelError(
        fmt::format("{}: the objective returns a scalar loss, not logits and targets: {}",
                    description_, needs));
  }
}

at::Tensor PythonObjective::logits(const Batch& batch) {
  require_logits("the Gauss-Newton split needs logits");
  return call("logits", batch);
}

at::Tensor PythonObjective::token_losses(const Batch& batch) {
  require_logits("token buckets need per-token losses");
  return call("token_losses", batch);
}

void PythonObjective::raise_pending() {
  if (!pending_) return;
  py::error_already_set e = std::move(*pending_);
  pending_.reset();
  throw e;
}

}  // namespace curv::python
