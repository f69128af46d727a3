#include "curv/core/objective.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include "core/fmt_torch.h"
#include "core/strings.h"
#include "curv/core/error.h"

namespace curv {

at::ScalarType Objective::dtype() {
  auto params = parameters();
  return params.empty() ? at::kFloat : params.front().scalar_type();
}

c10::Device Objective::device() {
  auto params = parameters();
  return params.empty() ? c10::Device(c10::kCPU) : params.front().device();
}

at::Tensor Objective::token_losses(const Batch&) {
  throw ModelError(fmt::format("{} does not provide per-target losses", describe()));
}

at::Tensor Objective::loss_listing_linears(const Batch& batch, std::vector<LinearUse>&) {
  return loss(batch);
}

at::Tensor Objective::expert_choices(const Batch&) { return {}; }

size_t Objective::loss_stages() const { return 0; }

at::Tensor Objective::loss_stage(size_t, const at::Tensor&, const Batch&) {
  throw ModelError(fmt::format("{} is not computed in stages", describe()));
}

at::Tensor Objective::logits(const Batch&) {
  throw ModelError(
      fmt::format("{}: the Gauss-Newton split needs a model scored by cross-entropy on logits "
                  "(the built-in gpt, mlp with loss cross_entropy or memory, or a TorchScript "
                  "file in logits mode, forward(x) -> logits); this objective gives only its loss",
                  describe()));
}

ModelStructure Objective::structure() const { return ModelStructure::from_names(space()); }

void load_parameters(Objective& objective, const ParamVector& values) {
  auto params = objective.parameters();
  const auto& space = objective.space();
  if (values.size() != params.size()) {
    throw InvalidArgument(fmt::format("load_parameters: {} values for {} parameters of {}",
                                      values.size(), params.size(), objective.describe()));
  }
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!values[i].sizes().equals(params[i].sizes())) {
      throw InvalidArgument(fmt::format("parameter '{}': value of shape {} for a model shape {}",
                                        space[i].name, shape_string(values[i].sizes().vec()),
                                        shape_string(params[i].sizes().vec())));
    }
    // variable_data() shares storage but not the version counter: kept autograd graphs stay
    // usable when the values are later restored bit for bit.
    params[i].variable_data().copy_(values[i]);
  }
}

ParamVector snapshot_parameters(Objective& objective) { return clone(objective.parameters()); }

}  // namespace curv
