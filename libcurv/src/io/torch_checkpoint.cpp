// PyTorch checkpoint layouts (nanoGPT, Hugging Face Trainer, step_<N>.pt) converted into the
// native Checkpoint form, and the mapping of torch optimizer state from indices to names.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>

#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/core/structure.h"
#include "curv/io/checkpoint.h"
#include "curv/io/safetensors.h"
#include "curv/io/torch_file.h"
#include "io/torch_layouts.h"

namespace curv {

namespace fs = std::filesystem;
using Kind = PyValue::Kind;

struct IndexedOptimizerState {
  struct Group {
    std::vector<int64_t> params;  // indices, in the group's order
    nlohmann::json hyper;         // libcurv's field names
    // The parameter names, when the optimizer recorded them (param_names, PyTorch >= 2.6).
    std::vector<std::string> names;
    // Keller Jordan's MuonWithAuxAdam marks each group: orthogonalised (true) or AdamW (false).
    std::optional<bool> use_muon;
  };
  std::vector<Group> groups;
  std::map<int64_t, NamedTensors> state;  // index -> (key, tensor), non-scalar states only
  std::string origin;                     // "<file> ['optimizer']" for messages
  // modded-nanogpt's two optimizers (AdamW, then Muon) merged into one state: AdamW's groups
  // first (use_muon false), then Muon's with its indices after AdamW's (the "modded" rule).
  bool modded = false;
  // Written by the Hugging Face Trainer (optimizer.pt in a checkpoint-<N> folder): its two
  // groups are the weight-decayed parameters and the rest (the "trainer" rule).
  bool hf_trainer = false;
  int64_t muon_offset = 0;  // Muon's index k is k + muon_offset here
  // Why the state cannot be used (e.g. Muon state sharded across ranks): resolve_optimizer_state
  // throws it, so that the model still loads for directions that need no optimizer state.
  std::string problem;
};

namespace {

constexpr const char* kCompilePrefix = "_orig_mod.";

std::optional<int64_t> digits(const std::string& text) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// nanoGPT's checkpoints: ckpt.pt, ckpt_<anything>.pt.
bool is_nanogpt_file(const std::string& name) {
  return has_suffix(name, ".pt") && (name == "ckpt.pt" || name.rfind("ckpt_", 0) == 0);
}

std::optional<int64_t> hf_step(const std::string& name) {
  if (name.rfind("checkpoint-", 0) != 0) return std::nullopt;
  return digits(name.substr(11));
}

// step_<N>.pt, and modded-nanogpt's state_step<N>.pt (N zero-padded).
std::optional<int64_t> pt_step(const std::string& name) {
  if (!has_suffix(name, ".pt")) return std::nullopt;
  for (const std::string prefix : {"step_", "state_step"}) {
    if (name.rfind(prefix, 0) == 0) {
      return digits(name.substr(prefix.size(), name.size() - prefix.size() - 3));
    }
  }
  return std::nullopt;
}

// modded-nanogpt's model (train_gpt_simple.py's GPT) from its state dict's shapes, and from the
// training script the checkpoint carries ('code') for what shapes do not show: head_dim and the
// attention scale. The sequence length is not recorded, and the rotary embedding takes any.
nlohmann::json modded_model_config(const NamedTensors& model, const PyValue* code,
                                   const std::string& origin) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : model) shapes[name] = t.sizes().vec();
  const auto embed = shapes.find("embed.weight");
  if (embed == shapes.end() || embed->second.size() != 2) {
    throw FormatError(fmt::format("{}: no 2-D 'embed.weight' (a modded-nanogpt GPT's)", origin));
  }
  int64_t layers = 0;
  while (shapes.count(fmt::format("blocks.{}.attn.q.weight", layers))) ++layers;
  nlohmann::json config = {{"arch", "modded"},
                           {"vocab_size", embed->second[0]},
                           {"model_dim", embed->second[1]},
                           {"num_layers", layers},
                           {"context", 1 << 16}};
  if (code && code->is(Kind::kString)) {
    auto number_after = [&](const std::string& key) -> std::optional<std::string> {
      const size_t at = code->text.find(key);
      if (at == std::string::npos) return std::nullopt;
      size_t end = at + key.size();
      while (
          end < code->text.size() &&
          (std::isdigit(static_cast<unsigned char>(code->text[end])) || code->text[end] == '.')) {
        ++end;
      }
      if (end == at + key.size()) return std::nullopt;
      return code->text.substr(at + key.size(), end - at - key.size());
    };
    if (auto d = number_after("head_dim=")) config["head_dim"] = std::stoll(*d);
    if (auto scale = number_after("scale=")) config["attention_scale"] = std::stod(*scale);
  }
  return config;
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

// nanoGPT's causal-mask buffer: "...attn.bias", a (1, 1, T, T) tensor when flash attention is off.
// Buffers that state dicts carry beside the parameters: nanoGPT's and HF GPT-2's causal mask
// ("...attn.bias", (1, 1, T, T)) and masked-score constant ("...attn.masked_bias", a scalar), and
// older HF LLaMA saves' and modded-nanogpt's rotary frequencies ("...rotary_emb.inv_freq",
// "...rotary.angular_freq").
bool is_causal_mask(const std::string& name, size_t ndim) {
  return (ndim == 4 && has_suffix(name, ".attn.bias")) ||
         (ndim == 0 && has_suffix(name, ".attn.masked_bias")) ||
         (ndim == 1 && has_suffix(name, ".rotary_emb.inv_freq")) ||
         (ndim == 1 && has_suffix(name, ".rotary.angular_freq"));
}

// A model state dict: string keys to tensors. nanoGPT's causal-mask buffer ("...attn.bias", a
// (1, 1, T, T) tensor when flash attention is off) is not a parameter and is dropped.
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
    if (is_causal_mask(name, value->shape.size())) continue;
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

// optimizer.state_dict(): {'state': {index: {key: tensor | number}}, 'param_groups': [...]}.
// Also fills meta["optimizer"] with the name inferred from the state keys (torch does not save
// the optimizer's class), group 0's hyper-parameters and the step count.
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
        throw FormatError(fmt::format("{}: '{}.params' holds {} (expected distinct integers)",
                                      origin, where, p->brief()));
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
        throw FormatError(fmt::format("{}: '{}.param_names' is {}, expected {} names", origin,
                                      where, names->brief(), parsed.params.size()));
      }
      for (const auto& n : names->items) {
        if (!n->is(Kind::kString)) {
          throw FormatError(
              fmt::format("{}: '{}.param_names' holds {}", origin, where, n->brief()));
        }
        std::string name = n->text;
        if (name.rfind(kCompilePrefix, 0) == 0)
          name = name.substr(std::string(kCompilePrefix).size());
        parsed.names.push_back(name);
      }
    }
    out->groups.push_back(std::move(parsed));
    const PyValue* flag = group.find("amsgrad");
    amsgrad = amsgrad || (flag && flag->is(Kind::kBool) && flag->boolean);
  }
  std::set<std::string> keys;
  std::optional<int64_t> step_count;
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
    out->state.emplace(k->integer, std::move(tensors));
  }
  auto& opt = meta["optimizer"];
  opt = nlohmann::json::object();
  const nlohmann::json first =
      out->groups.empty() ? nlohmann::json::object() : out->groups[0].hyper;
  // Muon keeps a momentum buffer like SGD, but its groups have no dampening (SGD's always do).
  const bool muon = std::any_of(out->groups.begin(), out->groups.end(),
                                [](const auto& g) { return g.use_muon.has_value(); }) ||
                    (keys.count("momentum_buffer") && !groups.items.empty() &&
                     !groups.items[0]->find("dampening"));
  std::string name;
  nlohmann::json hyper = first;
  if (muon) {
    name = "muon";
    // One hyper object for both rules: the first orthogonalised group's, the first AdamW group's.
    hyper = nlohmann::json::object();
    for (bool want : {true, false}) {
      for (const auto& g : out->groups) {
        if (g.use_muon.value_or(true) == want) {
          hyper.update(g.hyper);
          break;
        }
      }
    }
  } else if (keys.count("exp_avg_sq") ||
             (keys.empty() && first.contains("beta2") && first.contains("eps"))) {
    name = "adamw";
  } else if (keys.count("momentum_buffer") || (keys.empty() && first.contains("momentum"))) {
    name = "sgd";
  } else if (keys.count("exp_avg") && first.contains("beta2")) {
    name = "lion";
  }
  // AMSGrad divides by the running maximum of v̂, a step libcurv does not rebuild: the distinct
  // name makes a rebuilt adamw direction refuse the state instead of misreading it.
  if (name == "adamw" && amsgrad) name = "adamw-amsgrad";
  if (!name.empty()) opt["name"] = name;
  opt["hyper"] = hyper;
  if (step_count) opt["step_count"] = *step_count;
  return out;
}

