// State dicts and optimizer states as torch.save stores them, read from the unpickled tree.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/strings.h"
#include "curv/core/error.h"
#include "io/torch_checkpoint.h"

namespace curv::torch_state {

using Kind = PyValue::Kind;

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const PyValue& require(const PyValue* v, const std::string& origin, const std::string& key,
                       Kind kind) {
  if (!v) throw FormatError(fmt::format("{}: no key '{}'", origin, key));
  if (!v->is(kind)) {
    PyValue expected;
    expected.kind = kind;
    throw FormatError(fmt::format("{}: '{}' is a {}, expected a {}", origin, key, v->type_name(),
                                  expected.type_name()));
  }
  return *v;
}

// Buffers that state dicts carry beside the parameters: nanoGPT's and HF GPT-2's causal mask
// ("...attn.bias", (1, 1, T, T)) and masked-score constant ("...attn.masked_bias", a scalar), and
// older HF LLaMA saves' and modded-nanogpt's rotary frequencies ("...rotary_emb.inv_freq",
// "...rotary.angular_freq").
bool is_saved_buffer(const std::string& name, size_t ndim) {
  return (ndim == 4 && has_suffix(name, ".attn.bias")) ||
         (ndim == 0 && has_suffix(name, ".attn.masked_bias")) ||
         (ndim == 1 && has_suffix(name, ".rotary_emb.inv_freq")) ||
         (ndim == 1 && has_suffix(name, ".rotary.angular_freq"));
}

NamedTensors state_dict(const PyValue& dict, const std::string& origin) {
  NamedTensors out;
  std::set<std::string> seen;
  for (const auto& [key, value] : dict.entries) {
    if (!key->is(Kind::kString)) {
      throw FormatError(fmt::format("{}: state dict key {} is not a string", origin, key->brief()));
    }
    std::string name = key->text;
    if (name.rfind(kCompilePrefix, 0) == 0) name = name.substr(std::string(kCompilePrefix).size());
    if (!value->is(Kind::kTensor)) {
      throw FormatError(fmt::format("{}: state dict entry '{}' is a {}, not a tensor", origin,
                                    key->text, value->type_name()));
    }
    if (is_saved_buffer(name, value->shape.size())) continue;
    if (!seen.insert(name).second) {
      throw FormatError(
          fmt::format("{}: parameter '{}' appears twice (with and without the "
                      "'{}' prefix)",
                      origin, name, kCompilePrefix));
    }
    out.emplace_back(name, value->tensor);
  }
  return out;
}

bool all_tensors(const PyValue& dict) {
  if (!dict.is(Kind::kDict) || dict.entries.empty()) return false;
  for (const auto& [k, v] : dict.entries) {
    if (!k->is(Kind::kString) || !v->is(Kind::kTensor)) return false;
  }
  return true;
}

double number(const PyValue& v, const std::string& origin, const std::string& key) {
  if (v.is(Kind::kInt)) return static_cast<double>(v.integer);
  if (v.is(Kind::kFloat)) return v.real;
  if (v.is(Kind::kBool)) return v.boolean ? 1.0 : 0.0;
  if (v.is(Kind::kTensor) && v.tensor.defined() && v.tensor.numel() == 1) {
    return v.tensor.to(at::kDouble).item<double>();
  }
  throw FormatError(fmt::format("{}: '{}' is {}, expected a number", origin, key, v.brief()));
}

namespace {

// torch.optim.Muon's adjust_lr_fn by name -> libcurv's adjust_lr (None is "original").
// A string-valued key read as the index of its value in `names` (None: `none`).
double choice_code(const PyValue& v, const std::vector<std::string>& names, double none,
                   const std::string& origin, const std::string& where) {
  if (v.is(Kind::kNone)) return none;
  for (size_t k = 0; k < names.size(); ++k) {
    if (v.is(Kind::kString) && v.text == names[k]) return static_cast<double>(k);
  }
  throw FormatError(fmt::format("{}: '{}' is {}, expected one of None, '{}'", origin, where,
                                v.brief(), join(names, "', '")));
}

// A dtype key (Kron's precondition_dtype) as libcurv's code: 0 for None, else its bits.
double dtype_code(const PyValue& v, const std::string& origin, const std::string& where) {
  if (v.is(Kind::kNone)) return 0;
  if (v.is(Kind::kGlobal) && v.text == "torch.float32") return 32;
  if (v.is(Kind::kGlobal) && v.text == "torch.float64") return 64;
  throw FormatError(fmt::format("{}: '{}' is {}, expected None, torch.float32 or torch.float64",
                                origin, where, v.brief()));
}

// A tuple of numbers of the lengths `sizes` allows, into `names` (None entries left out).
void split_tuple(nlohmann::json& hyper, const PyValue& v, const std::vector<std::string>& names,
                 const std::vector<size_t>& sizes, const std::string& origin,
                 const std::string& where, const std::string& expected) {
  const bool sequence = v.is(Kind::kTuple) || v.is(Kind::kList);
  if (!sequence || std::find(sizes.begin(), sizes.end(), v.items.size()) == sizes.end()) {
    throw FormatError(
        fmt::format("{}: '{}' is {}, expected {}", origin, where, v.brief(), expected));
  }
  for (size_t k = 0; k < v.items.size(); ++k) {
    if (!v.items[k]->is(Kind::kNone)) hyper[names[k]] = number(*v.items[k], origin, where);
  }
}

// SCION's norm_kwargs, the options of its oracle: normalize (normalized for the column and row
// oracles), transpose, max_scale, num_steps; zero_init only shapes the initialisation.
void scion_norm_kwargs(nlohmann::json& hyper, const PyValue& v, const std::string& origin,
                       const std::string& where) {
  if (!v.is(Kind::kDict)) {
    throw FormatError(fmt::format("{}: '{}' is {}, expected a dict", origin, where, v.brief()));
  }
  // An option the dict leaves out takes the oracle's default, whatever another group set.
  hyper["lmo_normalize"] = -1;
  hyper["lmo_transpose"] = 0;
  hyper["lmo_max_scale"] = 0;
  hyper["ns_steps"] = 5;
  for (const auto& [k, value] : v.entries) {
    const std::string key = k->is(Kind::kString) ? k->text : k->brief();
    const std::string at = where + "." + key;
    if (key == "normalize" || key == "normalized") {
      hyper["lmo_normalize"] = number(*value, origin, at);
    } else if (key == "transpose") {
      hyper["lmo_transpose"] = number(*value, origin, at);
    } else if (key == "max_scale") {
      hyper["lmo_max_scale"] = number(*value, origin, at);
    } else if (key == "num_steps") {
      hyper["ns_steps"] = number(*value, origin, at);
    } else if (key != "zero_init") {
      throw FormatError(fmt::format(
          "{}: '{}' is not an option of SCION's oracles (normalize, normalized, transpose, "
          "max_scale, num_steps, zero_init)",
          origin, at));
    }
  }
}

// torch param_group keys -> libcurv's hyper-parameter names: betas split in two (three for
// AdEMAMix), Adafactor's eps pair, torch.optim.Muon's ns_coefficients and adjust_lr_fn, Kron's
// memory_save_mode and precondition_dtype as codes, and the keys whose names differ (d,
// weight_decouple, decoupled_weight_decay, pre_conditioner_update_probability). None leaves the
// default.
nlohmann::json group_hyper(const PyValue& group, const std::string& origin) {
  static const std::vector<std::pair<std::string, std::string>> renamed = {
      {"lr", "lr"},
      {"eps", "eps"},
      {"weight_decay", "weight_decay"},
      {"momentum", "momentum"},
      {"dampening", "dampening"},
      {"nesterov", "nesterov"},
      {"ns_steps", "ns_steps"},
      {"momentum_decay", "momentum_decay"},
      {"decoupled_weight_decay", "decoupled"},
      {"weight_decouple", "decoupled"},
      {"fixed_decay", "fixed_decay"},
      {"beta2_decay", "beta2_decay"},
      {"d", "clip_threshold"},
      {"use_adjusted_lr", "rms_scale"},
      {"gamma", "gamma"},
      {"optimize_1d", "optimize_1d"},
      {"lr_1d_factor", "lr_1d_factor"},
      {"weight_decay_1d", "weight_decay_1d"},
      {"alpha", "alpha"},
      {"t_alpha_beta3", "t_alpha_beta3"},
      {"shampoo_beta", "shampoo_beta"},
      {"precondition_frequency", "precondition_frequency"},
      {"max_precondition_dim", "max_precondition_dim"},
      {"precondition_1d", "precondition_1d"},
      {"correct_bias", "correct_bias"},
      {"normalize_gradient", "normalize_gradient"},
      {"matrix_eps", "matrix_eps"},
      {"warmup_steps", "warmup_steps"},
      {"r", "r"},
      {"weight_lr_power", "weight_lr_power"},
      {"weight_sum", "weight_sum"},
      {"lr_max", "lr_max"},
      {"norm_type", "lmo"},
      {"scale", "scale"},
      {"constraint", "constraint"},
      {"beta1", "beta1"},
      {"beta2", "beta2"},
      {"pre_conditioner_update_probability", "update_probability"},
      {"update_counter", "update_counter"},
      {"max_size_triangular", "max_size_triangular"},
      {"min_ndim_triangular", "min_ndim_triangular"},
      {"precondition_lr", "precondition_lr"},
      {"precondition_init_scale", "precondition_init_scale"},
      {"momentum_into_precondition_update", "momentum_into_precondition_update"},
  };
  nlohmann::json hyper = nlohmann::json::object();
  for (const auto& [k, v] : group.entries) {
    if (!k->is(Kind::kString)) continue;
    const std::string& key = k->text;
    const std::string where = "param_groups[]." + key;
    if (key == "betas") {
      split_tuple(hyper, *v, {"beta1", "beta2", "beta3"}, {2, 3}, origin, where,
                  "(beta1, beta2) or (beta1, beta2, beta3)");
    } else if (key == "betas_1d") {
      split_tuple(hyper, *v, {"beta1_1d", "beta2_1d"}, {2}, origin, where, "(beta1, beta2)");
    } else if (key == "eps" && (v->is(Kind::kTuple) || v->is(Kind::kList))) {
      split_tuple(hyper, *v, {"eps", "eps2"}, {2}, origin, where, "a number or (eps1, eps2)");
    } else if (key == "ns_coefficients") {
      split_tuple(hyper, *v, {"ns_a", "ns_b", "ns_c"}, {3}, origin, where, "(a, b, c)");
    } else if (key == "ns_coeffs") {
      // pytorch-optimizer's schedule of coefficient tuples, one per step: one tuple is read.
      if ((!v->is(Kind::kList) && !v->is(Kind::kTuple)) || v->items.size() != 1) {
        throw FormatError(fmt::format(
            "{}: '{}' is {}, expected one (a, b, c) tuple (a schedule of several is not rebuilt)",
            origin, where, v->brief()));
      }
      split_tuple(hyper, *v->items[0], {"ns_a", "ns_b", "ns_c"}, {3}, origin, where, "(a, b, c)");
    } else if (key == "adjust_lr_fn") {
      hyper["adjust_lr"] =
          choice_code(*v, {"original", "match_rms_adamw", "spectral_unclamped"}, 0, origin, where);
    } else if (key == "memory_save_mode") {
      // Kron's modes, after None (0).
      const double mode =
          choice_code(*v, {"one_diag", "smart_one_diag", "all_diag"}, -1, origin, where);
      hyper["memory_save_mode"] = mode + 1;
    } else if (key == "mu_dtype" && !v->is(Kind::kNone)) {
      // Kron's momentum in a dtype of its own: its rounding is not rebuilt.
      throw FormatError(fmt::format(
          "{}: '{}' is {}; a step is rebuilt only with None (the momentum in the parameter's "
          "dtype)",
          origin, where, v->brief()));
    } else if (key == "norm_kwargs") {
      scion_norm_kwargs(hyper, *v, origin, where);
    } else if (key == "precondition_dtype") {
      hyper["precondition_dtype"] = dtype_code(*v, origin, where);
    } else {
      for (const auto& [torch_key, field] : renamed) {
        if (key == torch_key && !v->is(Kind::kNone)) hyper[field] = number(*v, origin, where);
      }
    }
  }
  return hyper;
}

// One of param_groups: its indices (each new to `indices`), hyper-parameters by libcurv's names
// (a MuonWithAuxAdam AdamW group's as adam_*), the names it recorded, and its keys for
// recognition (`keys`).
// Its group's step count, when the optimizer keeps one per group (pytorch-optimizer's 'step') and
// not per parameter: into `step_count`.
IndexedOptimizerState::Group parse_group(const PyValue& groups, size_t g, const std::string& origin,
                                         std::set<int64_t>& indices, torch_state::GroupKeys& keys,
                                         std::optional<int64_t>& step_count) {
  const std::string where = fmt::format("param_groups[{}]", g);
  const auto& group = *groups.items[g];
  if (!group.is(Kind::kDict)) {
    throw FormatError(
        fmt::format("{}: '{}' is a {}, expected a dict", origin, where, group.type_name()));
  }
  const auto& params = require(group.find("params"), origin, where + ".params", Kind::kList);
  IndexedOptimizerState::Group parsed;
  for (const auto& p : params.items) {
    if (!p->is(Kind::kInt) || !indices.insert(p->integer).second) {
      throw FormatError(fmt::format("{}: '{}.params' holds {} (expected distinct integers)", origin,
                                    where, p->brief()));
    }
    parsed.params.push_back(p->integer);
  }
  parsed.hyper = group_hyper(group, origin);
  // pytorch-optimizer counts steps in 'step'; Schedule-Free in 'k' (beside its 'weight_sum').
  const PyValue* step = group.find("step");
  const char* step_key = "step";
  if (!step && group.find("weight_sum")) {
    step = group.find("k");
    step_key = "k";
  }
  if (step && !step->is(Kind::kNone)) {
    step_count = std::max<int64_t>(step_count.value_or(0),
                                   std::llround(number(*step, origin, where + "." + step_key)));
  }
  for (const auto& [k, v] : group.entries) {
    if (!k->is(Kind::kString) || k->text == "params" || k->text == "param_names") continue;
    keys.keys.insert(k->text);
    if (v->is(Kind::kBool)) keys.flags[k->text] = v->boolean;
    if (v->is(Kind::kString)) keys.texts[k->text] = v->text;
  }
  if (parsed.hyper.contains("weight_decay")) {
    keys.weight_decay = parsed.hyper["weight_decay"].get<double>();
  }
  if (const PyValue* flag = group.find("use_muon"); flag && flag->is(Kind::kBool)) {
    parsed.use_muon = flag->boolean;
    // The auxiliary AdamW's hyper-parameters have their own names in libcurv's Muon.
    if (!flag->boolean) parsed.hyper = adam_part_hyper(parsed.hyper);
  }
  if (const PyValue* names = group.find("param_names")) {
    if (!names->is(Kind::kList) || names->items.size() != parsed.params.size()) {
      throw FormatError(fmt::format("{}: '{}.param_names' is {}, expected {} names", origin, where,
                                    names->brief(), parsed.params.size()));
    }
    for (const auto& n : names->items) {
      if (!n->is(Kind::kString)) {
        throw FormatError(fmt::format("{}: '{}.param_names' holds {}", origin, where, n->brief()));
      }
      std::string name = n->text;
      if (name.rfind(kCompilePrefix, 0) == 0)
        name = name.substr(std::string(kCompilePrefix).size());
      parsed.names.push_back(name);
    }
  }
  return parsed;
}

// The state tensors by index, each group's state keys (into out.keys) and the largest
// per-parameter 'step'.
std::optional<int64_t> parse_state(const PyValue& state, const std::map<int64_t, size_t>& group_of,
                                   const std::string& origin, IndexedOptimizerState& out,
                                   std::optional<int64_t> step_count) {
  for (const auto& [k, v] : state.entries) {
    if (!k->is(Kind::kInt) || !group_of.count(k->integer)) {
      throw FormatError(fmt::format("{}: 'state' key {} is not a parameter index of param_groups",
                                    origin, k->brief()));
    }
    const std::string where = fmt::format("state[{}]", k->integer);
    if (!v->is(Kind::kDict)) {
      throw FormatError(
          fmt::format("{}: '{}' is a {}, expected a dict", origin, where, v->type_name()));
    }
    std::set<std::string>& keys = out.keys.groups[group_of.at(k->integer)].state;
    const int64_t index = k->integer;  // a lambda may not capture a structured binding (C++17)
    NamedTensors tensors;
    for (const auto& [sk, sv] : v->entries) {
      if (!sk->is(Kind::kString)) continue;
      if (sk->text == "step") {
        step_count = std::max<int64_t>(step_count.value_or(0),
                                       std::llround(number(*sv, origin, where + ".step")));
        continue;
      }
      // Every key counts for recognition; tensors are the state. A list of tensors (SOAP's GG
      // and Q, one per dimension, [] for a dimension without one) is the tensors KEY.k.
      if (!sv->is(Kind::kNone)) keys.insert(sk->text);
      auto add = [&](const std::string& name, const PyValue& t) {
        if (!t.tensor.defined() && !t.text.empty()) {
          // Left in its file: a placeholder of its shape, read by name when a step needs it.
          out.stored_as[{index, name}] = t.text;
          tensors.emplace_back(
              name, at::empty(t.shape, at::TensorOptions().dtype(t.dtype).device(at::kMeta)));
        } else {
          tensors.emplace_back(name, t.tensor);
        }
      };
      if (sv->is(Kind::kTensor)) add(sk->text, *sv);
      if (sv->is(Kind::kList)) {
        for (size_t j = 0; j < sv->items.size(); ++j) {
          if (sv->items[j]->is(Kind::kTensor))
            add(sk->text + "." + std::to_string(j), *sv->items[j]);
        }
      }
    }
    // Adam-mini views the first moment of its query and key blocks per head (head_per_gpu): the
    // view's row length is its head_numel, which the state_dict does not record otherwise.
    if (v->find("head_per_gpu")) {
      for (const auto& [name, t] : tensors) {
        if (name == "m" && t.dim() == 2) {
          out.groups[group_of.at(k->integer)].hyper["head_numel"] = t.size(1);
        }
      }
    }
    out.state.emplace(k->integer, std::move(tensors));
  }
  return step_count;
}

}  // namespace

nlohmann::json adam_part_hyper(const nlohmann::json& hyper) {
  nlohmann::json adam = nlohmann::json::object();
  for (const char* key : {"lr", "beta1", "beta2", "eps"}) {
    if (hyper.contains(key)) adam[std::string("adam_") + key] = hyper[key];
  }
  if (hyper.contains("weight_decay")) adam["adam_weight_decay"] = hyper["weight_decay"];
  if (hyper.contains("decoupled")) adam["decoupled"] = hyper["decoupled"];
  return adam;
}

nlohmann::json adopt_recognition(IndexedOptimizerState& state, const Recognition& r) {
  for (size_t g = 0; g < state.groups.size() && g < r.orthogonalised.size(); ++g) {
    if (r.orthogonalised[g] && !state.groups[g].use_muon) state.groups[g].use_muon = true;
  }
  if (state.groups.empty()) return nlohmann::json::object();
  const bool muon = std::any_of(state.groups.begin(), state.groups.end(),
                                [](const auto& g) { return g.use_muon.has_value(); });
  if (!muon) return state.groups[0].hyper;
  nlohmann::json hyper = nlohmann::json::object();
  for (bool want : {true, false}) {
    for (const auto& g : state.groups) {
      if (g.use_muon.value_or(true) == want) {
        hyper.update(g.hyper);
        break;
      }
    }
  }
  return hyper;
}

std::shared_ptr<IndexedOptimizerState> optimizer_state_dict(const PyValue& dict,
                                                            const std::string& origin,
                                                            nlohmann::json& meta,
                                                            const std::string& implied_rule,
                                                            const std::string& implied_by) {
  auto out = std::make_shared<IndexedOptimizerState>();
  out->origin = origin;
  const auto& state = require(dict.find("state"), origin, "state", Kind::kDict);
  const auto& groups = require(dict.find("param_groups"), origin, "param_groups", Kind::kList);
  std::set<int64_t> indices;
  std::map<int64_t, size_t> group_of;
  std::optional<int64_t> group_step;
  for (size_t g = 0; g < groups.items.size(); ++g) {
    out->keys.groups.emplace_back();
    out->groups.push_back(
        parse_group(groups, g, origin, indices, out->keys.groups.back(), group_step));
    for (int64_t p : out->groups.back().params) group_of[p] = g;
  }
  const std::optional<int64_t> step_count = parse_state(state, group_of, origin, *out, group_step);
  out->keys.implied_rule = implied_rule;
  out->keys.implied_by = implied_by;
  const Recognition r = recognise_optimizer(out->keys, origin);
  nlohmann::json opt = nlohmann::json::object();
  if (r.rule.empty()) {
    opt["refusal"] = r.refusal;
  } else {
    opt["name"] = r.rule;
    opt["recognition"] = r.text();
  }
  opt["hyper"] = adopt_recognition(*out, r);
  if (step_count) opt["step_count"] = *step_count;
  meta["optimizer"] = opt;
  return out;
}

}  // namespace curv::torch_state

