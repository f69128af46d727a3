// Optimizers as update rules u = rule(θ, g, state): the same objects train models (θ ← θ + u),
// rebuild the step an optimizer would take at a checkpoint from its saved state, and take what-if
// steps from fresh state. AdamW, Adam, Muon (and variants), NorMuon, torch.optim.Muon, SGD,
// signSGD, Signum, Lion, NAdam, RAdam, Adafactor, AdEMAMix, SOAP, Shampoo, PSGD-Kron, Adam-mini,
// SCION, AdaMuon, MARS and Schedule-Free AdamW (docs/optimizers.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "curv/core/param_space.h"
#include "curv/core/structure.h"
#include "curv/core/tensor_source.h"

namespace curv {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Hyper-parameters of every optimizer; each reads the fields its optimizer_table() entry lists
// (docs/optimizers.md), and a spec may set only those.
struct OptimizerConfig {
  std::string name = "adamw";  // an optimizer_table() name: adamw | muon | normuon | sgd | ...
  double lr = 1e-3;
  double weight_decay = 0.0;  // decoupled (θ ← θ(1 − lr·wd)) except SGD's L2 form
  double beta1 = 0.9;         // AdamW/Lion β₁; Signum/Muon/SGD use `momentum`
  double beta2 = 0.999;       // AdamW β₂; Lion β₂; NorMuon second-moment β₂
  double eps = 1e-8;          // AdamW ε
  double momentum = 0.0;      // SGD μ, Signum β, Muon/NorMuon μ
  double dampening = 0.0;     // SGD τ
  bool nesterov = false;      // SGD and Muon
  // Muon family
  bool sum_momentum = false;  // B = μB + g (torch.optim.Muon, Moonlight) instead of the EMA form
  bool rms_scale = false;     // scale 0.2·sqrt(max(rows, cols)) instead of sqrt(max(1, rows/cols))
  int64_t ns_steps = 5;       // Newton–Schulz iterations
  // The Newton–Schulz quintic's coefficients: X ← a X + (b A + c A²) X with A = X Xᵀ. Keller
  // Jordan's reference (3.4445, −4.7750, 2.0315) by default; modded-nanogpt's
  // train_gpt_simple.py uses (2, −1.5, 0.5) with 12 steps.
  double ns_a = 3.4445;
  double ns_b = -4.7750;
  double ns_c = 2.0315;
  bool exact_polar = false;  // U Vᵀ from an SVD instead of Newton–Schulz (analysis only)
  // The AdamW that Muon/NorMuon apply to parameters outside their partition.
  double adam_lr = 1e-3;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  double adam_eps = 1e-8;
  double adam_weight_decay = 0.0;
  // Parameters the Muon family orthogonalises (regex on names). Empty: every parameter with
  // ndim >= 2 except embeddings and the output head.
  std::string muon_params;
  // torch.optim.Muon's learning-rate adjustment (adjust_lr_fn): 0 "original" sqrt(max(1, A/B)),
  // 1 "match_rms_adamw" 0.2·sqrt(max(A, B)), 2 "spectral_unclamped" sqrt(A/B).
  int64_t adjust_lr = 0;
  // NAdam, RAdam, AdEMAMix: decoupled weight decay θ ← θ(1 − lr·wd) instead of L2 in the gradient.
  bool decoupled = false;
  double momentum_decay = 4e-3;  // NAdam ψ
  // Adafactor (torch.optim): β₂ₜ = 1 − t^beta2_decay; eps (ε₁, 0 for torch's None: the
  // parameter dtype's machine epsilon) and eps2 (ε₂); clip_threshold is torch's d.
  double beta2_decay = -0.8;
  double eps2 = 1e-3;
  double clip_threshold = 1.0;
  // AdEMAMix: the slow EMA's β₃, its weight alpha, their warm-up length (0: none) and whether
  // decoupled decay ignores lr.
  double beta3 = 0.9999;
  double alpha = 5.0;
  double t_alpha_beta3 = 0.0;
  bool fixed_decay = false;
  // SOAP: Kronecker factors' EMA (shampoo_beta, 0: beta2), their eigenbasis refresh period, the
  // largest dimension preconditioned, and the options of pytorch-optimizer's SOAP.
  double shampoo_beta = 0.0;
  int64_t precondition_frequency = 10;
  int64_t max_precondition_dim = 10000;
  bool precondition_1d = false;
  bool correct_bias = true;
  bool normalize_gradient = false;
  // Shampoo: the statistics' starting multiple of I (matrix_eps); its inverse roots are recomputed
  // every precondition_frequency steps.
  double matrix_eps = 1e-6;
  // PSGD-Kron: the factors are fitted every 1/update_probability steps (−1: the reference's
  // default schedule of the step count), counted from update_counter, its param_groups' count
  // since the last fit; fit at precondition_lr from precondition_init_scale·I. A dimension of
  // size above max_size_triangular, or every dimension of a tensor of fewer than
  // min_ndim_triangular, keeps a diagonal factor; memory_save_mode makes more diagonal (0 None,
  // 1 one_diag, 2 smart_one_diag, 3 all_diag). Factors are kept in precondition_dtype (32:
  // float32, 64: float64, 0: the parameter's dtype); momentum_into_precondition_update fits them
  // to the momentum rather than the gradient.
  double update_probability = -1.0;
  int64_t update_counter = 0;
  int64_t max_size_triangular = 8192;
  int64_t min_ndim_triangular = 2;
  int64_t memory_save_mode = 0;
  double precondition_lr = 0.1;
  double precondition_init_scale = 1.0;
  int64_t precondition_dtype = 32;
  bool momentum_into_precondition_update = true;
  // Adam-mini: the entries of one head of a query or key block (the reference's dim·dim /
  // n_heads; its defaults 2048 and 32).
  int64_t head_numel = 131072;
  // SCION: the linear minimisation oracle of each step (lmo: 0 none, 1 auto, 2 spectral, 3
  // spectral of a convolution, 4 sign, 5 bias RMS, 6 column, 7 row; its norm_kwargs: normalize,
  // −1 for the oracle's own default, transpose, max_scale, and ns_steps), the radius it is scaled
  // by (scale), and constraint (θ ← (1 − lr)θ instead of weight decay).
  int64_t lmo = 1;
  int64_t lmo_normalize = -1;
  bool lmo_transpose = false;
  bool lmo_max_scale = false;
  double scale = 1.0;
  bool constraint = false;
  // Schedule-Free AdamW: its linear warm-up, the average's weights ((k+1)^r · lr_max^
  // weight_lr_power), and the running sum of those weights and largest lr so far, which its
  // param_groups carry from step to step.
  int64_t warmup_steps = 0;
  double r = 0.0;
  double weight_lr_power = 2.0;
  double weight_sum = 0.0;
  double lr_max = -1.0;
  // MARS (its AdamW type): the variance-reduction weight gamma on matrices (every parameter with
  // optimize_1d), and the plain AdamW of its vectors: lr·lr_1d_factor, betas_1d, weight_decay_1d.
  double gamma = 0.025;
  bool optimize_1d = false;
  double lr_1d_factor = 1.0;
  double beta1_1d = 0.9;
  double beta2_1d = 0.95;
  double weight_decay_1d = 0.1;

