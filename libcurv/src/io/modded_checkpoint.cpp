// modded-nanogpt's checkpoints (records/track_3_optimization/train_gpt_simple.py): its
// state_step<N>.pt holds dict(step, code, model, optimizers). Its model config from the state
// dict and the script text, its two optimizers read as one Muon state, and the "modded" rule that
// names their indices.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <regex>

#include "curv/core/error.h"
#include "io/param_order_rules.h"
#include "io/torch_checkpoint.h"

namespace curv {

namespace torch_state {

namespace {

using Kind = PyValue::Kind;

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

// Why a Muon state holding the momentum of only `held` of `muon_indices` is: the file of one rank
// of a multi-rank run (each rank steps only Muon's parameters base + rank, the script's loop over
// params[base_i + rank], so its state holds every world_size-th parameter), or "" when no rank
// split of up to 8 ranks explains it.
std::string rank_share(const std::vector<int64_t>& muon_indices, const std::vector<int64_t>& held) {
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
  return ranks;
}

// One record for both: Muon's first group, AdamW's first group; AdamW's step count.
nlohmann::json merged_record(const IndexedOptimizerState& out, const nlohmann::json& adam_meta) {
  nlohmann::json opt = nlohmann::json::object();
  opt["name"] = "muon";
  opt["recognition"] =
      "modded-nanogpt's ['optimizers'] (train_gpt_simple.py's AdamW and Muon), by the file's "
      "code and model";
  nlohmann::json hyper = out.groups.back().hyper;
  for (const auto& g : out.groups) {
    if (g.use_muon.value_or(false)) {
      hyper = g.hyper;
      break;
    }
  }
  hyper.update(out.groups.front().hyper);
  opt["hyper"] = hyper;
  if (adam_meta["optimizer"].contains("step_count")) {
    opt["step_count"] = adam_meta["optimizer"]["step_count"];
  }
  return opt;
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
  out->writer_rule =
      IndexedOptimizerState::WriterRule{ParamOrder::kModded, true, "train_gpt_simple.py"};
  int64_t offset = 0;
  for (const auto& g : adam->groups) {
    for (int64_t p : g.params) offset = std::max(offset, p + 1);
  }
  out->muon_offset = offset;
  for (auto& g : adam->groups) {
    g.hyper = adam_part_hyper(g.hyper);
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
  std::vector<int64_t> held;
  for (int64_t i : muon_indices) {
    if (muon->state.count(i)) held.push_back(i);
  }
  const int64_t adam_steps = adam_meta["optimizer"].value("step_count", int64_t{0});
  if (held.size() != muon_indices.size() && (!held.empty() || adam_steps > 0)) {
    const std::string ranks = rank_share(muon_indices, held);
    out->problem = fmt::format(
        "{}: Muon state holds the momentum of {} of its {} parameters{}", muon_origin, held.size(),
        muon_indices.size(),
        ranks.empty() ? " (it is incomplete: libcurv needs the momentum of every parameter)"
                      : ranks);
  }
  meta["optimizer"] = merged_record(*out, adam_meta);
  return out;
}

}  // namespace

bool is_modded_save(const PyValue& root, const NamedTensors& model) {
  if (!root.find("code") || !root.find("optimizers") || root.find("model_args")) return false;
  for (const auto& [name, t] : model) {
    if (name == "blocks.0.attn.q.weight") return true;
  }
  return false;
}

// Its GPT, recognised by its names, and its two optimizers' states merged into one (mapped to
// names by the "modded" rule). A list that is not train_gpt_simple.py's [AdamW, Muon] leaves the
// model readable: the problem is raised only when the optimizer state is used.
void read_modded_save(const PyValue& root, const std::string& file, SavedCheckpoint& out) {
  out.meta["model"] = modded_model_config(out.model, root.find("code"), file);
  out.model_config_origin = file + " ['model'] shapes";
  const PyValue& list = *root.find("optimizers");
  if (out.optimizer || list.is(Kind::kNone)) return;
  try {
    out.optimizer = modded_optimizers(list, file, root.find("code"), out.meta);
  } catch (const FormatError& e) {
    out.optimizer = std::make_shared<IndexedOptimizerState>();
    out.optimizer->origin = file + " ['optimizers']";
    out.optimizer->modded = true;
    out.optimizer->writer_rule =
        IndexedOptimizerState::WriterRule{ParamOrder::kModded, true, "train_gpt_simple.py"};
    out.optimizer->problem = e.what();
    out.meta.erase("optimizer");
  }
}

}  // namespace torch_state

// modded-nanogpt's train_gpt_simple.py: AdamW over [embed.weight], [proj.weight] and [every
// parameter with ndim < 2, in model order]; Muon over the blocks' matrices (ndim >= 2) in model
// order, sorted by size, largest first (Python's sorted(key=size, reverse=True) on torch.Size:
// lexicographic on the dimensions, and stable).
ParamMapping by_modded_groups(const OrderInput& in) {
  ParamMapping m{param_order_name(ParamOrder::kModded), {}, ""};
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

}  // namespace curv
