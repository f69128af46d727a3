// optimizer_table(): every rule libcurv implements, with the fields it reads and its defaults
// (the reference implementation's), and the lookups by name.
#include <fmt/format.h>

#include <algorithm>

#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/optim/optimizers.h"
#include "optim/rules.h"

namespace curv {

namespace {

// The defaults of `name`: OptimizerConfig's field defaults with `change` applied.
template <typename Change>
OptimizerConfig defaults_of(const char* name, Change change) {
  OptimizerConfig c;
  c.name = name;
  change(c);
  return c;
}

// libcurv's own rules: AdamW and Adam, the Muon family, SGD and the sign methods. The keys are the
// fields each rule's update() reads; the Muon family's AdamW part reads the adam_* fields on
// parameters outside its partition.
std::vector<OptimizerEntry> first_entries() {
  static const std::vector<std::string> kMuonKeys = {
      "lr",           "weight_decay", "momentum",    "nesterov",
      "sum_momentum", "rms_scale",    "ns_steps",    "ns_a",
      "ns_b",         "ns_c",         "exact_polar", "adam_lr",
      "adam_beta1",   "adam_beta2",   "adam_eps",    "adam_weight_decay",
      "muon_params"};
  std::vector<std::string> normuon_keys = kMuonKeys;
  normuon_keys.insert(normuon_keys.begin() + 3, "beta2");
  return std::vector<OptimizerEntry>{
      {"adamw",
       "AdamW (PyTorch semantics: bias correction, decoupled weight decay)",
       {"lr", "weight_decay", "beta1", "beta2", "eps"},
       defaults_of("adamw",
                   [](OptimizerConfig& c) {
                     c.lr = 1e-3;
                     c.weight_decay = 1e-2;
                   }),
       rules::adamw},
      {"adam",
       "Adam (PyTorch semantics: bias correction, weight decay coupled as an L2 term in the "
       "gradient)",
       {"lr", "weight_decay", "beta1", "beta2", "eps"},
       defaults_of("adam", [](OptimizerConfig& c) { c.lr = 1e-3; }),
       rules::adamw},
      {"muon",
       "Muon: Newton-Schulz-orthogonalised momentum on hidden matrices, AdamW (adam_*) on the "
       "rest",
       kMuonKeys,
       defaults_of("muon",
                   [](OptimizerConfig& c) {
                     c.lr = 0.02;
                     c.momentum = 0.95;
                     c.nesterov = true;
                   }),
       rules::muon_family},
      {"normuon", "NorMuon: Muon with a row-wise second moment after orthogonalisation",
       normuon_keys,
       defaults_of("normuon",
                   [](OptimizerConfig& c) {
                     c.lr = 0.02;
                     c.momentum = 0.95;
                     c.beta2 = 0.95;
                     c.nesterov = true;
                   }),
       rules::muon_family},
      {"sgd",
       "SGD with momentum, dampening, Nesterov and L2 weight decay (torch.optim.SGD)",
       {"lr", "weight_decay", "momentum", "dampening", "nesterov"},
       defaults_of("sgd", [](OptimizerConfig& c) { c.lr = 0.1; }),
       rules::sgd},
      {"signsgd",
       "signSGD: the sign of the gradient, decoupled weight decay",
       {"lr", "weight_decay"},
       defaults_of("signsgd", [](OptimizerConfig& c) { c.lr = 1e-3; }),
       rules::signsgd},
      {"signum",
       "Signum: the sign of an EMA of gradients (momentum), decoupled weight decay",
       {"lr", "weight_decay", "momentum"},
       defaults_of("signum",
                   [](OptimizerConfig& c) {
                     c.lr = 1e-3;
                     c.momentum = 0.9;
                   }),
       rules::signum},
      {"lion",
       "Lion: the sign of an interpolation of momentum (beta1) and gradient, beta2 EMA",
       {"lr", "weight_decay", "beta1", "beta2"},
       defaults_of("lion",
                   [](OptimizerConfig& c) {
                     c.lr = 1e-4;
                     c.beta1 = 0.9;
                     c.beta2 = 0.99;
                   }),
       rules::lion},
  };
}

// The rules of other implementations' classes, each with their defaults: torch.optim's Muon, NAdam,
// RAdam and Adafactor, pytorch-optimizer's AdEMAMix and schedulefree's AdamWScheduleFree.
std::vector<OptimizerEntry> zoo_entries() {
  return std::vector<OptimizerEntry>{
      {"torch-muon",
       "torch.optim.Muon: moving-average momentum orthogonalised by Newton-Schulz in bfloat16 "
       "on hidden matrices, torch.optim.AdamW (adam_*) on the rest",
       {"lr", "weight_decay", "momentum", "nesterov", "ns_steps", "ns_a", "ns_b", "ns_c", "eps",
        "adjust_lr", "adam_lr", "adam_beta1", "adam_beta2", "adam_eps", "adam_weight_decay",
        "muon_params"},
       defaults_of("torch-muon",
                   [](OptimizerConfig& c) {
                     c.lr = 1e-3;
                     c.weight_decay = 0.1;
                     c.momentum = 0.95;
                     c.nesterov = true;
                     c.eps = 1e-7;
                     c.adam_beta2 = 0.999;  // torch.optim.AdamW's defaults
                     c.adam_weight_decay = 1e-2;
                   }),
       rules::torch_muon},
      {"nadam",
       "NAdam (torch.optim.NAdam): Nesterov momentum with the momentum-decay schedule; L2 or "
       "decoupled weight decay",
       {"lr", "weight_decay", "beta1", "beta2", "eps", "momentum_decay", "decoupled"},
       defaults_of("nadam", [](OptimizerConfig& c) { c.lr = 2e-3; }),
       rules::nadam},
      {"radam",
       "RAdam (torch.optim.RAdam): Adam with the variance rectification, SGD with momentum "
       "while it is undefined",
       {"lr", "weight_decay", "beta1", "beta2", "eps", "decoupled"},
       defaults_of("radam", [](OptimizerConfig& c) { c.lr = 1e-3; }),
       rules::radam},
      {"adafactor",
       "Adafactor (torch.optim.Adafactor): factored second moments, relative step size, "
       "update clipping",
       {"lr", "weight_decay", "beta2_decay", "eps", "eps2", "clip_threshold"},
       defaults_of("adafactor",
                   [](OptimizerConfig& c) {
                     c.lr = 1e-2;
                     c.eps = 0.0;
                   }),
       rules::adafactor},
      {"ademamix",
       "AdEMAMix (pytorch-optimizer): Adam plus a slow EMA of gradients weighted by alpha",
       {"lr", "weight_decay", "beta1", "beta2", "beta3", "alpha", "t_alpha_beta3", "eps",
        "decoupled", "fixed_decay"},
       defaults_of("ademamix", [](OptimizerConfig& c) { c.lr = 1e-3; }),
       rules::ademamix},
      {"adamw-schedulefree",
       "Schedule-Free AdamW (schedulefree): the step of y, where the gradient is taken, toward "
       "the iterate z and the weighted average x",
       {"lr", "weight_decay", "beta1", "beta2", "eps", "warmup_steps", "r", "weight_lr_power",
        "weight_sum", "lr_max"},
       defaults_of("adamw-schedulefree", [](OptimizerConfig& c) { c.lr = 0.0025; }),
       rules::adamw_schedulefree},
  };
}

// The matrix-preconditioned and block-wise rules of pytorch-optimizer (SOAP, AdaMuon, MARS,
// Shampoo, Kron, SCION) and adam-mini, each with its class's defaults.
std::vector<OptimizerEntry> preconditioned_entries() {
  return std::vector<OptimizerEntry>{
      {"soap",
       "SOAP (pytorch-optimizer): Adam in the eigenbases of Shampoo's Kronecker factors, "
       "refreshed every precondition_frequency steps",
       {"lr", "weight_decay", "beta1", "beta2", "eps", "shampoo_beta", "precondition_frequency",
        "max_precondition_dim", "precondition_1d", "correct_bias", "normalize_gradient"},
       defaults_of("soap",
                   [](OptimizerConfig& c) {
                     c.lr = 3e-3;
                     c.beta1 = 0.95;
                     c.beta2 = 0.95;
                     c.weight_decay = 1e-2;
                   }),
       rules::soap},
      {"adamuon",
       "AdaMuon (pytorch-optimizer): Muon's bfloat16 Newton-Schulz output divided by its own "
       "second moment and rescaled, on hidden matrices; AdamW (adam_*) on the rest",
       {"lr", "weight_decay", "beta1", "beta2", "eps", "decoupled", "ns_steps", "ns_a", "ns_b",
        "ns_c", "rms_scale", "adam_lr", "adam_beta1", "adam_beta2", "adam_eps", "adam_weight_decay",
        "muon_params"},
       defaults_of("adamuon",
                   [](OptimizerConfig& c) {
                     c.lr = 2e-2;
                     c.beta2 = 0.95;
                     c.eps = 1e-10;
                     c.decoupled = true;
                     c.rms_scale = true;
                     c.adam_lr = 3e-4;
                     c.adam_beta2 = 0.999;
                     c.adam_eps = 1e-10;
                   }),
       rules::adamuon},
      {"mars",
       "MARS (pytorch-optimizer, its AdamW type): Adam on the gradient corrected by its change "
       "since the last step (gamma), clipped to norm 1; plain Adam on vectors (*_1d)",
       {"lr", "weight_decay", "beta1", "beta2", "eps", "gamma", "optimize_1d", "lr_1d_factor",
        "beta1_1d", "beta2_1d", "weight_decay_1d", "decoupled", "fixed_decay"},
       defaults_of("mars",
                   [](OptimizerConfig& c) {
                     c.lr = 3e-3;
                     c.beta1 = 0.95;
                     c.beta2 = 0.99;
                     c.decoupled = true;
                   }),
       rules::mars},
      {"shampoo",
       "Shampoo (pytorch-optimizer): the gradient multiplied along each dimension by the inverse "
       "2·order-th root of its accumulated statistic",
       {"lr", "weight_decay", "momentum", "decoupled", "fixed_decay", "matrix_eps",
        "precondition_frequency"},
       defaults_of("shampoo", [](OptimizerConfig& c) { c.precondition_frequency = 1; }),
       rules::shampoo},
      {"kron",
       "PSGD-Kron (pytorch-optimizer's Kron): bias-corrected momentum multiplied along each "
       "dimension by QᵀQ, Q a triangular (or diagonal) factor fitted every 1/update_probability "
       "steps, RMS-clipped to 1.1",
       {"lr", "weight_decay", "momentum", "decoupled", "update_probability", "update_counter",
        "max_size_triangular", "min_ndim_triangular", "memory_save_mode", "precondition_lr",
        "precondition_init_scale", "precondition_dtype", "momentum_into_precondition_update"},
       defaults_of("kron",
                   [](OptimizerConfig& c) {
                     c.momentum = 0.9;
                     c.decoupled = true;
                   }),
       rules::kron},
      {"adam-mini",
       "Adam-mini (the adam-mini package): Adam with one second moment per block (per head of "
       "the query and key matrices, per row of the others, per tensor for norms), blocks by name",
       {"lr", "weight_decay", "beta1", "beta2", "eps", "head_numel"},
       defaults_of("adam-mini", [](OptimizerConfig&) {}),
       rules::adam_mini},
      {"scion",
       "SCION (pytorch-optimizer): the linear minimisation oracle of a gradient average under a "
       "norm chosen per parameter (spectral for matrices by default), scaled by a radius",
       {"lr", "weight_decay", "momentum", "decoupled", "lmo", "lmo_normalize", "lmo_transpose",
        "lmo_max_scale", "ns_steps", "scale", "constraint"},
       defaults_of("scion",
                   [](OptimizerConfig& c) {
                     c.momentum = 0.1;
                     c.decoupled = true;
                   }),
       rules::scion},
  };
}

}  // namespace

bool OptimizerEntry::reads(const std::string& key) const {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

const std::vector<OptimizerEntry>& optimizer_table() {
  static const std::vector<OptimizerEntry> table = [] {
    std::vector<OptimizerEntry> all = first_entries();
    for (auto& entry : zoo_entries()) all.push_back(std::move(entry));
    for (auto& entry : preconditioned_entries()) all.push_back(std::move(entry));
    return all;
  }();
  return table;
}

std::vector<std::string> optimizer_names() {
  std::vector<std::string> names;
  for (const auto& entry : optimizer_table()) names.push_back(entry.name);
  return names;
}

const OptimizerEntry& optimizer_entry(const std::string& name) {
  for (const auto& entry : optimizer_table()) {
    if (entry.name == name) return entry;
  }
  const auto names = optimizer_names();
  throw InvalidArgument(fmt::format("unknown optimizer '{}'{}; known: {}", name,
                                    did_you_mean(name, names), join(names, ", ")));
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const ParamSpace& space) {
  return make_optimizer(config, space, ModelStructure::from_names(space));
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const ParamSpace& space,
                                          const ModelStructure& structure) {
  return optimizer_entry(config.name).make(config, space, structure);
}

}  // namespace curv