namespace curv {

namespace {

void set_hyper(std::vector<std::pair<std::string, double>>& hyper, const std::string& key,
               double value) {
  for (auto& [k, v] : hyper) {
    if (k == key) {
      v = value;
      return;
    }
  }
  hyper.emplace_back(key, value);
}

}  // namespace

std::vector<std::string> torch_optimizer_rules() { return torch_state::rule_lines(); }

void name_optimizer(Checkpoint& ckpt, const std::string& rule,
                    const std::vector<std::pair<std::string, double>>& hyper,
                    const std::optional<std::string>& muon_params) {
  if (rule.empty()) return;
  if (!ckpt.meta.optimizer && !ckpt.indexed_optimizer && ckpt.optimizer.empty() &&
      !ckpt.optimizer_source)
    return;
  if (!ckpt.meta.optimizer) ckpt.meta.optimizer.emplace();
  OptimizerRecord& record = *ckpt.meta.optimizer;
  // A state read by its keys; modded-nanogpt's merged optimizers are named by their file instead.
  if (ckpt.indexed_optimizer && !ckpt.indexed_optimizer->keys.groups.empty()) {
    auto state = std::make_shared<IndexedOptimizerState>(*ckpt.indexed_optimizer);
    const torch_state::Recognition r =
        torch_state::recognise_optimizer(state->keys, state->origin, rule);
    if (r.rule.empty()) throw InvalidArgument(r.refusal);
    for (auto& group : state->groups) {
      for (const auto& [key, value] : hyper) group.hyper[key] = value;
    }
    state->muon_params = muon_params;
    record.name = r.rule;
    record.recognition = r.text();
    record.refusal.clear();
    record.hyper.clear();
    const nlohmann::json saved_hyper = torch_state::adopt_recognition(*state, r);
    for (const auto& [key, value] : saved_hyper.items()) {
      record.hyper.emplace_back(key, value.get<double>());
    }
    ckpt.indexed_optimizer = std::move(state);
  } else if (record.name.empty()) {
    record.name = rule;
    record.recognition = fmt::format("named by the user ({})", rule);
  } else if (record.name != rule) {
    throw InvalidArgument(Error::literal(fmt::format("{}: the checkpoint records optimizer '{}'; ",
                                                     ckpt.meta_file, record.name)) +
                              "{0}",
                          {{"ProbeRunOptions.optimizer", Error::literal(rule)}});
  }
  for (const auto& [key, value] : hyper) {
    set_hyper(record.hyper, key, value);
    for (auto& group : record.param_groups) set_hyper(group.hyper, key, value);
  }
  if (muon_params) record.muon_params = *muon_params;
}

}  // namespace curv
