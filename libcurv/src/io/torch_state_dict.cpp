// State dicts and optimizer states as torch.save stores them, read from the unpickled tree.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

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

// torch param_group keys -> libcurv's hyper-parameter names (betas split in two).
nlohmann::json group_hyper(const PyValue& group, const std::string& origin) {
  nlohmann::json hyper = nlohmann::json::object();
  for (const auto& [k, v] : group.entries) {
    if (!k->is(Kind::kString)) continue;
    const std::string& key = k->text;
    const std::string where = "param_groups[]." + key;
    if (key == "betas") {
      if ((!v->is(Kind::kTuple) && !v->is(Kind::kList)) || v->items.size() != 2) {
        throw FormatError(
            fmt::format("{}: '{}' is {}, expected (beta1, beta2)", origin, where, v->brief()));
      }
      hyper["beta1"] = number(*v->items[0], origin, where);
      hyper["beta2"] = number(*v->items[1], origin, where);
    } else if (key == "lr" || key == "eps" || key == "weight_decay" || key == "momentum" ||
               key == "dampening" || key == "nesterov") {
      if (v->is(Kind::kNone)) continue;
      hyper[key] = number(*v, origin, where);
    }
  }
  return hyper;
}

// One of param_groups: its indices (each new to `indices`), hyper-parameters by libcurv's names
// (a MuonWithAuxAdam AdamW group's as adam_*, torch.optim.Muon's Newton–Schulz settings) and the
// names it recorded.
IndexedOptimizerState::Group parse_group(const PyValue& groups, size_t g, const std::string& origin,
                                         std::set<int64_t>& indices) {
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
  if (const PyValue* flag = group.find("use_muon"); flag && flag->is(Kind::kBool)) {
    parsed.use_muon = flag->boolean;
    if (!flag->boolean) {
      // The auxiliary AdamW's hyper-parameters have their own names in libcurv's Muon.
      nlohmann::json adam = nlohmann::json::object();
      for (const auto& [key, value] : parsed.hyper.items()) {
        adam[key == "weight_decay" ? "adam_weight_decay" : "adam_" + key] = value;
      }
      parsed.hyper = adam;
    }
  }
  // torch.optim.Muon: the sum form of momentum, and optionally the RMS-matching scale.
  if (const PyValue* ns = group.find("ns_coefficients")) {
    parsed.hyper["sum_momentum"] = 1.0;
    if ((ns->is(Kind::kTuple) || ns->is(Kind::kList)) && ns->items.size() == 3) {
      const std::string key = where + ".ns_coefficients";
      parsed.hyper["ns_a"] = number(*ns->items[0], origin, key);
      parsed.hyper["ns_b"] = number(*ns->items[1], origin, key);
      parsed.hyper["ns_c"] = number(*ns->items[2], origin, key);
    }
    const PyValue* adjust = group.find("adjust_lr_fn");
    parsed.hyper["rms_scale"] =
        adjust && adjust->is(Kind::kString) && adjust->text == "match_rms_adamw" ? 1.0 : 0.0;
    if (const PyValue* steps = group.find("ns_steps"); steps && steps->is(Kind::kInt)) {
      parsed.hyper["ns_steps"] = static_cast<double>(steps->integer);
    }
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

// Keys of every per-parameter state tensor, and the largest per-parameter 'step'.
struct StateSummary {
  std::set<std::string> keys;
  std::optional<int64_t> step_count;
};

StateSummary parse_state(const PyValue& state, const std::set<int64_t>& indices,
                         const std::string& origin, IndexedOptimizerState& out) {
  StateSummary summary;
  std::set<std::string>& keys = summary.keys;
  std::optional<int64_t>& step_count = summary.step_count;
  for (const auto& [k, v] : state.entries) {
    if (!k->is(Kind::kInt) || !indices.count(k->integer)) {
      throw FormatError(fmt::format("{}: 'state' key {} is not a parameter index of param_groups",
                                    origin, k->brief()));
    }
    const std::string where = fmt::format("state[{}]", k->integer);
    if (!v->is(Kind::kDict)) {
      throw FormatError(
          fmt::format("{}: '{}' is a {}, expected a dict", origin, where, v->type_name()));
    }
    NamedTensors tensors;
    for (const auto& [sk, sv] : v->entries) {
      if (!sk->is(Kind::kString)) continue;
      if (sk->text == "step") {
        step_count = std::max<int64_t>(step_count.value_or(0),
                                       std::llround(number(*sv, origin, where + ".step")));
        continue;
      }
      if (!sv->is(Kind::kTensor)) continue;  // per-parameter scalars other than step carry no state
      keys.insert(sk->text);
      tensors.emplace_back(sk->text, sv->tensor);
    }
    out.state.emplace(k->integer, std::move(tensors));
  }
  return summary;
}

// meta["optimizer"] of a state: the name inferred from the state keys and the groups (torch does
// not save the optimizer's class), group 0's hyper-parameters (for Muon, the first group of each
// kind) and the step count.
nlohmann::json optimizer_record(const IndexedOptimizerState& out, const PyValue& groups,
                                const StateSummary& summary, bool amsgrad) {
  nlohmann::json opt = nlohmann::json::object();
  const nlohmann::json first = out.groups.empty() ? nlohmann::json::object() : out.groups[0].hyper;
  // Muon keeps a momentum buffer like SGD, but its groups have no dampening (SGD's always do).
  const bool muon = std::any_of(out.groups.begin(), out.groups.end(),
                                [](const auto& g) { return g.use_muon.has_value(); }) ||
                    (summary.keys.count("momentum_buffer") && !groups.items.empty() &&
                     !groups.items[0]->find("dampening"));
  std::string name;
  nlohmann::json hyper = first;
  if (muon) {
    name = "muon";
    // One hyper object for both rules: the first orthogonalised group's, the first AdamW group's.
    hyper = nlohmann::json::object();
    for (bool want : {true, false}) {
      for (const auto& g : out.groups) {
        if (g.use_muon.value_or(true) == want) {
          hyper.update(g.hyper);
          break;
        }
      }
    }
  } else if (summary.keys.count("exp_avg_sq") ||
             (summary.keys.empty() && first.contains("beta2") && first.contains("eps"))) {
    name = "adamw";
  } else if (summary.keys.count("momentum_buffer") ||
             (summary.keys.empty() && first.contains("momentum"))) {
    name = "sgd";
  } else if (summary.keys.count("exp_avg") && first.contains("beta2")) {
    name = "lion";
  }
  // AMSGrad divides by the running maximum of v̂, a step libcurv does not rebuild: the distinct
  // name makes a rebuilt adamw direction refuse the state instead of misreading it.
  if (name == "adamw" && amsgrad) name = "adamw-amsgrad";
  if (!name.empty()) opt["name"] = name;
  opt["hyper"] = hyper;
  if (summary.step_count) opt["step_count"] = *summary.step_count;
  return opt;
}

}  // namespace

std::shared_ptr<IndexedOptimizerState> optimizer_state_dict(const PyValue& dict,
                                                            const std::string& origin,
                                                            nlohmann::json& meta) {
  auto out = std::make_shared<IndexedOptimizerState>();
  out->origin = origin;
  const auto& state = require(dict.find("state"), origin, "state", Kind::kDict);
  const auto& groups = require(dict.find("param_groups"), origin, "param_groups", Kind::kList);
  std::set<int64_t> indices;
  bool amsgrad = false;
  for (size_t g = 0; g < groups.items.size(); ++g) {
    out->groups.push_back(parse_group(groups, g, origin, indices));
    const PyValue* flag = groups.items[g]->find("amsgrad");
    amsgrad = amsgrad || (flag && flag->is(Kind::kBool) && flag->boolean);
  }
  const StateSummary summary = parse_state(state, indices, origin, *out);
  meta["optimizer"] = optimizer_record(*out, groups, summary, amsgrad);
  return out;
}

}  // namespace curv::torch_state
