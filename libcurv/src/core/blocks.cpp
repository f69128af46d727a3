#include "curv/core/blocks.h"

#include <fmt/format.h>

#include <cctype>
#include <map>
#include <regex>

#include "core/fmt_torch.h"
#include "curv/core/error.h"
#include "curv/core/structure.h"

namespace curv {

BlockPartition::BlockPartition(std::vector<Block> blocks, size_t num_params)
    : blocks_(std::move(blocks)), block_of_(num_params, 0) {
  for (size_t b = 0; b < blocks_.size(); ++b) {
    for (size_t p : blocks_[b].params) block_of_.at(p) = b;
  }
}

namespace {

bool is_number(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// "transformer.h.3.attn.c_attn.weight" -> "transformer.h.3"; "" when no numeric component.
std::string layer_prefix(const std::string& name) {
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('.', start);
    if (end == std::string::npos) end = name.size();
    if (is_number(name.substr(start, end - start)) && end < name.size()) {
      return name.substr(0, end);
    }
    start = end + 1;
  }
  return "";
}

// The component block of a layer parameter (BlockRule::kComponent). With a fused Q/K/V
// projection the attention splits into that projection and the output projection instead; a
// mixture of experts' MLP splits into its router and one block per expert.
std::string component_of(const ParamStructure& p, bool fused_qkv) {
  if (p.expert >= 0) return fmt::format("mlp.expert{}", p.expert);
  switch (p.role) {
    case ParamRole::kAttentionQuery:
    case ParamRole::kAttentionKey:
      return "attn.qk";
    case ParamRole::kAttentionValue:
      return "attn.vo";
    case ParamRole::kAttentionOutput:
      return fused_qkv ? "attn.o" : "attn.vo";
    case ParamRole::kFusedQkv:
      return "attn.qkv";
    case ParamRole::kMlpInput:
    case ParamRole::kMlpGate:
    case ParamRole::kMlpOutput:
      return "mlp";
    case ParamRole::kNormGain:
    case ParamRole::kNormBias:
      return "norm";
    case ParamRole::kRouter:
      return "router";
    default:
      return "other";
  }
}

// "memory.weight" -> "memory"; a name without a dot is its own module.
std::string module_prefix(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos || dot == 0 ? name : name.substr(0, dot);
}

}  // namespace

BlockPartition BlockPartition::by_rule(const ParamSpace& space, BlockRule rule) {
  return by_rule(space, ModelStructure::from_names(space), rule);
}

BlockPartition BlockPartition::by_rule(const ParamSpace& space, const ModelStructure& structure,
                                       BlockRule rule) {
  structure.validate(space);
  std::vector<Block> blocks;
  std::map<std::string, size_t> index;
  auto add = [&](const std::string& block, size_t param) {
    auto it = index.find(block);
    if (it == index.end()) {
      it = index.emplace(block, blocks.size()).first;
      blocks.push_back(Block{block, {}});
    }
    blocks[it->second].params.push_back(param);
  };
  bool has_layers = false, fused = false;
  for (size_t i = 0; i < space.size(); ++i) {
    has_layers = has_layers || structure[i].layer >= 0;
    fused = fused || structure[i].role == ParamRole::kFusedQkv;
  }
  for (size_t i = 0; i < space.size(); ++i) {
    const auto& name = space[i].name;
    switch (rule) {
      case BlockRule::kWhole:
        add("all", i);
        break;
      case BlockRule::kTensor:
        add(name, i);
        break;
      case BlockRule::kLayer:
      case BlockRule::kComponent: {
        if (structure[i].layer >= 0) {
          // The block keeps the layer's name path ("transformer.h.3") where the name has one.
          std::string prefix = layer_prefix(name);
          if (prefix.empty()) prefix = fmt::format("layer{}", structure[i].layer);
          add(rule == BlockRule::kLayer ? prefix : prefix + "." + component_of(structure[i], fused),
              i);
        } else if (structure.is_embedding(i)) {
          add("embeddings", i);
        } else if (has_layers || structure.is_head(i)) {
          // Final norms and the output head of a layered model form its head block.
          add("head", i);
        } else {
          // A model without numbered layers (the model problems): one block per module.
          add(module_prefix(name), i);
        }
        break;
      }
    }
  }
  // Embeddings first, layers in model order, head last: the order a reader expects in tables.
  std::stable_sort(blocks.begin(), blocks.end(), [](const Block& a, const Block& b) {
    auto rank = [](const Block& x) {
      return x.name == "embeddings" ? 0 : x.name == "head" ? 2 : 1;
    };
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    return a.params.front() < b.params.front();
  });
  return BlockPartition(std::move(blocks), space.size());
}

BlockPartition BlockPartition::by_regex(
    const ParamSpace& space, const std::vector<std::pair<std::string, std::string>>& groups) {
  std::vector<std::regex> patterns;
  for (const auto& [name, pattern] : groups) {
    try {
      patterns.emplace_back(pattern);
    } catch (const std::regex_error& e) {
      throw InvalidArgument(
          fmt::format("block group '{}': invalid regex '{}': {}", name, pattern, e.what()));
    }
  }
  std::vector<Block> blocks;
  for (const auto& g : groups) blocks.push_back(Block{g.first, {}});
  Block rest{"rest", {}};
  for (size_t i = 0; i < space.size(); ++i) {
    bool claimed = false;
    for (size_t g = 0; g < patterns.size() && !claimed; ++g) {
      if (std::regex_search(space[i].name, patterns[g])) {
        blocks[g].params.push_back(i);
        claimed = true;
      }
    }
    if (!claimed) rest.params.push_back(i);
  }
  for (size_t g = 0; g < blocks.size(); ++g) {
    if (blocks[g].params.empty()) {
      throw InvalidArgument(fmt::format("block group '{}' (regex '{}') matches no parameter",
                                        groups[g].first, groups[g].second));
    }
  }
  if (!rest.params.empty()) blocks.push_back(std::move(rest));
  return BlockPartition(std::move(blocks), space.size());
}

BlockRule BlockPartition::parse_rule(const std::string& text) {
  if (text == "layer") return BlockRule::kLayer;
  if (text == "component") return BlockRule::kComponent;
  if (text == "tensor") return BlockRule::kTensor;
  if (text == "whole") return BlockRule::kWhole;
  throw InvalidOption("{0}: expected layer, component, tensor or whole",
                      {{"BlockOptions.rule", "'" + InvalidOption::literal(text) + "'"}});
}

std::string BlockPartition::rule_name(BlockRule rule) {
  switch (rule) {
    case BlockRule::kLayer:
      return "layer";
    case BlockRule::kComponent:
      return "component";
    case BlockRule::kTensor:
      return "tensor";
    case BlockRule::kWhole:
      return "whole";
  }
  return "";
}

std::vector<std::string> BlockPartition::names() const {
  std::vector<std::string> out;
  for (const auto& b : blocks_) out.push_back(b.name);
  return out;
}

}  // namespace curv