  // The table entry's defaults (REFERENCES.md): adamw lr 1e-3, β (0.9, 0.999), ε 1e-8,
  // wd 1e-2; muon lr 0.02, μ 0.95, Nesterov; normuon lr 0.02, μ 0.95, β₂ 0.95; sgd lr 0.1;
  // signsgd lr 1e-3; signum lr 1e-3, β 0.9; lion lr 1e-4, β (0.9, 0.99). InvalidArgument naming
  // the known optimizers for any other name.
  static OptimizerConfig defaults(const std::string& name);
  // "adamw", "adamw:lr=1e-3,weight_decay=0.1", "muon:sum_momentum=1,rms_scale=1"; keys are the
  // field names the optimizer reads. Starts from defaults(name). InvalidArgument names the bad
  // key or value.
  static OptimizerConfig parse(const std::string& spec);
  // One field by name, as a user sets it: InvalidArgument naming the optimizer and the key, and
  // listing the keys it reads, when this optimizer does not read that field (adamw's momentum).
  void set(const std::string& key, const std::string& value);
  // Any field by name, read by this optimizer or not: how stored metadata is applied, since
  // checkpoints record every field (hyper()) whatever optimizer saved them.
  void set_stored(const std::string& key, const std::string& value);
  // Numeric fields by name, as stored in meta.json's "optimizer.hyper".
  std::vector<std::pair<std::string, double>> hyper() const;
  std::string to_json() const;  // {"name": ..., "hyper": {...}, "muon_params": ...}
  void validate() const;
};

// The optimizer a run was saved by, as the user names it (ndsprobe's --optimizer, a
// ProbeRunOptions::optimizer): "adam", "muon:ns_steps=5". The keys are checked as
// OptimizerConfig::parse checks them (InvalidArgument naming the key or value); "" names none.
struct NamedOptimizer {
  std::string rule;
  std::vector<std::pair<std::string, double>> hyper;  // the keys the spec sets, booleans as 0/1
  std::optional<std::string> muon_params;
  static NamedOptimizer parse(const std::string& spec);
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  const OptimizerConfig& config() const { return config_; }
  OptimizerConfig& mutable_config() { return config_; }  // e.g. the lr of a schedule
  int64_t step_count() const { return step_count_; }

