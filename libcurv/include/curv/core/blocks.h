// Blocks: a partition of the parameters into named groups (transformer layers, tensors, or user
// regex groups) over which curvature is broken down: per-block NDS, the coupling matrix, spectra.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "curv/core/param_space.h"
#include "curv/core/structure.h"

namespace curv {

struct Block {
  std::string name;
  std::vector<size_t> params;  // indices into the ParamSpace, ascending
};

enum class BlockRule {
  // One block per numbered layer ("transformer.h.3"), plus "embeddings" and "head" (final norm,
  // output head and anything else outside the layers). The default. A model without numbered
  // layers gets one block per module ("memory.weight" -> "memory") besides the embeddings.
  kLayer,
  // Each layer split by component: "<layer>.attn.qk" (query and key projections), "<layer>.attn.vo"
  // (value and output), "<layer>.mlp" and "<layer>.norm", with embeddings and head as kLayer. A
  // fused Q/K/V projection (nanoGPT's c_attn) cannot be split by parameter: it forms
  // "<layer>.attn.qkv" and the output projection "<layer>.attn.o".
  kComponent,
  kTensor,  // one block per parameter tensor
  kWhole,   // a single block "all"
};

class BlockPartition {
 public:
  BlockPartition() = default;
  // Blocks by rule. kLayer groups names by their first numeric path component
  // ("transformer.h.3.attn.c_attn.weight" -> "transformer.h.3"); names without one go to
  // "embeddings" (token/position embeddings: wte, wpe, embed*) or "head" (everything else).
  // The layers, embeddings and head come from the structure's roles and layer indices (a block
  // keeps the layer's name path, or is "layer<N>" when the name has none); without a structure,
  // from the name rules (ModelStructure::from_names).
  static BlockPartition by_rule(const ParamSpace& space, const ModelStructure& structure,
                                BlockRule rule);
  static BlockPartition by_rule(const ParamSpace& space, BlockRule rule);
  // User groups: each (name, ECMAScript regex) claims the parameters whose full name matches,
  // first match wins; unmatched parameters go to a block "rest". Empty groups are an error.
  static BlockPartition by_regex(const ParamSpace& space,
                                 const std::vector<std::pair<std::string, std::string>>& groups);
  // "layer" | "component" | "tensor" | "whole"; InvalidOption naming BlockOptions.rule otherwise.
  static BlockRule parse_rule(const std::string& text);
  static std::string rule_name(BlockRule rule);  // as parse_rule reads it

  size_t size() const { return blocks_.size(); }
  const Block& operator[](size_t i) const { return blocks_[i]; }
  const std::vector<Block>& blocks() const { return blocks_; }
  std::vector<std::string> names() const;
  // Block index of each parameter.
  const std::vector<size_t>& block_of() const { return block_of_; }

 private:
  explicit BlockPartition(std::vector<Block> blocks, size_t num_params);
  std::vector<Block> blocks_;
  std::vector<size_t> block_of_;
};

}  // namespace curv
