#include "curv/models/script_objective.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>

#include <filesystem>

#include "core/fmt_torch.h"
#include "core/strings.h"
#include "curv/core/error.h"

namespace curv {
namespace {

class ScriptObjective : public Objective {
 public:
  ScriptObjective(torch::jit::Module module, std::string path, ScriptMode mode,
                  const std::string& structure_mapping)
      : module_(std::move(module)), path_(std::move(path)), mode_(mode) {
    std::vector<std::string> names;
    // A tied weight (a head sharing the embedding's tensor) is listed under each of its names
    // by TorchScript, but torch's named_parameters() and the checkpoints made from it name it
    // once: it is one parameter, under its first name, and the others are tied to it.
    std::vector<std::pair<std::string, std::string>> tied;
    for (const auto& item : module_.named_parameters(/*recurse=*/true)) {
      if (!item.value.requires_grad()) continue;
      bool alias = false;
      for (size_t i = 0; i < params_.size() && !alias; ++i) {
        const at::Tensor& p = params_[i];
        if (p.data_ptr() == item.value.data_ptr() && p.sizes() == item.value.sizes() &&
            p.strides() == item.value.strides()) {
          tied.emplace_back(item.name, names[i]);
          alias = true;
        }
      }
      if (alias) continue;
      names.push_back(item.name);
      params_.push_back(item.value);
    }
    if (params_.empty()) {
      throw ModelError(
          fmt::format("{}: the TorchScript module has no trainable parameters", path_));
    }
    space_ = ParamSpace(names, params_);
    // Loaded here so a bad mapping fails when the model is loaded, not mid-analysis.
    structure_ = structure_mapping.empty()
                     ? ModelStructure::from_names(space_)
                     : ModelStructure::from_mapping_file(structure_mapping, space_);
    for (const auto& pair : tied) structure_.tied.push_back(pair);
  }

  const ParamSpace& space() const override { return space_; }
  ModelStructure structure() const override { return structure_; }
  ParamVector parameters() override { return params_; }

  at::Tensor loss(const Batch& batch) override {
    at::Tensor inputs = batch.inputs;
    if (inputs.is_floating_point()) inputs = inputs.to(params_.front().scalar_type());
    at::Tensor targets = batch.targets;
    try {
      if (mode_ == ScriptMode::kLoss) {
        if (targets.is_floating_point()) targets = targets.to(params_.front().scalar_type());
        auto out = module_.forward({inputs, targets}).toTensor();
        if (out.numel() != 1) {
          throw ModelError(
              fmt::format("{}: forward(x, y) returned shape {}, expected the scalar "
                          "mean loss",
                          path_, out.sizes()));
        }
        return out.reshape({});
      }
      auto logits = module_.forward({inputs}).toTensor();
      const int64_t classes = logits.size(-1);
      return at::nll_loss(at::log_softmax(logits.reshape({-1, classes}), -1),
                          targets.reshape({-1}));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw forward_failed(inputs, targets, e);
    }
  }

  at::Tensor logits(const Batch& batch) override {
    if (mode_ == ScriptMode::kLoss) {
      throw ModelError(
          fmt::format("{}: the file's forward(x, y) returns the loss, but the Gauss-Newton split "
                      "needs the logits: export the model in logits mode, forward(x) -> logits "
                      "scored by cross-entropy against y",
                      path_));
    }
    at::Tensor inputs = batch.inputs;
    if (inputs.is_floating_point()) inputs = inputs.to(params_.front().scalar_type());
    const at::Tensor& targets = batch.targets;
    if (!targets.defined()) {
      throw ModelError(
          fmt::format("{}: the batch has no targets to score the logits against", path_));
    }
    at::Tensor logits;
    try {
      logits = module_.forward({inputs}).toTensor();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw forward_failed(inputs, targets, e);
    }
    // What nll_loss checks in loss(): one int64 target per row of logits.reshape({-1, C}).
    if (logits.dim() < 1 || !at::isFloatingType(logits.scalar_type()) ||
        targets.scalar_type() != at::kLong || logits.numel() != targets.numel() * logits.size(-1)) {
      throw ModelError(fmt::format(
          "{}: forward(x) returned {} logits of shape {} for {} targets of shape {}; "
          "expected floating logits [..., classes] with one int64 target per row",
          path_, logits.scalar_type(), logits.sizes(), targets.scalar_type(), targets.sizes()));
    }
    return logits;
  }

  std::string describe() const override { return "torchscript(" + path_ + ")"; }

 private:
  ModelError forward_failed(const at::Tensor& inputs, const at::Tensor& targets,
                            const std::exception& e) const {
    return ModelError(
        fmt::format("{}: forward failed on inputs of shape {} ({}) and targets of "
                    "shape {} ({}): {}",
                    path_, inputs.sizes(), inputs.scalar_type(), targets.sizes(),
                    targets.scalar_type(), brief_what(e)));
  }

  torch::jit::Module module_;
  std::string path_;
  ScriptMode mode_;
  ParamVector params_;
  ParamSpace space_;
  ModelStructure structure_;
};

}  // namespace

std::unique_ptr<Objective> load_script_objective(const std::string& path,
                                                 const ScriptOptions& options) {
  if (!std::filesystem::is_regular_file(path)) {
    throw FormatError(fmt::format("model file '{}' does not exist or is not a file", path));
  }
  // With the optimizing executor, float32 double backward through scripted graphs returns wrong
  // values from the third call on (LibTorch 1.13); the profiling-free path is exact.
  torch::jit::setGraphExecutorOptimize(false);
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, c10::Device(options.device));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw FormatError(
        fmt::format("model file '{}' is not a TorchScript archive (save it with "
                    "torch.jit.save(torch.jit.script(model), path)): {}",
                    path, brief_what(e)));
  }
  module.eval();
  if (options.dtype != at::ScalarType::Undefined) module.to(options.dtype);

  auto forward = module.find_method("forward");
  if (!forward) throw ModelError(fmt::format("model file '{}' has no forward method", path));
  // The schema's first argument is `self`.
  const size_t arity = forward->function().getSchema().arguments().size() - 1;
  ScriptMode mode = options.mode;
  if (mode == ScriptMode::kAuto) {
    if (arity == 2) {
      mode = ScriptMode::kLoss;
    } else if (arity == 1) {
      mode = ScriptMode::kLogits;
    } else {
      throw ModelError(
          fmt::format("model file '{}': forward takes {} arguments; expected "
                      "forward(x, y) -> loss or forward(x) -> logits",
                      path, arity));
    }
  }
  const size_t wanted = mode == ScriptMode::kLoss ? 2 : 1;
  if (arity != wanted) {
    throw ModelError(fmt::format("model file '{}': forward takes {} arguments, the mode needs {}",
                                 path, arity, wanted));
  }
  return std::make_unique<ScriptObjective>(std::move(module), path, mode,
                                           options.structure_mapping);
}

}  // namespace curv