  // The displacement u of the next step from θ with gradient g; advances the state.
  ParamVector step(const ParamVector& theta, const ParamVector& grad);
  // The same u without touching the state.
  ParamVector peek(const ParamVector& theta, const ParamVector& grad) const;
  // The step after `step_count` steps whose state is saved in `state` ("<param>.<key>", checked
  // as load_state checks it), without holding that state: each parameter's state is read onto
  // its device when its step is taken and dropped after, so that at most one parameter's state is
  // resident. Equal to load_state then step(). The optimizer keeps no state afterwards; its
  // step count is step_count + 1.
  ParamVector step_from_saved(const ParamVector& theta, const ParamVector& grad,
                              const TensorSource& state, int64_t step_count,
                              const std::string& source);
  // What the last step_from_saved left out of the reference's step, for the unit's note (Kron's
  // preconditioner fit, drawn from a generator no state holds); empty when it is that step.
  const std::string& step_note() const { return note_; }

  // State as "<param>.<key>" tensors (PyTorch's key names: exp_avg, exp_avg_sq,
  // momentum_buffer, ...), and back. load_state checks every tensor's presence and shape and
  // names the parameter and key on error; `source` names the file in messages.
  NamedTensors state() const;
  void load_state(const NamedTensors& tensors, int64_t step_count, const std::string& source);
  // Which rule each parameter gets ("muon" or "adamw" for the Muon family, else the name).
  std::vector<std::string> partition() const;
  // Whether a step rebuilt after the first update needs saved state: false when no parameter
  // keeps any (signsgd; sgd without momentum), so a checkpoint without optimizer.safetensors
  // still determines the step.
  bool needs_saved_state() const;
  // meta.json's "optimizer" object: name, hyper, step_count, muon_params and the partition
  // ({"param": "muon" | "adamw" | ...}), as checkpoints record it.
  std::string meta_json() const;
  virtual std::unique_ptr<Optimizer> clone() const = 0;

