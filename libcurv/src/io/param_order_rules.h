// The pieces of the optimizer parameter-order rules that the layouts' own rules share (not public
// API): the modded-nanogpt and Hugging Face Trainer rules live with their layouts.
#pragma once

#include <fmt/format.h>

#include <string>
#include <vector>

#include "curv/core/param_space.h"
#include "curv/core/structure.h"
#include "curv/io/param_order.h"
#include "io/torch_checkpoint.h"

namespace curv {

// The parameter (position in `space`) of each optimizer index under one rule, or why it fails.
struct ParamMapping {
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

// "3 + 2": the sizes of the optimizer's groups, for messages.
std::string group_sizes(const IndexedOptimizerState& ix);

// Two groups: the parameters `in_first` selects, then the rest, each in model order. `split`
// describes the split in a mismatch message, given the two counts.
template <class InFirst, class Describe>
ParamMapping two_groups(const OrderInput& in, ParamOrder order, InFirst in_first, Describe split) {
  ParamMapping m{param_order_name(order), {}, ""};
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

// The layouts' rules (hf_layout.cpp, modded_checkpoint.cpp).
ParamMapping by_trainer_groups(const OrderInput& in);
ParamMapping by_modded_groups(const OrderInput& in);

}  // namespace curv