// The Newton–Schulz iteration of the script text a modded-nanogpt checkpoint carries ('code'):
// zeropower_via_newtonschulz5's "a, b, c = ..." and "for _ in range(N)" (or its steps=N
// default). What the text does not give keeps train_gpt_simple.py's values: (2, −1.5, 0.5), 12.
struct ModdedNewtonSchulz {
  double a = 2.0, b = -1.5, c = 0.5;
  int64_t steps = 12;
};

ModdedNewtonSchulz modded_newton_schulz(const PyValue* code) {
  ModdedNewtonSchulz ns;
  if (!code || !code->is(Kind::kString)) return ns;
  const std::string& text = code->text;
  const size_t def = text.find("def zeropower_via_newtonschulz5");
  if (def == std::string::npos) return ns;
  // The function's text: up to the next top-level statement.
  size_t end = def + 1;
  while (true) {
    end = text.find('\n', end);
    if (end == std::string::npos || end + 1 >= text.size()) break;
    const char next = text[end + 1];
    if (next != ' ' && next != '\t' && next != '\n' && next != '\r' && next != '#') break;
    ++end;
  }
  const std::string body = text.substr(def, end == std::string::npos ? end : end - def);
  const std::string number = R"(([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?))";
  std::smatch match;
  if (std::regex_search(body, match,
                        std::regex(R"(a\s*,\s*b\s*,\s*c\s*=\s*\(?\s*)" + number + R"(\s*,\s*)" +
                                   number + R"(\s*,\s*)" + number))) {
    ns.a = std::stod(match[1]);
    ns.b = std::stod(match[2]);
    ns.c = std::stod(match[3]);
  }
  if (std::regex_search(body, match, std::regex(R"(for\s+\w+\s+in\s+range\(\s*(\d+)\s*\))"))) {
    ns.steps = std::stoll(match[1]);
  } else if (std::regex_search(body, match, std::regex(R"(steps\s*(?::\s*int\s*)?=\s*(\d+))"))) {
    ns.steps = std::stoll(match[1]);
  }
  return ns;
}