 protected:
  Optimizer(OptimizerConfig config, const ParamSpace& space);
  // Per-parameter rule: writes u for parameter i and updates its state slots.
  virtual at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& grad,
                            int64_t t) = 0;
  // State slots parameter i needs (e.g. {"exp_avg", "exp_avg_sq"}).
  virtual std::vector<std::string> slots(size_t i) const = 0;
  virtual std::string rule(size_t) const { return config_.name; }
  // Shape of a state slot; the parameter's shape unless a rule keeps reduced statistics.
  virtual std::vector<int64_t> slot_shape(size_t i, const std::string& key) const;
  // A slot kept in a dtype of its own rather than the parameter's (NAdam's mu_product, a float32
  // scalar in torch): saved state keeps its stored dtype, fresh state starts in this one.
  virtual std::optional<at::ScalarType> slot_dtype(size_t, const std::string&) const {
    return std::nullopt;
  }
  at::Tensor& slot(size_t i, const std::string& key, const at::Tensor& like);
  // Whether parameter i holds the slot `key` yet: false before its first step, whatever the step
  // count (torch.optim.SGD starts its buffer when it has none, and saves no count).
  bool has_slot(size_t i, const std::string& key) const;
  // Parameter i's slots as `saved` holds them, each read into a tensor of `options` (its stored
  // dtype on the CPU when unset). A slot `saved` lacks is left out when step_count is 0 (the state
  // starts at zero), else InvalidArgument naming `source`, the state, the rule and the parameter;
  // a shape other than slot_shape is InvalidArgument naming both shapes.
  std::vector<std::pair<std::string, at::Tensor>> saved_slots(
      size_t i, const TensorSource& saved, int64_t step_count, const std::string& source,
      const std::optional<at::TensorOptions>& options) const;
  void check_step_arguments(const ParamVector& theta, const ParamVector& grad) const;
  // True while step_from_saved takes its step: the state is dropped after it, so work that only
  // shapes later steps (SOAP's factor updates and eigenbasis refreshes) can be left out.
  bool state_dropped() const { return state_dropped_; }

  OptimizerConfig config_;
  ParamSpace space_;
  int64_t step_count_ = 0;
  bool state_dropped_ = false;
  std::string note_;  // step_note()
  // state_[i][key]
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> state_;
};

// One optimizer libcurv implements: everything spec parsing, make_optimizer, the direction
// families, messages and docs/optimizers.md say about it comes from this entry.
struct OptimizerEntry {
  std::string name;               // "adamw", ...: the spec's and the direction family's name
  std::string help;               // one line, for docs and --help texts
  std::vector<std::string> keys;  // the fields the rule reads: what a spec may set
  OptimizerConfig defaults;       // the starting point of a spec (name set)
  std::unique_ptr<Optimizer> (*make)(const OptimizerConfig&, const ParamSpace&,
                                     const ModelStructure&);

  bool reads(const std::string& key) const;
};

// Every optimizer, in the order messages and docs list them.
const std::vector<OptimizerEntry>& optimizer_table();
// The entry named `name`; InvalidArgument naming it and the known optimizers otherwise.
const OptimizerEntry& optimizer_entry(const std::string& name);
std::vector<std::string> optimizer_names();

// The optimizer `config.name` names, configured by `config` (validated). The Muon family's
// default partition (no muon_params) orthogonalises the structure's hidden matrices: ndim >= 2,
// not embeddings or head (objective.structure() for a model; without one, the name rules,
// ModelStructure::from_names(space)).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const ParamSpace& space,
                                          const ModelStructure& structure);
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const ParamSpace& space);

// Newton–Schulz quintic orthogonalisation (coefficients 3.4445, −4.7750, 2.0315) of a matrix
// (4-D tensors viewed as (out, −1)), after Frobenius normalisation; transposes when rows > cols.
at::Tensor newton_schulz(const at::Tensor& g, int64_t steps = 5);
// The same with the quintic's coefficients (a, b, c): X ← a X + (b A + c A²) X, A = X Xᵀ.
at::Tensor newton_schulz(const at::Tensor& g, int64_t steps, double a, double b, double c);
// U Vᵀ from the thin SVD of g: the exact polar factor, the limit of Newton–Schulz. Directions of
// singular values below max(rows, cols)·eps·σ_max (a rank-deficient g) map to zero, as they do
// under Newton–Schulz.
at::Tensor polar_factor(const at::Tensor& g);
// Muon's scale for a rows x cols update: sqrt(max(1, rows/cols)), or 0.2·sqrt(max(rows, cols)).
double muon_scale(int64_t rows, int64_t cols, bool rms_scale);

}  // namespace curv
