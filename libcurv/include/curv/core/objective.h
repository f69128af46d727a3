// Objective: the scalar mean loss of a model on a batch, as a function of its parameters. The
// curvature engine only ever sees this interface, so modules, TorchScript files and the built-in
// models are probed the same way.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "curv/core/param_space.h"
#include "curv/core/structure.h"

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace curv {

// One batch: inputs and targets share their first dimension (the examples).
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }
};

// A target id that cross-entropy leaves out of its mean (the default ignore_index of at::nll_loss
// and torch.nn.functional.cross_entropy): the loss averages over the other positions only.
constexpr int64_t kIgnoreIndex = -100;

// One linear map the loss ran, y = x Wᵀ + b (or x W + b: `transposed`, HF's Conv1D layout), with
// W and b parameters (indices into space()). The engine's block coupling reads the curvature of
// these weights from the map's input and output instead of the weights' own second derivatives
// (CurvatureEngine::coupling), so a parameter may appear here only when every use of it in the
// loss is listed: a weight shared with an embedding lookup (a tied head) is left out.
struct LinearUse {
  static constexpr size_t kNoBias = static_cast<size_t>(-1);
  at::Tensor input, output;  // x and y, in the loss's graph
  size_t weight = 0;
  size_t bias = kNoBias;
  bool transposed = false;
};

class Objective {
 public:
  virtual ~Objective() = default;
  // Names and shapes of the differentiable parameters, in a fixed order.
  virtual const ParamSpace& space() const = 0;
  // The live parameter tensors (leaves with requires_grad), aligned with space().
  virtual ParamVector parameters() = 0;
  // Mean loss over the batch: a 0-dim tensor, differentiable twice w.r.t. parameters().
  // Throws ModelError naming the shapes when the batch does not fit the model.
  virtual at::Tensor loss(const Batch& batch) = 0;
  // One line for logs and provenance, e.g. "gpt(n_layer=4, n_embd=128, ...)".
  virtual std::string describe() const = 0;
  // Per-target losses (shape of the targets) for per-bucket evaluation. Models scored by
  // cross-entropy provide them; the default throws ModelError.
  virtual at::Tensor token_losses(const Batch& batch);
  // Logits [..., C], differentiable w.r.t. parameters(), whose mean cross-entropy against
  // batch.targets is loss(batch): the rows of logits.reshape({-1, C}) are the positions of
  // batch.targets.reshape({-1}), and positions whose target is kIgnoreIndex are left out of the
  // mean as the loss leaves them. The Gauss-Newton split (gauss_newton.h) starts from them. The
  // batch is validated as loss() validates it. Built-in cross-entropy models and TorchScript
  // files in logits mode provide them; the default throws ModelError.
  virtual at::Tensor logits(const Batch& batch);
  // loss(batch), also appending to `uses` the linear maps it ran whose weights and biases are used
  // nowhere else (LinearUse). The built-in models list theirs; the default lists none, which
  // only makes the block coupling form every block's products in full.
  virtual at::Tensor loss_listing_linears(const Batch& batch, std::vector<LinearUse>& uses);
  // What each parameter is for (roles, layers, head counts, tied pairs), aligned with space().
  // The default applies the name rules (ModelStructure::from_names); built-in architectures
  // return their exact structure, TorchScript models may take a user mapping file.
  virtual ModelStructure structure() const;
  // A mixture of experts' routing on the batch: the experts each token is sent to, one row per
  // (routed layer, token) with its k expert indices in ascending order, int64 [rows, k]. An
  // undefined tensor (the default) for a model without routing. Evaluated without gradients.
  virtual at::Tensor expert_choices(const Batch& batch);
  // The loss as a chain of stages, for layer-wise recomputation (EngineOptions::recompute_layers):
  // x_1 = loss_stage(0, undefined, batch), x_{s+1} = loss_stage(s, x_s, batch), and the last
  // stage returns loss(batch), each a function of its x_s and the parameters only (what a stage
  // derives from the batch alone, a position table or a mask, it derives again). 0 (the default):
  // not staged.
  virtual size_t loss_stages() const;
  // Stage `stage` of loss(batch) (above); the first validates the batch as loss() does. The
  // default throws ModelError.
  virtual at::Tensor loss_stage(size_t stage, const at::Tensor& x, const Batch& batch);
  // Floating dtype of the parameters.
  at::ScalarType dtype();
  c10::Device device();
};

// Copies `values` into the objective's parameters (shapes must match; dtype is converted).
void load_parameters(Objective& objective, const ParamVector& values);
// Detached copies of the current parameter values.
ParamVector snapshot_parameters(Objective& objective);

// The loss of a torch::nn::Module on a batch, for custom LibTorch trainers. `loss_fn` runs the
// module and returns the scalar mean loss; the parameters are module->named_parameters().
using ModuleLossFn = std::function<at::Tensor(const Batch&)>;
std::unique_ptr<Objective> make_module_objective(std::shared_ptr<torch::nn::Module> module,
                                                 ModuleLossFn loss_fn,
                                                 std::string description = "module");

}  // namespace curv