// modded-nanogpt's 'optimizers': [AdamW.state_dict(), Muon.state_dict()] as train_gpt_simple.py
// builds them, merged into one state in the form of Keller Jordan's MuonWithAuxAdam: AdamW's
// groups (use_muon false: adam_* hyper-parameters), then Muon's (lr, weight_decay, momentum = its
// mu, Nesterov, the Newton–Schulz of the script text) with indices after AdamW's and its
// "momentum" state named momentum_buffer. Fills meta["optimizer"] as optimizer_state_dict does.
// FormatError naming the file and key when the list is not that; a Muon state that holds only
// some parameters (a multi-rank run: each rank keeps the momentum of its own share) is recorded
// as the state's problem.
std::shared_ptr<IndexedOptimizerState> modded_optimizers(const PyValue& list,
                                                         const std::string& file,
                                                         const PyValue* code,
                                                         nlohmann::json& meta) {
  const std::string origin = file + " ['optimizers']";
  if ((!list.is(Kind::kList) && !list.is(Kind::kTuple)) || list.items.size() != 2 ||
      !list.items[0]->is(Kind::kDict) || !list.items[1]->is(Kind::kDict)) {
    throw FormatError(
        fmt::format("{}: is {}, expected [AdamW state_dict, Muon state_dict] as "
                    "train_gpt_simple.py saves them",
                    origin, list.brief()));
  }
  nlohmann::json adam_meta, muon_meta;
  const std::string adam_origin = origin + "[0]", muon_origin = origin + "[1]";
  auto adam = optimizer_state_dict(*list.items[0], adam_origin, adam_meta);
  auto muon = optimizer_state_dict(*list.items[1], muon_origin, muon_meta);
  const auto& adam_groups = list.items[0]->find("param_groups")->items;
  const auto& muon_groups = list.items[1]->find("param_groups")->items;
  const bool is_adam = std::all_of(adam_groups.begin(), adam_groups.end(), [](const auto& g) {
    return g->find("betas") && g->find("eps");
  });
  if (!is_adam || adam_groups.empty()) {
    throw FormatError(
        fmt::format("{}: expected AdamW's state_dict (param_groups with 'betas' and 'eps'), as "
                    "train_gpt_simple.py's optimizer1",
                    adam_origin));
  }
  const bool is_muon = std::all_of(muon_groups.begin(), muon_groups.end(),
                                   [](const auto& g) { return g->find("mu") != nullptr; });
  if (!is_muon || muon_groups.empty()) {
    throw FormatError(
        fmt::format("{}: expected Muon's state_dict (param_groups with 'mu'), as "
                    "train_gpt_simple.py's optimizer2",
                    muon_origin));
  }
  auto out = std::make_shared<IndexedOptimizerState>();
  out->origin = origin;
  out->modded = true;
  int64_t offset = 0;
  for (const auto& g : adam->groups) {
    for (int64_t p : g.params) offset = std::max(offset, p + 1);
  }
  out->muon_offset = offset;
  for (auto& g : adam->groups) {
    nlohmann::json hyper = nlohmann::json::object();
    for (const auto& [key, value] : g.hyper.items()) {
      hyper[key == "weight_decay" ? "adam_weight_decay" : "adam_" + key] = value;
    }
    g.hyper = hyper;
    g.use_muon = false;
    out->groups.push_back(std::move(g));
  }
  for (auto& [index, tensors] : adam->state) out->state.emplace(index, std::move(tensors));
  const ModdedNewtonSchulz ns = modded_newton_schulz(code);
  std::vector<int64_t> muon_indices;
  for (size_t k = 0; k < muon->groups.size(); ++k) {
    auto& g = muon->groups[k];
    const std::string where = fmt::format("param_groups[{}].mu", k);
    g.hyper["momentum"] = number(*muon_groups[k]->find("mu"), muon_origin, where);
    g.hyper["nesterov"] = 1.0;
    g.hyper["sum_momentum"] = 0.0;
    g.hyper["rms_scale"] = 0.0;
    g.hyper["ns_steps"] = static_cast<double>(ns.steps);
    g.hyper["ns_a"] = ns.a;
    g.hyper["ns_b"] = ns.b;
    g.hyper["ns_c"] = ns.c;
    g.use_muon = true;
    muon_indices.insert(muon_indices.end(), g.params.begin(), g.params.end());
    for (auto& p : g.params) p += offset;
    out->groups.push_back(std::move(g));
  }
  for (auto& [index, tensors] : muon->state) {
    for (auto& [key, t] : tensors) {
      if (key == "momentum") key = "momentum_buffer";
    }
    out->state.emplace(index + offset, std::move(tensors));
  }
  // Each rank of a multi-rank run steps only Muon's parameters base + rank (the script's loop
  // over params[base_i + rank]): its state holds every world_size-th parameter.
  std::vector<int64_t> held;
  for (int64_t i : muon_indices) {
    if (muon->state.count(i)) held.push_back(i);
  }
  const int64_t adam_steps = adam_meta["optimizer"].value("step_count", int64_t{0});
  if (held.size() != muon_indices.size() && (!held.empty() || adam_steps > 0)) {
    std::string ranks;
    for (int64_t world : {2, 3, 4, 5, 6, 7, 8}) {
      for (int64_t rank = 0; rank < world && ranks.empty(); ++rank) {
        std::vector<int64_t> owned;
        for (size_t k = 0; k < muon_indices.size(); ++k) {
          if (static_cast<int64_t>(k) % world == rank) owned.push_back(muon_indices[k]);
        }
        if (owned == held) {
          ranks = fmt::format(
              ": the file of rank {} of a run on {} ranks, whose Muon keeps the momentum of "
              "every {}th parameter only (the script's params[base_i + rank]); the other ranks' "
              "momentum is not in this file. Gather every rank's Muon state into one file "
              "(e.g. save each rank's optimizer2.state_dict() and merge their 'state'), or "
              "use the directions that need no optimizer state (delta, random)",
              rank, world, world);
        }
      }
      if (!ranks.empty()) break;
    }
    out->problem = fmt::format(
        "{}: Muon state holds the momentum of {} of its {} parameters{}", muon_origin, held.size(),
        muon_indices.size(),
        ranks.empty() ? " (it is incomplete: libcurv needs the momentum of every parameter)"
                      : ranks);
  }
  // One record for both: Muon's first group, AdamW's first group; AdamW's step count.
  auto& opt = meta["optimizer"];
  opt = nlohmann::json::object();
  opt["name"] = "muon";
  nlohmann::json hyper = out->groups.back().hyper;
  for (const auto& g : out->groups) {
    if (g.use_muon.value_or(false)) {
      hyper = g.hyper;
      break;
    }
  }
  hyper.update(out->groups.front().hyper);
  opt["hyper"] = hyper;
  if (adam_meta["optimizer"].contains("step_count")) {
    opt["step_count"] = adam_meta["optimizer"]["step_count"];
  }
  return out;
}

struct Interpreted {
  NamedTensors model;
  std::shared_ptr<IndexedOptimizerState> optimizer;
  nlohmann::json meta = nlohmann::json::object();
  std::string model_origin;  // the file, and the key when the state dict is nested
};

// A torch.save'd checkpoint object: a bare state dict, or a dict holding one under 'model' (or
// 'model_state_dict', 'state_dict') and optionally an optimizer state dict under 'optimizer' (or
// 'optimizer_state_dict'), nanoGPT's 'model_args' and 'iter_num'.
Interpreted interpret(const PyValue& root, const std::string& file) {
  Interpreted out;
  if (!root.is(Kind::kDict)) {
    throw FormatError(fmt::format("{}: holds a {}, expected a state dict or a dict with 'model'",
                                  file, root.type_name()));
  }
  if (all_tensors(root)) {
    out.model = state_dict(root, file);
    out.model_origin = file;
    return out;
  }
  std::string model_key;
  for (const char* key : {"model", "model_state_dict", "state_dict"}) {
    if (root.find(key)) {
      model_key = key;
      break;
    }
  }
  if (model_key.empty()) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : root.entries) keys.push_back(k->brief());
    throw FormatError(
        fmt::format("{}: no model state dict: expected tensors or a key 'model', "
                    "'model_state_dict' or 'state_dict'; keys: {}",
                    file, join(keys, ", ")));
  }
  const std::string model_origin = fmt::format("{} ['{}']", file, model_key);
  out.model_origin = model_origin;
  out.model = state_dict(require(root.find(model_key), file, model_key, Kind::kDict), model_origin);
  for (const char* key : {"optimizer", "optimizer_state_dict"}) {
    const PyValue* opt = root.find(key);
    if (opt && !opt->is(Kind::kNone)) {
      const std::string origin = fmt::format("{} ['{}']", file, key);
      out.optimizer = optimizer_state_dict(require(opt, file, key, Kind::kDict), origin, out.meta);
      break;
    }
  }
  if (const PyValue* args = root.find("model_args")) {
    // nanoGPT's GPTConfig; the head is always tied to wte there. Dropout is not carried over:
    // curvature is measured in eval mode, where it does nothing.
    const std::string origin = file + " ['model_args']";
    require(args, file, "model_args", Kind::kDict);
    nlohmann::json model = {{"arch", "gpt"}, {"tied", true}};
    for (const char* key : {"n_layer", "n_head", "n_embd", "block_size", "vocab_size"}) {
      const PyValue* v = args->find(key);
      if (!v || !v->is(Kind::kInt)) {
        throw FormatError(fmt::format("{}: '{}' is {}, expected an integer", origin, key,
                                      v ? v->brief() : "missing"));
      }
      model[key] = v->integer;
    }
    if (const PyValue* bias = args->find("bias")) {
      if (!bias->is(Kind::kBool)) {
        throw FormatError(
            fmt::format("{}: 'bias' is {}, expected True or False", origin, bias->brief()));
      }
      model["bias"] = bias->boolean;
    }
    out.meta["model"] = model;
  }
  // modded-nanogpt's dict(step, code, model, optimizers): its GPT, recognised by its names, and
  // its two optimizers' states merged into one (mapped to names by the "modded" rule). A list
  // that is not train_gpt_simple.py's [AdamW, Muon] leaves the model readable: the problem is
  // raised only when the optimizer state is used.
  if (root.find("code") && root.find("optimizers") && !root.find("model_args")) {
    bool modded = false;
    for (const auto& [name, t] : out.model) modded = modded || name == "blocks.0.attn.q.weight";
    if (modded) {
      out.meta["model"] = modded_model_config(out.model, root.find("code"), file);
      const PyValue& list = *root.find("optimizers");
      if (!out.optimizer && !list.is(Kind::kNone)) {
        try {
          out.optimizer = modded_optimizers(list, file, root.find("code"), out.meta);
        } catch (const FormatError& e) {
          out.optimizer = std::make_shared<IndexedOptimizerState>();
          out.optimizer->origin = file + " ['optimizers']";
          out.optimizer->modded = true;
          out.optimizer->problem = e.what();
          out.meta.erase("optimizer");
        }
      }
    }
  }
  if (const PyValue* step = root.find("step"); step && step->is(Kind::kInt)) {
    out.meta["step"] = step->integer;
  }
  if (const PyValue* iter = root.find("iter_num")) {
    out.meta["step"] = static_cast<int64_t>(std::llround(number(*iter, file, "iter_num")));
  }
  return out;
}

