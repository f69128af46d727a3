// Name rules for the roles parameters play: token/position embeddings and the output head. One
// definition serves the layer blocks, the Muon partition and the within-block selection.
#pragma once

#include <regex>
#include <string>

namespace curv {

// wte, wpe, embed*, embedding(s), tok_emb, pos_emb as a dotted path component.
inline bool is_embedding_name(const std::string& name) {
  static const std::regex pattern(
      R"((^|\.)(wte|wpe|embed[a-z_]*|embeddings?|tok_emb|pos_emb)(\.|$))");
  return std::regex_search(name, pattern);
}

// lm_head as a dotted path component.
inline bool is_head_name(const std::string& name) {
  static const std::regex pattern(R"((^|\.)lm_head(\.|$))");
  return std::regex_search(name, pattern);
}

}  // namespace curv
