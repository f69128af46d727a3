// The runtime parameters of a mixture of experts trained by transformers 5 (fused_experts.h).
#include "io/fused_experts.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

namespace curv {

namespace {

struct ExpertProjections {
  std::optional<size_t> gate, up, down;
};

// The layer's module path before its experts: "model.layers.0.block_sparse_moe.experts.0.w1.weight"
// → "model.layers.0.mlp." (transformers 5 names Mixtral's block mlp too).
std::string runtime_prefix(const std::string& expert_param) {
  std::string module = expert_param.substr(0, expert_param.find(".experts."));
  const size_t dot = module.rfind('.');
  return module.substr(0, dot == std::string::npos ? 0 : dot + 1) + "mlp.";
}

// A router's name as transformers 5 holds it: Mixtral's block_sparse_moe.gate is mlp.gate there.
std::string runtime_router_name(std::string name) {
  const std::string mixtral = ".block_sparse_moe.";
  const size_t at = name.find(mixtral);
  if (at != std::string::npos) name.replace(at, mixtral.size(), ".mlp.");
  return name;
}

}  // namespace

std::optional<FusedExpertSpace> fused_expert_space(const ParamSpace& space,
                                                   const ModelStructure& structure,
                                                   RouterPlacement router) {
  if (structure.params.size() != space.size()) return std::nullopt;
  std::vector<std::string> names;
  std::vector<at::Tensor> like;
  FusedExpertSpace out;
  auto add = [&](std::string name, std::vector<int64_t> shape, ParamStructure role,
                 std::vector<RuntimePart> parts) {
    names.push_back(std::move(name));
    like.push_back(at::empty(shape, at::TensorOptions().device(at::kMeta)));
    out.structure.params.push_back(std::move(role));
    out.parts.push_back(std::move(parts));
  };
  bool any = false;
  for (size_t i = 0; i < space.size();) {
    // The router the model lists before its layer's experts, where the program held it after.
    std::optional<size_t> deferred;
    if (structure.params[i].role == ParamRole::kRouter &&
        router == RouterPlacement::kAfterExperts && i + 1 < space.size() &&
        structure.params[i + 1].expert >= 0) {
      deferred = i++;
    }
    if (structure.params[i].expert < 0) {
      const bool routes = structure.params[i].role == ParamRole::kRouter;
      add(routes ? runtime_router_name(space[i].name) : space[i].name, space[i].shape,
          structure.params[i], {{i, -1, 0}});
      ++i;
      continue;
    }
    // The layer's run of expert parameters.
    std::map<int64_t, ExpertProjections> experts;
    const size_t first = i;
    const int64_t layer = structure.params[i].layer;
    for (;
         i < space.size() && structure.params[i].expert >= 0 && structure.params[i].layer == layer;
         ++i) {
      const ParamStructure& p = structure.params[i];
      auto& e = experts[p.expert];
      std::optional<size_t>* slot = p.role == ParamRole::kMlpGate     ? &e.gate
                                    : p.role == ParamRole::kMlpInput  ? &e.up
                                    : p.role == ParamRole::kMlpOutput ? &e.down
                                                                      : nullptr;
      if (slot == nullptr || *slot) return std::nullopt;
      *slot = i;
    }
    const auto count = static_cast<int64_t>(experts.size());
    if (experts.begin()->first != 0 || experts.rbegin()->first != count - 1) return std::nullopt;
    const auto& e0 = experts.begin()->second;
    if (!e0.gate || !e0.up || !e0.down) return std::nullopt;
    const auto gate_shape = space[*e0.gate].shape, down_shape = space[*e0.down].shape;
    if (gate_shape.size() != 2 || down_shape.size() != 2) return std::nullopt;
    std::vector<RuntimePart> gate_up, down;
    for (const auto& [e, p] : experts) {
      if (!p.gate || !p.up || !p.down || space[*p.gate].shape != gate_shape ||
          space[*p.up].shape != gate_shape || space[*p.down].shape != down_shape) {
        return std::nullopt;
      }
      gate_up.push_back({*p.gate, e, 0});
      gate_up.push_back({*p.up, e, gate_shape[0]});
      down.push_back({*p.down, e, 0});
    }
    const std::string prefix = runtime_prefix(space[first].name);
    ParamStructure role;
    role.layer = layer;
    role.role = ParamRole::kMlpInput;
    add(prefix + "experts.gate_up_proj", {count, 2 * gate_shape[0], gate_shape[1]}, role,
        std::move(gate_up));
    role.role = ParamRole::kMlpOutput;
    add(prefix + "experts.down_proj", {count, down_shape[0], down_shape[1]}, role, std::move(down));
    if (deferred) {
      add(runtime_router_name(space[*deferred].name), space[*deferred].shape,
          structure.params[*deferred], {{*deferred, -1, 0}});
    }
    any = true;
  }
  if (!any) return std::nullopt;
  out.space = ParamSpace(names, like);
  out.structure.n_head = structure.n_head;
  out.structure.n_kv_head = structure.n_kv_head;
  out.structure.head_dim = structure.head_dim;
  out.structure.tied = structure.tied;
  return out;
}

bool splits_into_experts(const std::string& rule) {
  static const char* const kElementwise[] = {"adamw", "adam", "nadam",   "radam",
                                             "sgd",   "lion", "ademamix"};
  return std::any_of(std::begin(kElementwise), std::end(kElementwise),
                     [&](const char* r) { return rule == r; });
}

}  // namespace curv