std::vector<CheckpointInfo> sorted_unique(std::vector<CheckpointInfo> found, const std::string& dir,
                                          const char* expected) {
  if (found.empty()) {
    throw FormatError(fmt::format("no checkpoints in {}: expected {}", dir, expected));
  }
  std::sort(found.begin(), found.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step < b.step; });
  for (size_t i = 1; i < found.size(); ++i) {
    if (found[i].step == found[i - 1].step) {
      throw FormatError(fmt::format("checkpoint directory {}: {} and {} are both step {}", dir,
                                    fs::path(found[i - 1].path).filename().string(),
                                    fs::path(found[i].path).filename().string(), found[i].step));
    }
  }
  return found;
}

std::vector<std::string> entries_of(const std::string& dir) {
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  if (!fs::exists(status))
    throw FormatError(fmt::format("checkpoint directory {} does not exist", dir));
  if (!fs::is_directory(status)) {
    throw FormatError(fmt::format("checkpoint directory {} is not a directory", dir));
  }
  std::vector<std::string> names;
  try {
    for (const auto& entry : fs::directory_iterator(dir))
      names.push_back(entry.path().filename().string());
  } catch (const fs::filesystem_error& e) {
    throw FormatError(fmt::format("checkpoint directory {}: cannot list: {}", dir, e.what()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The model weights of a Hugging Face folder: one file, or the index of a sharded save.
std::string hf_model_file(const std::string& folder) {
  for (const char* name : {"model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                           "pytorch_model.bin.index.json"}) {
    const std::string path = folder + "/" + name;
    if (fs::is_regular_file(path)) return path;
  }
  return "";
}

// A safetensors or torch.save weights file, causal-mask buffers dropped.
NamedTensors read_weights(const std::string& path) {
  NamedTensors out;
  if (has_suffix(path, ".safetensors")) {
    for (auto& [name, t] : SafetensorsReader(path).tensors()) {
      if (!is_causal_mask(name, t.dim())) out.emplace_back(name, t);
    }
    return out;
  }
  const auto root = load_torch_file(path);
  if (!root->is(Kind::kDict)) {
    throw FormatError(
        fmt::format("{}: holds a {}, expected a state dict", path, root->type_name()));
  }
  return state_dict(*root, path);
}

// Every tensor of a sharded save: the shards named by the index's "weight_map", in order of
// first mention; each tensor must be in the shard the index names.
NamedTensors read_sharded_weights(const std::string& index_path) {
  std::ifstream in(index_path);
  const auto index = nlohmann::json::parse(in, nullptr, false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    throw FormatError(
        fmt::format("{}: expected a JSON object with a \"weight_map\" object", index_path));
  }
  std::vector<std::string> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos) {
      throw FormatError(
          fmt::format("{}: \"weight_map.{}\" must be a file name in the folder, "
                      "got {}",
                      index_path, name, shard.dump()));
    }
    if (std::find(shards.begin(), shards.end(), shard.get<std::string>()) == shards.end()) {
      shards.push_back(shard.get<std::string>());
    }
  }
  const std::string folder = fs::path(index_path).parent_path().string();
  NamedTensors out;
  for (const auto& shard : shards) {
    for (auto& [name, t] : read_weights(folder + "/" + shard)) {
      const auto& map = index["weight_map"];
      if (map.contains(name) && map[name] != shard) {
        throw FormatError(fmt::format("{}: tensor '{}' is in {}, but the index places it in {}",
                                      index_path, name, shard, map[name].dump()));
      }
      out.emplace_back(name, t);
    }
  }
  return out;
}

}  // namespace

CheckpointLayout parse_checkpoint_layout(const std::string& text) {
  if (text == "auto") return CheckpointLayout::kAuto;
  if (text == "native") return CheckpointLayout::kNative;
  if (text == "nanogpt") return CheckpointLayout::kNanoGPT;
  if (text == "hf") return CheckpointLayout::kHuggingFace;
  if (text == "pt") return CheckpointLayout::kTorchSteps;
  throw InvalidArgument(
      fmt::format("checkpoint layout '{}': expected auto, native, nanogpt, hf "
                  "or pt",
                  text));
}

std::string layout_name(CheckpointLayout layout) {
  switch (layout) {
    case CheckpointLayout::kAuto:
      return "auto";
    case CheckpointLayout::kNative:
      return "native";
    case CheckpointLayout::kNanoGPT:
      return "nanogpt";
    case CheckpointLayout::kHuggingFace:
      return "hf";
    case CheckpointLayout::kTorchSteps:
      return "pt";
  }
  return "?";
}

CheckpointLayout detect_checkpoint_layout(const std::string& dir) {
  std::map<CheckpointLayout, std::string> seen;  // layout -> an example entry
  for (const auto& name : entries_of(dir)) {
    const std::string path = dir + "/" + name;
    if (name.rfind("step_", 0) == 0 && digits(name.substr(5)) &&
        fs::is_regular_file(path + "/model.safetensors")) {
      seen.emplace(CheckpointLayout::kNative, name);
    } else if (pt_step(name) && fs::is_regular_file(path)) {
      seen.emplace(CheckpointLayout::kTorchSteps, name);
    } else if (is_nanogpt_file(name) && fs::is_regular_file(path)) {
      seen.emplace(CheckpointLayout::kNanoGPT, name);
    } else if (hf_step(name) && fs::is_directory(path) && !hf_model_file(path).empty()) {
      seen.emplace(CheckpointLayout::kHuggingFace, name);
    }
  }
  // libcurv's own layout wins: a run directory may keep exports of other tools beside it.
  if (seen.count(CheckpointLayout::kNative)) return CheckpointLayout::kNative;
  if (seen.size() == 1) return seen.begin()->first;
  if (seen.empty()) {
    const bool single = fs::is_regular_file(dir + "/model.safetensors") ||
                        fs::is_regular_file(dir + "/pytorch_model.bin");
    throw FormatError(fmt::format(
        "no checkpoints in {}: expected folders step_<N>/model.safetensors (native), ckpt.pt or "
        "ckpt_*.pt (nanogpt), checkpoint-<N>/ (hf) or step_<N>.pt files (pt){}",
        dir, single ? " (this looks like a single checkpoint folder: pass its parent)" : ""));
  }
  std::vector<std::string> found;
  for (const auto& [layout, example] : seen) {
    found.push_back(fmt::format("{} ({})", layout_name(layout), example));
  }
  throw FormatError(
      fmt::format("checkpoint directory {} holds checkpoints of several layouts: {}; "
                  "choose one with --layout",
                  dir, join(found, ", ")));
}

std::vector<CheckpointInfo> list_torch_checkpoints(const std::string& dir,
                                                   CheckpointLayout layout) {
  std::vector<CheckpointInfo> found;
  for (const auto& name : entries_of(dir)) {
    const std::string path = (fs::path(dir) / name).string();
    if (layout == CheckpointLayout::kNanoGPT && is_nanogpt_file(name) &&
        fs::is_regular_file(path)) {
      // ckpt_<N>.pt carries its step in the name.
      std::optional<int64_t> step;
      if (name.rfind("ckpt_", 0) == 0) step = digits(name.substr(5, name.size() - 8));
      if (!step) {
        // ckpt.pt, ckpt_best.pt: the step is the file's iter_num (read without the tensors).
        const auto root = load_torch_file(path, TorchFileOptions{false});
        const PyValue* iter = root->find("iter_num");
        if (!iter) throw FormatError(fmt::format("{}: no key 'iter_num' (the step)", path));
        step = std::llround(number(*iter, path, "iter_num"));
      }
      found.push_back({*step, path, layout});
    } else if (layout == CheckpointLayout::kHuggingFace && hf_step(name) &&
               fs::is_directory(path) && !hf_model_file(path).empty()) {
      found.push_back({*hf_step(name), path, layout});
    } else if (layout == CheckpointLayout::kTorchSteps && pt_step(name) &&
               fs::is_regular_file(path)) {
      found.push_back({*pt_step(name), path, layout});
    }
  }
  const char* expected = layout == CheckpointLayout::kNanoGPT ? "ckpt.pt or ckpt_*.pt files"
                         : layout == CheckpointLayout::kHuggingFace
                             ? "checkpoint-<N>/ folders with "
                               "model.safetensors or "
                               "pytorch_model.bin"
                             : "step_<N>.pt files";
  return sorted_unique(std::move(found), dir, expected);
}

Checkpoint load_torch_checkpoint(const CheckpointInfo& info) {
  Checkpoint ckpt;
  ckpt.step = info.step;
  ckpt.path = info.path;
  Interpreted parts;
  if (info.layout == CheckpointLayout::kHuggingFace) {
    ckpt.model_file = hf_model_file(info.path);
    if (ckpt.model_file.empty()) {
      throw FormatError(
          fmt::format("{}: no model.safetensors or pytorch_model.bin (nor a sharded "
                      "index of either)",
                      info.path));
    }
    parts.model = has_suffix(ckpt.model_file, ".index.json") ? read_sharded_weights(ckpt.model_file)
                                                             : read_weights(ckpt.model_file);
    ckpt.optimizer_file = info.path + "/optimizer.pt";
    if (fs::is_regular_file(ckpt.optimizer_file)) {
      const auto root = load_torch_file(ckpt.optimizer_file);
      if (!root->is(Kind::kDict)) {
        throw FormatError(fmt::format("{}: holds a {}, expected optimizer.state_dict()",
                                      ckpt.optimizer_file, root->type_name()));
      }
      parts.optimizer = optimizer_state_dict(*root, ckpt.optimizer_file, parts.meta);
      parts.optimizer->hf_trainer = true;
    }
    // The optimizer's hyper-parameters and step count come from optimizer.pt.
    ckpt.meta_file = parts.optimizer ? ckpt.optimizer_file : info.path;
    // The model's config.json, read by the architecture of its model_type (ModelConfig).
    const std::string config = info.path + "/config.json";
    if (fs::is_regular_file(config)) {
      std::ifstream in(config);
      const auto j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        throw FormatError(fmt::format("{}: not a JSON object", config));
      }
      parts.meta["model"] = j;
      ckpt.model_config_file = config;
    }
    const std::string trainer_state = info.path + "/trainer_state.json";
    if (fs::is_regular_file(trainer_state)) {
      std::ifstream in(trainer_state);
      const auto state = nlohmann::json::parse(in, nullptr, false);
      if (state.is_discarded() || !state.is_object()) {
        throw FormatError(fmt::format("{}: not a JSON object", trainer_state));
      }
      if (state.contains("global_step") && state["global_step"] != info.step) {
        throw FormatError(fmt::format("{}: \"global_step\" is {} but the folder is step {}",
                                      trainer_state, state["global_step"].dump(), info.step));
      }
    }
  } else {
    const auto root = load_torch_file(info.path);
    parts = interpret(*root, info.path);
    ckpt.model_file = parts.model_origin;
    ckpt.optimizer_file = parts.optimizer ? parts.optimizer->origin : info.path;
    ckpt.meta_file = info.path;
    if (parts.meta.contains("model")) {
      ckpt.model_config_file =
          info.path +
          (parts.meta["model"]["arch"] == "modded" ? " ['model'] shapes" : " ['model_args']");
    }
    // nanoGPT's ckpt.pt names its step inside; a file named for a step must agree with it.
    if (parts.meta.contains("step")) {
      const int64_t step = parts.meta["step"].get<int64_t>();
      if (step != info.step) {
        if (info.layout == CheckpointLayout::kTorchSteps ||
            has_suffix(info.path, "_" + std::to_string(info.step) + ".pt")) {
          // Files named by step (step_<N>.pt, ckpt_<N>.pt) take the name's step; a different
          // iter_num inside is kept only as a record.
          parts.meta["iter_num"] = step;
        } else {
          throw FormatError(
              fmt::format("{}: iter_num is {} but the checkpoint was listed as step "
                          "{}",
                          info.path, step, info.step));
        }
      }
    }
  }
  parts.meta["step"] = info.step;
  ckpt.model = std::move(parts.model);
  ckpt.indexed_optimizer = parts.optimizer;
  ckpt.meta = parse_checkpoint_meta(parts.meta.dump(), ckpt.meta_file);
  return ckpt;
}

// ---------------------------------------------------------------------------------------------
// Optimizer indices -> parameter names

namespace {

// How torch's parameter indices map to the model's parameters (docs/checkpoints.md).
enum class ParamOrder {
  kAuto,     // the recorded names, else whichever of model, ndim and hidden fits
  kModel,    // all groups together in model order
  kNdim,     // two groups: ndim >= 2, then the rest (nanoGPT)
  kHidden,   // Muon's hidden matrices filling whole groups, then the rest
  kModded,   // modded-nanogpt's AdamW groups, then Muon's size-sorted block matrices
  kTrainer,  // the Hugging Face Trainer's groups: weight-decayed parameters, then the rest
  kFile,     // file:PATH, one name per line in index order
  kNames,    // the names the optimizer recorded (param_names); chosen by auto, never named
};

struct ParamOrderName {
  ParamOrder order;
  const char* name;
};
// The rules a user may name, in the order messages list them; "file:" takes a path after it.
constexpr ParamOrderName kParamOrders[] = {
    {ParamOrder::kAuto, "auto"},     {ParamOrder::kModel, "model"},
    {ParamOrder::kNdim, "ndim"},     {ParamOrder::kHidden, "hidden"},
    {ParamOrder::kModded, "modded"}, {ParamOrder::kTrainer, "trainer"},
    {ParamOrder::kFile, "file:"}};
// The rules auto tries when no names were recorded, from least to most specific.
constexpr ParamOrder kGuessed[] = {ParamOrder::kModel, ParamOrder::kNdim, ParamOrder::kHidden};

std::string param_order_name(ParamOrder order) {
  if (order == ParamOrder::kNames) return "names";
  for (const auto& entry : kParamOrders) {
    if (entry.order == order) return entry.name;
  }
  return "?";
}

// A rule as the user wrote it: the rule and, for file:PATH, the path.
struct ParamOrderSpec {
  ParamOrder order = ParamOrder::kAuto;
  std::string path;
};

InvalidArgument unknown_param_order(const std::string& text) {
  std::vector<std::string> names;
  for (const auto& entry : kParamOrders) {
    names.push_back(entry.order == ParamOrder::kFile ? "file:PATH" : entry.name);
  }
  const std::string last = names.back();
  names.pop_back();
  return InvalidArgument(
      fmt::format("--param-order '{}': expected {} or {}", text, join(names, ", "), last));
}

ParamOrderSpec parse_param_order(const std::string& text) {
  for (const auto& entry : kParamOrders) {
    if (entry.order == ParamOrder::kFile && text.rfind(entry.name, 0) == 0) {
      return {entry.order, text.substr(std::string(entry.name).size())};
    }
    if (text == entry.name) return {entry.order, ""};
  }
  throw unknown_param_order(text);
}

// The parameter (position in `space`) of each optimizer index under one rule, or why it fails.
struct Mapping {
  std::string rule;              // the rule's name ("file:PATH" in full), as meta records it
  std::vector<size_t> of_index;  // by position in the concatenated groups
  std::string problem;
};

// What every rule looks at: the optimizer's groups and state, and the model.
struct OrderInput {
  const IndexedOptimizerState& ix;
  const ParamSpace& space;
  std::vector<int64_t> indices;               // the optimizer's indices, in group order
  const ModelStructure* structure = nullptr;  // the parameters' roles, where known
};

std::string count_problem(const OrderInput& in, size_t expected, const char* what) {
  return fmt::format("the optimizer has {} parameters, {} {}", in.indices.size(), what, expected);
}

std::string group_sizes(const IndexedOptimizerState& ix) {
  std::vector<std::string> sizes;
  for (const auto& g : ix.groups) sizes.push_back(std::to_string(g.params.size()));
  return join(sizes, " + ");
}

std::string check_shapes(const IndexedOptimizerState& ix, const ParamSpace& space,
                         const std::vector<int64_t>& indices, const std::vector<size_t>& params) {
  for (size_t k = 0; k < indices.size(); ++k) {
    auto it = ix.state.find(indices[k]);
    if (it == ix.state.end()) continue;
    const auto& p = space[params[k]];
    for (const auto& [key, t] : it->second) {
      if (t.sizes().vec() != p.shape) {
        // modded-nanogpt's merged state: the key in the file is that of one of the two optimizers.
        const std::string where =
            !ix.modded ? fmt::format("state[{}]", indices[k])
            : indices[k] < ix.muon_offset
                ? fmt::format("[0] (AdamW) state[{}]", indices[k])
                : fmt::format("[1] (Muon) state[{}]", indices[k] - ix.muon_offset);
        const std::string slot = ix.modded && key == "momentum_buffer" ? "momentum" : key;
        return fmt::format("{}.{} has shape {}, but parameter '{}' has shape {}", where, slot,
                           shape_string(t.sizes().vec()), p.name, shape_string(p.shape));
      }
    }
  }
  return "";
}

std::string regex_escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::string("\\^$.|?*+()[]{}").find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

std::vector<std::string> read_order_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument(fmt::format("--param-order file '{}' cannot be opened", path));
  std::vector<std::string> names;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  return names;
}

Mapping by_model_order(const OrderInput& in) {
  Mapping m{param_order_name(ParamOrder::kModel), {}, ""};
  if (in.indices.size() != in.space.size()) {
    m.problem = count_problem(in, in.space.size(), "the model");
    return m;
  }
  for (size_t i = 0; i < in.indices.size(); ++i) m.of_index.push_back(i);
  return m;
}

// Muon's split: the matrices it orthogonalises by default, then the rest, in any groups.
Mapping by_hidden_first(const OrderInput& in) {
  Mapping m{param_order_name(ParamOrder::kHidden), {}, ""};
  if (in.indices.size() != in.space.size()) {
    m.problem = count_problem(in, in.space.size(), "the model");
    return m;
  }
  for (size_t i = 0; i < in.space.size(); ++i) {
    if (is_hidden_matrix(in.space[i])) m.of_index.push_back(i);
  }
  // The orthogonalised matrices fill whole groups.
  size_t boundary = 0;
  bool aligned = m.of_index.empty();
  for (const auto& g : in.ix.groups) {
    boundary += g.params.size();
    aligned = aligned || boundary == m.of_index.size();
  }
  if (!aligned) {
    m.problem = fmt::format(
        "its groups hold {} parameters, which do not start with the "
        "model's {} hidden matrices",
        group_sizes(in.ix), m.of_index.size());
    m.of_index.clear();
    return m;
  }
  for (size_t i = 0; i < in.space.size(); ++i) {
    if (!is_hidden_matrix(in.space[i])) m.of_index.push_back(i);
  }
  return m;
}

// nanoGPT's configure_optimizers: matrices (ndim >= 2) in group 0, the rest in group 1.
// Two groups: the parameters `in_first` selects, then the rest, each in model order. `split`
// describes the split in a mismatch message, given the two counts.
template <class InFirst, class Describe>
Mapping two_groups(const OrderInput& in, ParamOrder order, InFirst in_first, Describe split) {
  Mapping m{param_order_name(order), {}, ""};
  std::vector<size_t> first, rest;
  for (size_t i = 0; i < in.space.size(); ++i) (in_first(i) ? first : rest).push_back(i);
  const auto& groups = in.ix.groups;
  if (groups.size() != 2 || groups[0].params.size() != first.size() ||
      groups[1].params.size() != rest.size()) {
    m.problem = fmt::format("its groups hold {} parameters, {}", group_sizes(in.ix),
                            split(first.size(), rest.size()));
    return m;
  }
  m.of_index = first;
  m.of_index.insert(m.of_index.end(), rest.begin(), rest.end());
  return m;
}

Mapping by_ndim_groups(const OrderInput& in) {
  return two_groups(
      in, ParamOrder::kNdim, [&](size_t i) { return in.space[i].shape.size() >= 2; },
      [](size_t matrices, size_t rest) {
        return fmt::format("the model has {} with ndim >= 2 and {} others", matrices, rest);
      });
}

// The Hugging Face Trainer's create_optimizer: group 0 holds get_decay_parameter_names(model) in
// model order, group 1 the rest. A parameter is undecayed when it lies in an nn.LayerNorm (here:
// a parameter whose role is a norm gain or bias) or its lower-cased name matches bias, layernorm,
// rmsnorm, (^|.)norm($|.) or _norm($|.).
Mapping by_trainer_groups(const OrderInput& in) {
  static const std::regex undecayed_name(R"(bias|layernorm|rmsnorm|(^|\.)norm($|\.)|_norm($|\.))");
  auto decayed = [&](size_t i) {
    if (in.structure && i < in.structure->params.size()) {
      const ParamRole role = in.structure->params[i].role;
      if (role == ParamRole::kNormGain || role == ParamRole::kNormBias) return false;
    }
    std::string name = in.space[i].name;
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return !std::regex_search(name, undecayed_name);
  };
  return two_groups(in, ParamOrder::kTrainer, decayed, [](size_t decayed_count, size_t rest) {
    return fmt::format("the Trainer's rule gives {} weight-decayed and {} others", decayed_count,
                       rest);
  });
}

// modded-nanogpt's train_gpt_simple.py: AdamW over [embed.weight], [proj.weight] and [every
// parameter with ndim < 2, in model order]; Muon over the blocks' matrices (ndim >= 2) in model
// order, sorted by size, largest first (Python's sorted(key=size, reverse=True) on torch.Size:
// lexicographic on the dimensions, and stable).
Mapping by_modded_groups(const OrderInput& in) {
  Mapping m{param_order_name(ParamOrder::kModded), {}, ""};
  if (!in.ix.modded) {
    m.problem =
        "the optimizer state is not modded-nanogpt's two optimizers ('optimizers' beside "
        "'code' and a modded GPT's 'model' in a state_step<N>.pt)";
    return m;
  }
  std::vector<size_t> embed, head, small, matrices;
  for (size_t i = 0; i < in.space.size(); ++i) {
    const auto& p = in.space[i];
    if (p.name == "embed.weight") {
      embed.push_back(i);
    } else if (p.name == "proj.weight") {
      head.push_back(i);
    } else if (p.shape.size() < 2) {
      small.push_back(i);
    } else if (p.name.rfind("blocks.", 0) == 0) {
      matrices.push_back(i);
    } else {
      m.problem =
          fmt::format("parameter '{}' is in neither of train_gpt_simple.py's optimizers", p.name);
      return m;
    }
  }
  std::stable_sort(matrices.begin(), matrices.end(),
                   [&](size_t a, size_t b) { return in.space[a].shape > in.space[b].shape; });
  std::vector<size_t> adam_sizes = {embed.size(), head.size(), small.size()};
  std::vector<size_t> adam_groups, muon_groups;
  for (const auto& g : in.ix.groups) {
    (g.use_muon.value_or(false) ? muon_groups : adam_groups).push_back(g.params.size());
  }
  size_t muon_total = 0;
  for (size_t n : muon_groups) muon_total += n;
  if (adam_groups != adam_sizes || muon_groups.size() != 1 || muon_total != matrices.size()) {
    m.problem = fmt::format(
        "its groups hold {} parameters; train_gpt_simple.py's hold 1 (embed.weight) + 1 "
        "(proj.weight) + {} (ndim < 2) in AdamW and {} (the blocks' matrices) in Muon",
        group_sizes(in.ix), small.size(), matrices.size());
    return m;
  }
  for (const auto* part : {&embed, &head, &small, &matrices}) {
    m.of_index.insert(m.of_index.end(), part->begin(), part->end());
  }
  return m;
}

// Names in index order: those the optimizer recorded (`order_file` empty) or an order file's.
Mapping by_listed_names(const OrderInput& in, const std::string& order_file) {
  const bool recorded = order_file.empty();
  Mapping m{recorded ? param_order_name(ParamOrder::kNames) : "file:" + order_file, {}, ""};
  const std::string path = recorded ? in.ix.origin + " param_names" : order_file;
  std::vector<std::string> names;
  if (recorded) {
    for (const auto& g : in.ix.groups) names.insert(names.end(), g.names.begin(), g.names.end());
  } else {
    names = read_order_file(path);
  }
  if (names.size() != in.indices.size()) {
    throw InvalidArgument(
        fmt::format("{}: --param-order file '{}' lists {} names for the "
                    "optimizer's {} parameters",
                    in.ix.origin, path, names.size(), in.indices.size()));
  }
  const auto model_names = in.space.names();
  for (const auto& name : names) {
    auto index = in.space.find(name);
    if (!index) {
      throw InvalidArgument(fmt::format("{}{}: '{}' is not a model parameter{}",
                                        recorded ? "" : "--param-order file ", path, name,
                                        did_you_mean(name, model_names)));
    }
    m.of_index.push_back(*index);
  }
  return m;
}

// One rule's mapping, its problem including any state tensor whose shape does not fit.
Mapping map_by(const OrderInput& in, ParamOrder order, const std::string& order_file = "") {
  Mapping m;
  switch (order) {
    case ParamOrder::kModel:
      m = by_model_order(in);
      break;
    case ParamOrder::kNdim:
      m = by_ndim_groups(in);
      break;
    case ParamOrder::kHidden:
      m = by_hidden_first(in);
      break;
    case ParamOrder::kModded:
      m = by_modded_groups(in);
      break;
    case ParamOrder::kTrainer:
      m = by_trainer_groups(in);
      break;
    case ParamOrder::kFile:
      m = by_listed_names(in, order_file);
      break;
    case ParamOrder::kNames:
      m = by_listed_names(in, "");
      break;
    case ParamOrder::kAuto:
      throw unknown_param_order("auto");  // resolved by choose_auto
  }
  if (!m.problem.empty()) return m;
  std::vector<size_t> params(m.of_index.begin(), m.of_index.end());
  m.problem = check_shapes(in.ix, in.space, in.indices, params);
  return m;
}

// auto without recorded names: the rules whose group sizes and state shapes fit; an error when
// none does, or when several do and name the parameters differently.
Mapping choose_guessed(const OrderInput& in) {
  std::vector<Mapping> fits, misfits;
  for (ParamOrder order : kGuessed) {
    auto m = map_by(in, order);
    (m.problem.empty() ? fits : misfits).push_back(std::move(m));
  }
  if (fits.empty()) {
    std::vector<std::string> why;
    for (const auto& m : misfits) why.push_back(m.rule + ": " + m.problem);
    throw InvalidArgument(fmt::format(
        "{}: optimizer state does not fit the model's parameters in any known order ({}); it "
        "is for a different model, or pass --param-order file:PATH listing the names in "
        "optimizer order",
        in.ix.origin, join(why, "; ")));
  }
  // Rules that fit but map some index differently leave the names undecided, unless there is
  // no state at all (then only the group hyper-parameters depend on the order).
  std::vector<std::string> disagreeing = {fits[0].rule};
  for (size_t i = 1; i < fits.size(); ++i) {
    if (fits[i].of_index != fits[0].of_index) disagreeing.push_back(fits[i].rule);
  }
  if (disagreeing.size() > 1 && !in.ix.state.empty()) {
    throw InvalidArgument(fmt::format(
        "{}: optimizer parameter order is ambiguous: the group sizes and state shapes fit the "
        "rules {}, which name the parameters differently; pass --param-order with one of them "
        "or file:PATH",
        in.ix.origin, join(disagreeing, ", ")));
  }
  // Without state, a grouping rule (ndim, hidden) is the more specific claim than model order.
  return fits.back();
}

Mapping choose_mapping(const OrderInput& in, const ParamOrderSpec& spec, const std::string& text) {
  if (spec.order != ParamOrder::kAuto) {
    Mapping m = map_by(in, spec.order, spec.path);
    if (!m.problem.empty()) {
      throw InvalidArgument(fmt::format("{}: --param-order {} does not fit the model: {}",
                                        in.ix.origin, text, m.problem));
    }
    return m;
  }
  // modded-nanogpt's optimizers: the script's own order.
  if (in.ix.modded) {
    Mapping m = map_by(in, ParamOrder::kModded);
    if (!m.problem.empty()) {
      throw InvalidArgument(
          fmt::format("{}: optimizer state does not fit the model as train_gpt_simple.py orders "
                      "it (--param-order modded): {}",
                      in.ix.origin, m.problem));
    }
    return m;
  }
  const auto& groups = in.ix.groups;
  const bool names_recorded =
      !groups.empty() && std::all_of(groups.begin(), groups.end(), [](const auto& g) {
        return g.names.size() == g.params.size() && !g.params.empty();
      });
  if (!names_recorded) {
    // A Trainer's optimizer.pt: the Trainer's own grouping, when it fits.
    if (in.ix.hf_trainer) {
      Mapping m = map_by(in, ParamOrder::kTrainer);
      if (m.problem.empty()) return m;
    }
    return choose_guessed(in);
  }
  // The optimizer saved its parameters' names: no order needs to be guessed.
  Mapping m = map_by(in, ParamOrder::kNames);
  if (!m.problem.empty()) {
    throw InvalidArgument(
        fmt::format("{}: optimizer state does not fit the model: {}", in.ix.origin, m.problem));
  }
  return m;
}

// Names the state tensors and records the groups, the rule and Muon's partition in the meta.
void apply_mapping(Checkpoint& ckpt, const OrderInput& in, const Mapping& chosen) {
  const auto& ix = in.ix;
  const auto& space = in.space;
  NamedTensors named;
  std::map<int64_t, size_t> param_of;
  for (size_t k = 0; k < in.indices.size(); ++k) param_of[in.indices[k]] = chosen.of_index[k];
  for (const auto& [index, tensors] : ix.state) {
    const std::string& name = space[param_of.at(index)].name;
    for (const auto& [key, t] : tensors) named.emplace_back(name + "." + key, t);
  }
  if (!ckpt.meta.optimizer) ckpt.meta.optimizer.emplace();
  OptimizerRecord& record = *ckpt.meta.optimizer;
  record.param_groups.clear();
  // MuonWithAuxAdam's groups say which parameters it orthogonalises: exactly those names.
  std::vector<std::string> orthogonalised;
  size_t k = 0;
  for (const auto& g : ix.groups) {
    OptimizerParamGroup group;
    for (const auto& [key, value] : g.hyper.items())
      group.hyper.emplace_back(key, value.get<double>());
    for (size_t i = 0; i < g.params.size(); ++i, ++k) {
      const std::string& name = space[chosen.of_index[k]].name;
      group.params.push_back(name);
      if (g.use_muon.value_or(false)) orthogonalised.push_back(regex_escaped(name));
    }
    record.param_groups.push_back(std::move(group));
  }
  record.param_order = chosen.rule;
  if (!orthogonalised.empty()) record.muon_params = "^(" + join(orthogonalised, "|") + ")$";
  ckpt.optimizer = std::move(named);
  ckpt.indexed_optimizer.reset();
}

}  // namespace

void validate_param_order(const std::string& param_order) {
  const ParamOrderSpec spec = parse_param_order(param_order);
  if (spec.order == ParamOrder::kFile && !fs::is_regular_file(spec.path)) {
    throw InvalidArgument(fmt::format("--param-order {}: no such file", param_order));
  }
}

void resolve_optimizer_state(Checkpoint& ckpt, const ParamSpace& space,
                             const std::string& param_order, const ModelStructure* structure) {
  validate_param_order(param_order);
  if (!ckpt.indexed_optimizer) return;
  if (!ckpt.indexed_optimizer->problem.empty()) {
    throw InvalidArgument(ckpt.indexed_optimizer->problem);
  }
  OrderInput in{*ckpt.indexed_optimizer, space, {}, structure};
  for (const auto& g : in.ix.groups) {
    in.indices.insert(in.indices.end(), g.params.begin(), g.params.end());
  }
  const Mapping chosen = choose_mapping(in, parse_param_order(param_order), param_order);
  apply_mapping(ckpt, in, chosen);
}

}  // namespace curv
