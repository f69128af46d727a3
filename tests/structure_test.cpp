#include "curv/core/structure.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "curv/core/blocks.h"
#include "curv/core/error.h"
#include "curv/models/models.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;
using Catch::Matchers::Contains;

namespace {

// A ParamSpace from (name, shape) pairs: structure only needs names and shapes.
ParamSpace space_of(const std::vector<std::pair<std::string, std::vector<int64_t>>>& params) {
  std::vector<std::string> names;
  std::vector<at::Tensor> like;
  for (const auto& [name, shape] : params) {
    names.push_back(name);
    like.push_back(at::empty(shape, at::kFloat));
  }
  return ParamSpace(names, like);
}

// A two-layer Hugging Face LLaMA with grouped-query attention: 4 query heads, 2 key/value heads
// of head_dim 2 (hidden 8), MLP width 12, vocabulary 10, untied head.
ParamSpace llama_space() {
  std::vector<std::pair<std::string, std::vector<int64_t>>> params = {
      {"model.embed_tokens.weight", {10, 8}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    params.push_back({p + "self_attn.q_proj.weight", {8, 8}});
    params.push_back({p + "self_attn.k_proj.weight", {4, 8}});
    params.push_back({p + "self_attn.v_proj.weight", {4, 8}});
    params.push_back({p + "self_attn.o_proj.weight", {8, 8}});
    params.push_back({p + "mlp.gate_proj.weight", {12, 8}});
    params.push_back({p + "mlp.up_proj.weight", {12, 8}});
    params.push_back({p + "mlp.down_proj.weight", {8, 12}});
    params.push_back({p + "input_layernorm.weight", {8}});
    params.push_back({p + "post_attention_layernorm.weight", {8}});
  }
  params.push_back({"model.norm.weight", {8}});
  params.push_back({"lm_head.weight", {10, 8}});
  return space_of(params);
}

ParamRole role(const ModelStructure& s, const ParamSpace& space, const std::string& name) {
  return s[space.index(name)].role;
}

}  // namespace

TEST_CASE("the built-in GPT's structure: fused Q/K/V slices, layers, heads, tied head",
          "[structure]") {
  auto config = tiny_gpt_config();  // n_embd 4, n_head 2
  config.as<GptConfig>().tied = true;
  auto model = make_model(config, ModelInit{0, at::kDouble});
  const ModelStructure s = model->structure();
  const auto& space = model->space();
  REQUIRE_NOTHROW(s.validate(space));
  CHECK(s.n_head == 2);
  CHECK(s.n_kv_head == 2);
  CHECK(s.head_dim == 2);
  REQUIRE(s.tied.size() == 1);
  CHECK(s.tied[0].first == "lm_head.weight");
  CHECK(s.tied[0].second == "transformer.wte.weight");
  const auto& attn = s[space.index("transformer.h.0.attn.c_attn.weight")];
  CHECK(attn.role == ParamRole::kFusedQkv);
  CHECK(attn.layer == 0);
  REQUIRE(attn.slices.size() == 3);
  const ParamRole roles[] = {ParamRole::kAttentionQuery, ParamRole::kAttentionKey,
                             ParamRole::kAttentionValue};
  for (int i = 0; i < 3; ++i) {
    CHECK(attn.slices[i].role == roles[i]);
    CHECK(attn.slices[i].begin == 4 * i);
    CHECK(attn.slices[i].end == 4 * (i + 1));
  }
  CHECK(role(s, space, "transformer.wte.weight") == ParamRole::kTokenEmbedding);
  CHECK(role(s, space, "transformer.wpe.weight") == ParamRole::kPositionEmbedding);
  CHECK(role(s, space, "transformer.h.0.attn.c_proj.weight") == ParamRole::kAttentionOutput);
  CHECK(role(s, space, "transformer.h.0.mlp.c_fc.weight") == ParamRole::kMlpInput);
  CHECK(role(s, space, "transformer.h.0.mlp.c_proj.weight") == ParamRole::kMlpOutput);
  CHECK(role(s, space, "transformer.h.0.ln_1.bias") == ParamRole::kNormBias);
  CHECK(role(s, space, "transformer.ln_f.weight") == ParamRole::kNormGain);
  CHECK(s[space.index("transformer.ln_f.weight")].layer == -1);
  // The name rules agree with the exact structure on every role, layer and slice of nanoGPT.
  const ModelStructure named = ModelStructure::from_names(space);
  for (size_t i = 0; i < space.size(); ++i) {
    INFO(space[i].name);
    CHECK(named[i].role == s[i].role);
    CHECK(named[i].layer == s[i].layer);
    CHECK(named[i].slices.size() == s[i].slices.size());
    CHECK(named.is_hidden_matrix(i, space) == is_hidden_matrix(space[i]));
  }
  config.as<GptConfig>().tied = false;
  auto untied = make_model(config, ModelInit{0, at::kDouble});
  CHECK(untied->structure().tied.empty());
  CHECK(role(untied->structure(), untied->space(), "lm_head.weight") == ParamRole::kOutputHead);
}

TEST_CASE("name rules on Hugging Face LLaMA names with grouped-query shapes", "[structure]") {
  const ParamSpace space = llama_space();
  const ModelStructure s = ModelStructure::from_names(space);
  REQUIRE_NOTHROW(s.validate(space));
  CHECK(s.n_head == 0);  // names do not give head counts
  CHECK(role(s, space, "model.embed_tokens.weight") == ParamRole::kTokenEmbedding);
  CHECK(role(s, space, "model.layers.1.self_attn.q_proj.weight") == ParamRole::kAttentionQuery);
  CHECK(role(s, space, "model.layers.1.self_attn.k_proj.weight") == ParamRole::kAttentionKey);
  CHECK(role(s, space, "model.layers.1.self_attn.v_proj.weight") == ParamRole::kAttentionValue);
  CHECK(role(s, space, "model.layers.1.self_attn.o_proj.weight") == ParamRole::kAttentionOutput);
  CHECK(role(s, space, "model.layers.0.mlp.gate_proj.weight") == ParamRole::kMlpGate);
  CHECK(role(s, space, "model.layers.0.mlp.up_proj.weight") == ParamRole::kMlpInput);
  CHECK(role(s, space, "model.layers.0.mlp.down_proj.weight") == ParamRole::kMlpOutput);
  CHECK(role(s, space, "model.layers.0.input_layernorm.weight") == ParamRole::kNormGain);
  CHECK(role(s, space, "model.layers.0.post_attention_layernorm.weight") == ParamRole::kNormGain);
  CHECK(role(s, space, "model.norm.weight") == ParamRole::kNormGain);
  CHECK(role(s, space, "lm_head.weight") == ParamRole::kOutputHead);
  CHECK(s[space.index("model.layers.1.self_attn.k_proj.weight")].layer == 1);
  CHECK(s[space.index("model.norm.weight")].layer == -1);
  // Muon's hidden matrices: the 14 attention and MLP matrices, not the embedding or head.
  size_t hidden = 0;
  for (size_t i = 0; i < space.size(); ++i) hidden += s.is_hidden_matrix(i, space) ? 1 : 0;
  CHECK(hidden == 14);
  // Layer blocks from the roles: embeddings, two layers, head (final norm and lm_head).
  auto blocks = BlockPartition::by_rule(space, s, BlockRule::kLayer);
  CHECK(blocks.names() ==
        std::vector<std::string>{"embeddings", "model.layers.0", "model.layers.1", "head"});
  CHECK(blocks[3].params.size() == 2);
}

TEST_CASE("a mapping file gives head counts and roles; bad files name the file and key",
          "[structure]") {
  TempDir dir;
  const ParamSpace space = llama_space();
  const std::string path = dir.file("structure.json");
  {
    std::ofstream out(path);
    out << R"({"n_head": 4, "n_kv_head": 2,
               "roles": {"gate_proj": "mlp_input", "^lm_head\\.": "other"}})";
  }
  const ModelStructure s = ModelStructure::from_mapping_file(path, space);
  CHECK(s.n_head == 4);
  CHECK(s.n_kv_head == 2);
  CHECK(s.kv_heads() == 2);
  CHECK(role(s, space, "model.layers.0.mlp.gate_proj.weight") == ParamRole::kMlpInput);
  CHECK(role(s, space, "lm_head.weight") == ParamRole::kOther);
  // Unmapped names keep their name-rule roles and layers.
  CHECK(role(s, space, "model.layers.1.self_attn.k_proj.weight") == ParamRole::kAttentionKey);
  CHECK(s[space.index("model.layers.1.self_attn.k_proj.weight")].layer == 1);

  // A fused projection mapped by role is split by the grouped-query head counts.
  const ParamSpace fused =
      space_of({{"blocks.0.qkv.weight", {16, 8}}, {"blocks.0.out.weight", {8, 8}}});
  const ModelStructure f = ModelStructure::from_mapping(
      R"({"n_head": 4, "n_kv_head": 2, "roles": {"qkv": "fused_qkv", "out": "attention_output"}})",
      fused, "inline");
  const auto& slices = f[0].slices;
  REQUIRE(slices.size() == 3);
  CHECK(slices[0].end == 8);  // 4 query heads of 2 rows
  CHECK(slices[1].begin == 8);
  CHECK(slices[1].end == 12);  // 2 key heads
  CHECK(slices[2].end == 16);
  CHECK(f[1].role == ParamRole::kAttentionOutput);

  auto write = [&](const std::string& text) {
    std::ofstream out(path);
    out << text;
    return path;
  };
  CURV_CHECK_THROWS(ModelStructure::from_mapping_file(write("{"), space), FormatError,
                    Contains(path));
  CURV_CHECK_THROWS(ModelStructure::from_mapping_file(write(R"({"n_heads": 4})"), space),
                    FormatError, Contains(path) && Contains("n_heads") && Contains("n_head"));
  CURV_CHECK_THROWS(ModelStructure::from_mapping_file(write(R"({"n_head": -1})"), space),
                    InvalidArgument, Contains(path) && Contains("n_head") && Contains("-1"));
  CURV_CHECK_THROWS(
      ModelStructure::from_mapping_file(write(R"({"roles": {"q_proj": "querry"}})"), space),
      InvalidArgument,
      Contains(path) && Contains("q_proj") && Contains("querry") && Contains("query"));
  CURV_CHECK_THROWS(ModelStructure::from_mapping_file(write(R"({"roles": {"(": "query"}})"), space),
                    InvalidArgument, Contains(path) && Contains("roles['(']"));
  CURV_CHECK_THROWS(
      ModelStructure::from_mapping_file(write(R"({"n_head": 4, "n_kv_head": 3})"), space),
      InvalidArgument, Contains(path) && Contains("n_kv_head = 3"));
  CURV_CHECK_THROWS(ModelStructure::from_mapping_file(dir.file("missing.json"), space), FormatError,
                    Contains("missing.json"));
}
