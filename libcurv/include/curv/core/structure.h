// Model structure: what each parameter of a model is for (embedding, head, norm, attention query /
// key / value / output, MLP input / gate / output), its layer, and the model's head counts, so the
// layer blocks, Muon's default partition and the within-block groups ask for roles, never names.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "curv/core/param_space.h"

namespace curv {

enum class ParamRole {
  kTokenEmbedding,
  kPositionEmbedding,
  kOutputHead,
  kNormGain,
  kNormBias,
  kAttentionQuery,
  kAttentionKey,
  kAttentionValue,
  kAttentionOutput,
  kFusedQkv,  // one projection holding query, key and value rows (nanoGPT's c_attn)
  kMlpInput,
  kMlpGate,
  kMlpOutput,
  kRouter,  // a mixture of experts' router: the logits that pick each token's experts
  kOther,
};

// "token_embedding", "position_embedding", "output_head", "norm_gain", "norm_bias", "query",
// "key", "value", "attention_output", "fused_qkv", "mlp_input", "mlp_gate", "mlp_output",
// "router", "other".
const char* role_name(ParamRole role);
// The inverse of role_name; throws InvalidArgument naming `context` and the value.
ParamRole parse_role(const std::string& text, const std::string& context);
std::vector<std::string> role_names();

// Rows [begin, end) of a fused projection that play `role` (query, key or value).
struct RowSlice {
  ParamRole role = ParamRole::kOther;
  int64_t begin = 0;
  int64_t end = 0;
};

struct ParamStructure {
  ParamRole role = ParamRole::kOther;
  int64_t layer = -1;            // index of the transformer layer (or MLP layer); -1: none
  std::vector<RowSlice> slices;  // kFusedQkv: the query, key and value rows, in row order
  // Stored [in, out] (HF's Conv1D, y = x W + b) instead of [out, in]: the output features, and
  // so `slices` and the head groups, run along the columns.
  bool transposed = false;
  int64_t expert = -1;  // the expert of a mixture-of-experts MLP it belongs to; -1: none
};

struct ModelStructure {
  std::vector<ParamStructure> params;  // aligned with the model's ParamSpace
  int64_t n_head = 0;     // attention (query) heads per layer; 0: unknown or no attention
  int64_t n_kv_head = 0;  // key/value heads (< n_head with grouped-query attention); 0: unknown
  int64_t head_dim = 0;   // rows of one head in a query/key/value projection; 0: unknown
  // Tied parameters by name, (tied, source): e.g. ("lm_head.weight", "transformer.wte.weight")
  // when the output head reuses the token embedding. The tied one may be absent from the space.
  std::vector<std::pair<std::string, std::string>> tied;

  // The structure name rules give (the default of Objective::structure()):
  //  - nanoGPT: wte, wpe, c_attn (fused Q/K/V, rows split in three equal slices), attn.c_proj,
  //    mlp.c_fc, mlp.c_proj, ln_*, lm_head;
  //  - Hugging Face LLaMA / GPT-2 style: embed_tokens, embed_positions, q_proj, k_proj, v_proj,
  //    o_proj, gate_proj, up_proj, down_proj, input_layernorm, post_attention_layernorm, norm,
  //    lm_head (the LLaMA, Gemma, OLMo and Qwen families; OLMo 2's q_norm, k_norm and
  //    post_feedforward_layernorm are norms). GPT-2's Conv1D weights ([in, out], recognised by
  //    a c_attn of [d, 3d]) are marked transposed;
  //  - Phi-3: qkv_proj (fused Q/K/V rows), gate_up_proj (MLP input);
  //  - GPT-NeoX / Pythia: embed_in, embed_out (the head), attention.dense, dense_h_to_4h,
  //    dense_4h_to_h; its query_key_value interleaves Q/K/V head by head and stays "other";
  //  - mixtures of experts: the router mlp.gate or block_sparse_moe.gate (Mixtral), and the
  //    experts' projections under experts.<E> (Mixtral's w1 gate, w3 input, w2 output), each
  //    with its expert index.
  // Embeddings are wte, wpe, embed*, embedding(s), tok_emb, pos_emb as a dotted path component,
  // the head lm_head or embed_out. The layer is the first numeric path component that is not the
  // last one.
  // Head counts stay 0 (names do not give them); an lm_head.weight and a token embedding of the
  // same shape are not assumed tied.
  static ModelStructure from_names(const ParamSpace& space);
  // A user mapping (JSON text): {"n_head": N, "n_kv_head": M, "head_dim": D, "roles":
  // {"<ECMAScript regex>": "<role>", ...}}; every key optional. A parameter takes the role of
  // the first regex (in file order) searched in its name that matches, else its name-rule role;
  // layers come from the name rules; n_kv_head defaults to n_head. A "fused_qkv" parameter is
  // split into query, key and value rows by the head counts (equal thirds without them).
  // Errors (FormatError / InvalidArgument) name `origin`, the key and the bad value.
  static ModelStructure from_mapping(const std::string& json, const ParamSpace& space,
                                     const std::string& origin = "<mapping>");
  static ModelStructure from_mapping_file(const std::string& path, const ParamSpace& space);

  // Throws InvalidArgument unless params matches the space and the head counts are consistent.
  void validate(const ParamSpace& space) const;

  const ParamStructure& operator[](size_t i) const { return params.at(i); }
  bool is_embedding(size_t i) const;  // token or position embedding
  bool is_head(size_t i) const;       // output head
  // The matrices the Muon family orthogonalises by default: ndim >= 2, not embeddings or head.
  bool is_hidden_matrix(size_t i, const ParamSpace& space) const;
  // Key/value heads: n_kv_head, or n_head when n_kv_head is 0.
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
};

// The query/key/value row slices of a fused projection of `rows` rows: with n_head > 0 and
// head_dim > 0, n_head·head_dim query rows and kv_heads·head_dim key and value rows each; else
// equal thirds. Empty when the rows do not add up.
std::vector<RowSlice> fused_qkv_slices(int64_t rows, int64_t n_head, int64_t n_kv_head,
                                       int64_t head_dim);

// Name rules alone, for code that only has names (the io "hidden" parameter order).
bool is_embedding_name(const std::string& name);
bool is_head_name(const std::string& name);
// ndim >= 2 and not an embedding or head by name: ModelStructure::from_names(space)
// .is_hidden_matrix(i, space) for every parameter.
bool is_hidden_matrix(const ParamInfo& param);

}  // namespace curv
