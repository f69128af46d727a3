// The one translation unit that needs torch::nn (and so <torch/torch.h>).
#include <fmt/format.h>
#include <torch/torch.h>

#include "core/fmt_torch.h"
#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/core/objective.h"

namespace curv {
namespace {

class ModuleObjective : public Objective {
 public:
  ModuleObjective(std::shared_ptr<torch::nn::Module> module, ModuleLossFn loss_fn,
                  std::string description)
      : module_(std::move(module)),
        loss_fn_(std::move(loss_fn)),
        description_(std::move(description)) {
    std::vector<std::string> names;
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      if (!item.value().requires_grad()) continue;
      names.push_back(item.key());
      params_.push_back(item.value());
    }
    space_ = ParamSpace(names, params_);
  }

  const ParamSpace& space() const override { return space_; }
  ParamVector parameters() override { return params_; }
  at::Tensor loss(const Batch& batch) override {
    at::Tensor value;
    try {
      value = loss_fn_(batch);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw ModelError(fmt::format("{}: loss failed on a batch of inputs {} / targets {}: {}",
                                   description_, batch.inputs.sizes(), batch.targets.sizes(),
                                   brief_what(e)));
    }
    if (value.numel() != 1) {
      throw ModelError(fmt::format("{}: loss function returned shape {}, expected a scalar",
                                   description_, value.sizes()));
    }
    return value.reshape({});
  }
  std::string describe() const override { return description_; }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  ModuleLossFn loss_fn_;
  std::string description_;
  ParamVector params_;
  ParamSpace space_;
};

}  // namespace

std::unique_ptr<Objective> make_module_objective(std::shared_ptr<torch::nn::Module> module,
                                                 ModuleLossFn loss_fn, std::string description) {
  if (!module) throw InvalidArgument("make_module_objective: module is null");
  if (!loss_fn) throw InvalidArgument("make_module_objective: loss function is empty");
  return std::make_unique<ModuleObjective>(std::move(module), std::move(loss_fn),
                                           std::move(description));
}

}  // namespace curv
