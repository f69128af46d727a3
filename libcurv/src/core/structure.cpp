#include "curv/core/structure.h"

#include <regex>

namespace curv {

bool is_embedding_name(const std::string& name) {
  static const std::regex pattern(
      R"((^|\.)(wte|wpe|embed[a-z_]*|embeddings?|tok_emb|pos_emb)(\.|$))");
  return std::regex_search(name, pattern);
}

bool is_head_name(const std::string& name) {
  static const std::regex pattern(R"((^|\.)lm_head(\.|$))");
  return std::regex_search(name, pattern);
}

bool is_hidden_matrix(const ParamInfo& param) {
  return param.shape.size() >= 2 && !is_embedding_name(param.name) && !is_head_name(param.name);
}

}  // namespace curv
