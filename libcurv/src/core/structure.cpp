#include "curv/core/structure.h"

#include <fmt/format.h>

#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/strings.h"
#include "curv/core/error.h"

namespace curv {

namespace {

struct RoleEntry {
  ParamRole role;
  const char* name;
};

constexpr RoleEntry kRoles[] = {
    {ParamRole::kTokenEmbedding, "token_embedding"},
    {ParamRole::kPositionEmbedding, "position_embedding"},
    {ParamRole::kOutputHead, "output_head"},
    {ParamRole::kNormGain, "norm_gain"},
    {ParamRole::kNormBias, "norm_bias"},
    {ParamRole::kAttentionQuery, "query"},
    {ParamRole::kAttentionKey, "key"},
    {ParamRole::kAttentionValue, "value"},
    {ParamRole::kAttentionOutput, "attention_output"},
    {ParamRole::kFusedQkv, "fused_qkv"},
    {ParamRole::kMlpInput, "mlp_input"},
    {ParamRole::kMlpGate, "mlp_gate"},
    {ParamRole::kMlpOutput, "mlp_output"},
    {ParamRole::kRouter, "router"},
    {ParamRole::kOther, "other"},
};

std::vector<std::string> split_dots(const std::string& name) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = name.find('.', start);
    parts.push_back(name.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

bool is_number(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// The first numeric path component that is not the last one ("transformer.h.3.ln_1.weight" ->
// 3), the rule BlockRule::kLayer has always used for its layer blocks.
int64_t layer_of(const std::vector<std::string>& parts) {
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (is_number(parts[i])) return std::stoll(parts[i]);
  }
  return -1;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

ParamRole role_of_name(const std::string& name) {
  const auto parts = split_dots(name);
  if (is_embedding_name(name)) {
    static const std::regex position(
        R"((^|\.)(wpe|pos_emb|embed_positions|position_embeddings)(\.|$))");
    return std::regex_search(name, position) ? ParamRole::kPositionEmbedding
                                             : ParamRole::kTokenEmbedding;
  }
  if (is_head_name(name)) return ParamRole::kOutputHead;
  // The module is the component before "weight"/"bias" (or the last one for bare names).
  const std::string& last = parts.back();
  const bool leaf = last == "weight" || last == "bias";
  const std::string module = leaf && parts.size() >= 2 ? parts[parts.size() - 2] : last;
  bool in_attention = false, in_mlp = false;
  for (size_t i = 0; i + (leaf ? 2 : 1) < parts.size(); ++i) {
    in_attention = in_attention || contains(parts[i], "attn") || contains(parts[i], "attention");
    in_mlp = in_mlp || parts[i] == "mlp" || parts[i] == "feed_forward" || parts[i] == "ffn" ||
             parts[i] == "block_sparse_moe";
  }
  static const std::regex norm(R"(^(ln(_[a-z0-9]+)?|[a-z_]*norm[a-z_0-9]*)$)");
  if (std::regex_match(module, norm)) {
    return last == "bias" ? ParamRole::kNormBias : ParamRole::kNormGain;
  }
  // Fused projections whose rows are the query, key and value rows in turn (nanoGPT and GPT-2's
  // c_attn, Phi-3's qkv_proj). GPT-NeoX's query_key_value interleaves them head by head, which
  // the row slices cannot express: it keeps the role "other".
  if (module == "c_attn" || module == "qkv_proj") return ParamRole::kFusedQkv;
  if (module == "q_proj" || module == "query") return ParamRole::kAttentionQuery;
  if (module == "k_proj" || module == "key") return ParamRole::kAttentionKey;
  if (module == "v_proj" || module == "value") return ParamRole::kAttentionValue;
  if (module == "o_proj" || module == "out_proj") return ParamRole::kAttentionOutput;
  if (module == "c_proj") {
    if (in_attention) return ParamRole::kAttentionOutput;
    if (in_mlp) return ParamRole::kMlpOutput;
  }
  if (module == "dense" && in_attention) return ParamRole::kAttentionOutput;  // GPT-NeoX
  // Phi-3's gate_up_proj holds the gate and input rows of its gated MLP.
  if (module == "c_fc" || module == "up_proj" || module == "fc1" || module == "dense_h_to_4h" ||
      module == "gate_up_proj") {
    return ParamRole::kMlpInput;
  }
  if (module == "dense_4h_to_h") return ParamRole::kMlpOutput;
  // A mixture of experts: the router is the MLP's own gate (a gate_proj is a gated MLP's input);
  // Mixtral's experts name their projections w1 (gate), w3 (input) and w2 (output).
  if (in_mlp && (module == "gate" || module == "router")) return ParamRole::kRouter;
  if (in_mlp && module == "w1") return ParamRole::kMlpGate;
  if (in_mlp && module == "w3") return ParamRole::kMlpInput;
  if (in_mlp && module == "w2") return ParamRole::kMlpOutput;
  if (module == "gate_proj") return ParamRole::kMlpGate;
  if (module == "down_proj" || module == "fc2") return ParamRole::kMlpOutput;
  return ParamRole::kOther;
}

// Hugging Face's GPT-2 stores its projections as Conv1D, [in, out]: its c_attn is [d, 3d] where
// nanoGPT's is [3d, d]. Its c_attn, c_proj and c_fc weights are then transposed.
bool conv1d_layout(const ParamSpace& space) {
  for (const auto& info : space.params()) {
    const auto parts = split_dots(info.name);
    if (parts.size() >= 2 && parts[parts.size() - 2] == "c_attn" && parts.back() == "weight" &&
        info.shape.size() == 2 && info.shape[1] == 3 * info.shape[0]) {
      return true;
    }
  }
  return false;
}

// The query, key and value rows of a fused projection (along the columns of a transposed one);
// none for any other role.
void set_fused_slices(ParamStructure& p, const ParamInfo& info, int64_t n_head, int64_t n_kv_head,
                      int64_t head_dim) {
  p.slices.clear();
  if (p.role == ParamRole::kFusedQkv && !info.shape.empty()) {
    const int64_t rows = p.transposed ? info.shape[1] : info.shape[0];
    p.slices = fused_qkv_slices(rows, n_head, n_kv_head, head_dim);
  }
}

ParamStructure structure_of_name(const ParamInfo& info, int64_t n_head, int64_t n_kv_head,
                                 int64_t head_dim, bool conv1d) {
  ParamStructure p;
  p.role = role_of_name(info.name);
  const auto parts = split_dots(info.name);
  p.layer = layer_of(parts);
  for (size_t i = 0; i + 2 < parts.size(); ++i) {
    if (parts[i] == "experts" && is_number(parts[i + 1])) p.expert = std::stoll(parts[i + 1]);
  }
  if (conv1d && info.shape.size() == 2 && parts.size() >= 2) {
    const std::string& module = parts[parts.size() - 2];
    p.transposed = module == "c_attn" || module == "c_proj" || module == "c_fc";
  }
  set_fused_slices(p, info, n_head, n_kv_head, head_dim);
  return p;
}

}  // namespace

const char* role_name(ParamRole role) {
  for (const auto& r : kRoles) {
    if (r.role == role) return r.name;
  }
  return "other";
}

std::vector<std::string> role_names() {
  std::vector<std::string> out;
  for (const auto& r : kRoles) out.push_back(r.name);
  return out;
}

ParamRole parse_role(const std::string& text, const std::string& context) {
  for (const auto& r : kRoles) {
    if (text == r.name) return r.role;
  }
  throw InvalidArgument(fmt::format("{}: unknown parameter role '{}'{}; roles: {}", context, text,
                                    did_you_mean(text, role_names()), join(role_names(), ", ")));
}

std::vector<RowSlice> fused_qkv_slices(int64_t rows, int64_t n_head, int64_t n_kv_head,
                                       int64_t head_dim) {
  const int64_t kv = n_kv_head > 0 ? n_kv_head : n_head;
  int64_t q_rows = 0, kv_rows = 0;
  if (n_head > 0 && head_dim <= 0 && rows % (n_head + 2 * kv) == 0) {
    head_dim = rows / (n_head + 2 * kv);
  }
  if (n_head > 0 && head_dim > 0 && (n_head + 2 * kv) * head_dim == rows) {
    q_rows = n_head * head_dim;
    kv_rows = kv * head_dim;
  } else if (rows > 0 && rows % 3 == 0) {
    q_rows = kv_rows = rows / 3;
  } else {
    return {};
  }
  return {{ParamRole::kAttentionQuery, 0, q_rows},
          {ParamRole::kAttentionKey, q_rows, q_rows + kv_rows},
          {ParamRole::kAttentionValue, q_rows + kv_rows, q_rows + 2 * kv_rows}};
}

ModelStructure ModelStructure::from_names(const ParamSpace& space) {
  ModelStructure s;
  const bool conv1d = conv1d_layout(space);
  for (const auto& info : space.params()) {
    s.params.push_back(structure_of_name(info, 0, 0, 0, conv1d));
  }
  return s;
}

ModelStructure ModelStructure::from_mapping(const std::string& text, const ParamSpace& space,
                                            const std::string& origin) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(fmt::format("{}: structure mapping is not valid JSON: {}", origin, e.what()));
  }
  if (!j.is_object()) {
    throw FormatError(fmt::format("{}: structure mapping must be a JSON object", origin));
  }
  static const std::vector<std::string> keys = {"n_head", "n_kv_head", "head_dim", "roles"};
  for (const auto& item : j.items()) {
    if (std::find(keys.begin(), keys.end(), item.key()) == keys.end()) {
      throw FormatError(fmt::format("{}: unknown structure mapping key '{}'{}; keys: {}", origin,
                                    item.key(), did_you_mean(item.key(), keys), join(keys, ", ")));
    }
  }
  ModelStructure s;
  auto count = [&](const char* key) -> int64_t {
    if (!j.contains(key)) return 0;
    const auto& v = j[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      throw InvalidArgument(fmt::format(
          "{}: structure mapping key '{}' = {} must be an integer >= 0", origin, key, v.dump()));
    }
    return v.get<int64_t>();
  };
  s.n_head = count("n_head");
  s.n_kv_head = count("n_kv_head");
  s.head_dim = count("head_dim");
  if (s.n_kv_head == 0) s.n_kv_head = s.n_head;
  std::vector<std::pair<std::regex, ParamRole>> rules;
  if (j.contains("roles")) {
    const auto& roles = j["roles"];
    if (!roles.is_object()) {
      throw FormatError(
          fmt::format("{}: structure mapping key 'roles' must be an object of "
                      "regex: role; got {}",
                      origin, roles.dump()));
    }
    for (const auto& item : roles.items()) {
      const std::string context = fmt::format("{}: roles['{}']", origin, item.key());
      if (!item.value().is_string()) {
        throw FormatError(
            fmt::format("{} must be a role name (string); got {}", context, item.value().dump()));
      }
      std::regex pattern;
      try {
        pattern = std::regex(item.key());
      } catch (const std::regex_error& e) {
        throw InvalidArgument(fmt::format("{}: invalid regex: {}", context, e.what()));
      }
      rules.emplace_back(pattern, parse_role(item.value().get<std::string>(), context));
    }
  }
  const bool conv1d = conv1d_layout(space);
  for (const auto& info : space.params()) {
    ParamStructure p = structure_of_name(info, s.n_head, s.n_kv_head, s.head_dim, conv1d);
    for (const auto& [pattern, role] : rules) {
      if (!std::regex_search(info.name, pattern)) continue;
      p.role = role;
      set_fused_slices(p, info, s.n_head, s.n_kv_head, s.head_dim);
      break;
    }
    s.params.push_back(std::move(p));
  }
  try {
    s.validate(space);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{}: {}", origin, e.what()));
  }
  return s;
}

ModelStructure ModelStructure::from_mapping_file(const std::string& path, const ParamSpace& space) {
  std::ifstream in(path);
  if (!in) throw FormatError(fmt::format("cannot open structure mapping '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return from_mapping(ss.str(), space, path);
}

void ModelStructure::validate(const ParamSpace& space) const {
  if (params.size() != space.size()) {
    throw InvalidArgument(fmt::format("model structure describes {} parameters, the model has {}",
                                      params.size(), space.size()));
  }
  if (n_head < 0 || n_kv_head < 0 || head_dim < 0) {
    throw InvalidArgument(
        fmt::format("model structure: n_head = {}, n_kv_head = {}, head_dim = {} "
                    "must be >= 0",
                    n_head, n_kv_head, head_dim));
  }
  if (n_kv_head > 0 && (n_head == 0 || n_kv_head > n_head || n_head % n_kv_head != 0)) {
    throw InvalidArgument(
        fmt::format("model structure: n_kv_head = {} must divide n_head = {}", n_kv_head, n_head));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& shape = space[i].shape;
    const size_t out_dim = params[i].transposed && shape.size() == 2 ? 1 : 0;
    const int64_t rows = shape.size() > out_dim ? shape[out_dim] : 0;
    for (const auto& slice : params[i].slices) {
      if (slice.begin < 0 || slice.begin > slice.end || slice.end > rows) {
        throw InvalidArgument(
            fmt::format("model structure: {} slice [{}, {}) of '{}' lies outside "
                        "its {} rows",
                        role_name(slice.role), slice.begin, slice.end, space[i].name, rows));
      }
    }
  }
}

bool ModelStructure::is_embedding(size_t i) const {
  const ParamRole role = params.at(i).role;
  return role == ParamRole::kTokenEmbedding || role == ParamRole::kPositionEmbedding;
}

bool ModelStructure::is_head(size_t i) const { return params.at(i).role == ParamRole::kOutputHead; }

bool ModelStructure::is_hidden_matrix(size_t i, const ParamSpace& space) const {
  return space[i].shape.size() >= 2 && !is_embedding(i) && !is_head(i);
}

bool is_embedding_name(const std::string& name) {
  static const std::regex pattern(
      R"((^|\.)(wte|wpe|embed[a-z_]*|embeddings?|tok_emb|pos_emb)(\.|$))");
  return std::regex_search(name, pattern) && !is_head_name(name);
}

bool is_head_name(const std::string& name) {
  static const std::regex pattern(R"((^|\.)(lm_head|embed_out)(\.|$))");  // embed_out: GPT-NeoX
  return std::regex_search(name, pattern);
}

bool is_hidden_matrix(const ParamInfo& param) {
  return param.shape.size() >= 2 && !is_embedding_name(param.name) && !is_head_name(param.name);
}

}  // namespace curv
