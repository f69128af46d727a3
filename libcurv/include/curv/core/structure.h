// Parameter roles: what each parameter of a model is for (embedding, output head, hidden matrix),
// so the layer blocks, Muon's default partition and the within-block selection ask for roles
// instead of a model's parameter names.
#pragma once

#include <string>

#include "curv/core/param_space.h"

namespace curv {

// Token or position embedding by name: wte, wpe, embed*, embedding(s), tok_emb, pos_emb as a
// dotted path component.
bool is_embedding_name(const std::string& name);
// The output head by name: lm_head as a dotted path component.
bool is_head_name(const std::string& name);
// Parameters the Muon family orthogonalises by default: ndim >= 2, not embeddings or head.
bool is_hidden_matrix(const ParamInfo& param);

}  // namespace curv
