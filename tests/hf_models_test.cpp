// Hugging Face models read from their own folders (config.json beside the weights, no --model):
// LLaMA, Qwen2, Mistral and GPT-2 against an independent Python implementation of each HF forward
// pass on the same files (tests/python/hf_reference.py), float64: loss, logits, gradient and the
// Hessian-vector product along the checkpoint delta. Also the config reader's refusals and the
// component block rule.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "curv/analysis/within.h"
#include "curv/core/blocks.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/linear_operator.h"
#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/io/safetensors.h"
#include "curv/models/model_loader.h"
#include "curv/models/models.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

at::Tensor flat_of(const nlohmann::json& values) {
  return at::tensor(values.get<std::vector<double>>(), at::kDouble);
}

double relative_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.detach().to(at::kDouble).reshape({-1});
  return (g - want).norm().item<double>() / std::max(1e-300, want.norm().item<double>());
}

struct HfRun {
  TempDir dir;
  nlohmann::json reference;
  std::string run() const { return dir.path() + "/run"; }
};

std::unique_ptr<HfRun> make_hf_run(const std::string& arch) {
  auto out = std::make_unique<HfRun>();
  run_python("hf_reference.py", {out->dir.path(), arch});
  out->reference = read_json(out->dir.path() + "/reference.json");
  return out;
}

// The model a checkpoint folder describes, as ndsprobe builds it without --model.
LoadedModel model_of(const Checkpoint& ckpt) {
  ModelSource source;
  source.init.dtype = at::kDouble;
  return load_model(source, ckpt.model_config_json(), ckpt.model_config_file);
}

}  // namespace

TEST_CASE(
    "Hugging Face LLaMA and Qwen2 and Mistral and GPT-2 folders equal an independent HF forward",
    "[hf_models]") {
  const std::string arch = GENERATE("llama", "qwen2", "mistral", "gpt2", "llama-bf16");
  INFO(arch);
  auto hf = make_hf_run(arch);
  const auto& ref = hf->reference;
  REQUIRE(detect_checkpoint_layout(hf->run()) == CheckpointLayout::kHuggingFace);
  const auto infos = list_checkpoints(hf->run());
  REQUIRE(infos.size() == 2);
  const Checkpoint before = load_checkpoint(infos[0]);
  const Checkpoint after = load_checkpoint(infos[1]);
  CHECK_THAT(after.model_config_file, Contains("checkpoint-20/config.json"));

  LoadedModel model = model_of(after);
  CHECK(model.config.arch() == (arch == "gpt2" ? "gpt" : "llama"));
  Objective& objective = *model.objective;
  // HF's parameter order, which the optimizer state's indices follow.
  CHECK(objective.space().names() == ref["param_names"].get<std::vector<std::string>>());

  Batch batch{tokens_of(ref["inputs"]), tokens_of(ref["targets"])};
  CurvatureEngine engine(objective, ProbeSet({batch}));
  const ParamVector theta_before =
      parameters_from(before, objective.space(), objective.parameters());
  engine.set_parameters(theta_before);
  const double loss_before = engine.loss();
  CHECK(std::abs(loss_before - ref["loss_at_10"].get<double>()) <=
        1e-12 * std::abs(ref["loss_at_10"].get<double>()));
  const ParamVector theta = parameters_from(after, objective.space(), objective.parameters());
  engine.set_parameters(theta);
  CHECK(std::abs(engine.loss() - ref["loss"].get<double>()) <= 1e-12 * ref["loss"].get<double>());
  load_parameters(objective, theta);
  CHECK(relative_error(objective.logits(batch)[0], flat_of(ref["logits_first"])) <= 1e-12);

  ParamVector u;
  for (size_t i = 0; i < objective.space().size(); ++i) {
    const auto& name = objective.space()[i].name;
    u.push_back(flat_of(ref["direction"][name]).reshape(objective.space()[i].shape));
  }
  const ParamVector& g = engine.gradient();
  const ParamVector hu = engine.hvp(u);
  for (size_t i = 0; i < objective.space().size(); ++i) {
    const auto& name = objective.space()[i].name;
    INFO(name);
    CHECK(relative_error(g[i], flat_of(ref["grad"][name])) <= 1e-10);
    CHECK(relative_error(hu[i], flat_of(ref["hvp"][name])) <= 1e-10);
  }
  const double curvature = dot(u, hu);
  CHECK(std::abs(curvature - ref["curvature"].get<double>()) <=
        1e-10 * std::abs(ref["curvature"].get<double>()));
}

TEST_CASE("ndsprobe reads a Hugging Face LLaMA run without --model and splits it by component",
          "[hf_models][ndsprobe]") {
  // LLaMA: GQA and an untied head; Qwen2: q/k/v biases, a tied head and rope_theta 1e6.
  const std::string arch = GENERATE("llama", "qwen2");
  INFO(arch);
  auto hf = make_hf_run(arch);
  const auto& ref = hf->reference;
  const std::string probe = hf->dir.path() + "/probe.safetensors";
  write_safetensors(probe,
                    {{"inputs", tokens_of(ref["inputs"])}, {"targets", tokens_of(ref["targets"])}});
  const std::string out = hf->dir.path() + "/probe.h5";
  int status = 0;
  const std::string log =
      run_tool("ndsprobe",
               fmt::format("{} --data {} --dtype float64 --directions delta --blocks "
                           "component --quiet -o {}",
                           hf->run(), probe, out),
               &status);
  INFO(log);
  REQUIRE(status == 0);
  H5Reader reader(out);
  const Table taylor = reader.table("/taylor");
  REQUIRE(taylor.strings("block")[0] == "total");
  // The delta at checkpoint-10 is u = θ20 − θ10, the fixture's direction, audited at θ10.
  double u_sq = 0.0;
  for (const auto& [name, values] : ref["direction"].items()) {
    for (const auto& x : values) u_sq += x.get<double>() * x.get<double>();
  }
  auto close = [&](const char* column, double want) {
    INFO(column << ": got " << taylor.doubles(column)[0] << ", want " << want);
    CHECK(std::abs(taylor.doubles(column)[0] - want) <= 1e-10 * std::abs(want));
  };
  close("loss", ref["loss_at_10"].get<double>());
  close("first_order", ref["at_10"]["first_order"].get<double>());
  close("curvature", ref["at_10"]["curvature"].get<double>());
  close("nds", ref["at_10"]["curvature"].get<double>() / u_sq);
  close("realized", ref["loss"].get<double>() - ref["loss_at_10"].get<double>());
  const std::string blocks = reader.attribute_string("/", "block_names");
  CHECK_THAT(blocks, Contains("model.layers.0.attn.qk"));
  CHECK_THAT(blocks, Contains("model.layers.0.attn.vo"));
  CHECK_THAT(blocks, Contains("model.layers.1.mlp"));
  CHECK_THAT(blocks, Contains("model.layers.1.norm"));
}

TEST_CASE("Hugging Face configs: unsupported fields and model types name the file and field",
          "[hf_models]") {
  nlohmann::json llama = {{"architectures", {"LlamaForCausalLM"}},
                          {"model_type", "llama"},
                          {"vocab_size", 37},
                          {"hidden_size", 16},
                          {"intermediate_size", 24},
                          {"num_hidden_layers", 2},
                          {"num_attention_heads", 4},
                          {"num_key_value_heads", 2},
                          {"rms_norm_eps", 1e-6},
                          {"rope_theta", 10000.0},
                          {"rope_scaling", nullptr},
                          {"hidden_act", "silu"},
                          {"attention_dropout", 0.0},
                          {"torch_dtype", "float32"},
                          {"transformers_version", "4.44.0"},
                          {"max_position_embeddings", 64}};
  const ModelConfig plain = ModelConfig::from_json(llama.dump(), "ckpt/config.json");
  CHECK(plain.arch() == "llama");
  CHECK(plain.as<LlamaConfig>().kv_heads() == 2);
  CHECK(plain.as<LlamaConfig>().head_size() == 4);
  // The native form round-trips to the same model.
  CHECK(ModelConfig::from_json(plain.to_json()).to_json() == plain.to_json());

  auto refused = [&](nlohmann::json config, const std::string& field) {
    INFO(config.dump());
    try {
      ModelConfig::from_json(config.dump(), "ckpt/config.json");
      FAIL("accepted");
    } catch (const FormatError& e) {
      CHECK_THAT(e.what(), Contains("ckpt/config.json"));
      CHECK_THAT(e.what(), Contains(field));
    }
  };
  auto with = [&](const std::string& key, nlohmann::json value) {
    nlohmann::json c = llama;
    c[key] = std::move(value);
    return c;
  };
  refused(with("rope_scaling", {{"type", "yarn"}, {"factor", 2.0}}), "yarn");
  refused(with("rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}, {"beta_fast", 32}}),
          "beta_fast");
  refused(with("rope_parameters", {{"rope_type", "dynamic"}, {"rope_theta", 1e4}}), "dynamic");
  refused(with("layer_types", {"full_attention", "chunked_attention"}), "layer_types");
  refused(with("layer_types", {"full_attention"}), "layer_types");
  refused(with("layer_types", {"sliding_attention", "full_attention"}), "sliding_window");
  refused(with("hidden_act", "gelu"), "hidden_act");
  refused(with("num_local_experts", 8), "num_local_experts");
  refused(with("some_new_field", 1), "some_new_field");
  refused(with("model_type", "deepseek_v3"), "deepseek_v3");
  refused(with("num_attention_heads", "four"), "num_attention_heads");
  CHECK(
      ModelConfig::from_json(with("rope_scaling", {{"rope_type", "default"}}).dump(), "c").arch() ==
      "llama");
  // transformers 5's rope_parameters and 4.x's rope_scaling: the same Llama 3.1 scaling.
  const nlohmann::json llama3 = {{"rope_type", "llama3"},
                                 {"factor", 8.0},
                                 {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0},
                                 {"original_max_position_embeddings", 16}};
  nlohmann::json v5 = with("rope_parameters", llama3);
  v5["rope_parameters"]["rope_theta"] = 500000.0;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["dtype"] = "bfloat16";
  v5["layer_types"] = {"full_attention", "full_attention"};
  nlohmann::json v4 = with("rope_scaling", llama3);
  v4["rope_theta"] = 500000.0;
  for (const auto& config : {v5, v4}) {
    const auto c = ModelConfig::from_json(config.dump(), "c").as<LlamaConfig>();
    CHECK(c.rope_type == "llama3");
    CHECK(c.rope_theta == 500000.0);
    CHECK(c.rope_factor == 8.0);
    CHECK(c.rope_high_freq_factor == 4.0);
    CHECK(c.rope_original_context == 16);
  }
  // The scaled model round-trips through its native form, and scaling changes the forward pass.
  const ModelConfig scaled = ModelConfig::from_json(v5.dump(), "c");
  CHECK(ModelConfig::from_json(scaled.to_json()).to_json() == scaled.to_json());
  nlohmann::json unscaled = v5;
  unscaled["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  const at::Tensor tokens = at::arange(12, at::kLong).remainder(37).view({1, 12});
  CHECK(make_model(scaled, ModelInit{0, at::kDouble})->loss(Batch{tokens, tokens}).item<double>() !=
        make_model(ModelConfig::from_json(unscaled.dump(), "c"), ModelInit{0, at::kDouble})
            ->loss(Batch{tokens, tokens})
            .item<double>());
  // Qwen3: per-head q/k norms after the projections.
  nlohmann::json qwen3 = with("model_type", "qwen3");
  qwen3["head_dim"] = 8;
  const auto q3 = make_model(ModelConfig::from_json(qwen3.dump(), "q3"));
  CHECK(q3->space()[5].name == "model.layers.0.self_attn.q_norm.weight");
  CHECK(q3->space()[5].shape == std::vector<int64_t>{8});
  // A sliding window named by layer_types is read as the window (refusing longer sequences).
  nlohmann::json windowed_types = with("model_type", "qwen2");
  windowed_types["layer_types"] = {"full_attention", "sliding_attention"};
  windowed_types["sliding_window"] = 6;
  windowed_types["use_sliding_window"] = true;
  windowed_types["max_window_layers"] = 1;
  CHECK(ModelConfig::from_json(windowed_types.dump(), "q").as<LlamaConfig>().sliding_window == 6);
  // Qwen2's window only applies with use_sliding_window.
  nlohmann::json qwen = with("model_type", "qwen2");
  qwen["sliding_window"] = 4;
  qwen["use_sliding_window"] = false;
  CHECK(ModelConfig::from_json(qwen.dump(), "q").as<LlamaConfig>().sliding_window == 0);
  CHECK(ModelConfig::from_json(qwen.dump(), "q").as<LlamaConfig>().qkv_bias);
  nlohmann::json mistral = with("model_type", "mistral");
  mistral["sliding_window"] = 4;
  const ModelConfig windowed = ModelConfig::from_json(mistral.dump(), "m");
  auto model = make_model(windowed, ModelInit{0, at::kDouble});
  const at::Tensor five = at::zeros({1, 5}, at::kLong);
  CHECK_THROWS_WITH(model->loss(Batch{five, five}), Contains("sliding window 4"));
  CHECK_NOTHROW(model->loss(Batch{five.narrow(1, 0, 4), five.narrow(1, 0, 4)}));

  nlohmann::json gpt2 = {{"model_type", "gpt2"}, {"n_embd", 16},
                         {"n_layer", 2},         {"n_head", 4},
                         {"n_positions", 32},    {"vocab_size", 37},
                         {"resid_pdrop", 0.1},   {"layer_norm_epsilon", 1e-5}};
  const ModelConfig gpt = ModelConfig::from_json(gpt2.dump(), "g");
  CHECK(gpt.arch() == "gpt");
  CHECK(gpt.as<GptConfig>().conv1d);
  CHECK(gpt.as<GptConfig>().activation == "gelu_tanh");
  gpt2["scale_attn_by_inverse_layer_idx"] = true;
  refused(gpt2, "scale_attn_by_inverse_layer_idx");
}

TEST_CASE("component blocks split each layer into attn.qk and attn.vo and mlp and norm",
          "[hf_models]") {
  LlamaConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.qkv_bias = true;
  auto llama = make_model(ModelConfig("llama", c));
  const auto blocks = BlockPartition::by_rule(llama->space(), llama->structure(),
                                              BlockPartition::parse_rule("component"));
  CHECK(blocks.names() == std::vector<std::string>{"embeddings", "model.layers.0.attn.qk",
                                                   "model.layers.0.attn.vo", "model.layers.0.mlp",
                                                   "model.layers.0.norm", "model.layers.1.attn.qk",
                                                   "model.layers.1.attn.vo", "model.layers.1.mlp",
                                                   "model.layers.1.norm", "head"});
  std::vector<std::string> qk;
  for (size_t i : blocks[1].params) qk.push_back(llama->space()[i].name);
  CHECK(qk == std::vector<std::string>{"model.layers.0.self_attn.q_proj.weight",
                                       "model.layers.0.self_attn.q_proj.bias",
                                       "model.layers.0.self_attn.k_proj.weight",
                                       "model.layers.0.self_attn.k_proj.bias"});

  GptConfig g;
  g.n_layer = 1;
  auto gpt = make_model(ModelConfig("gpt", g));
  const auto fused = BlockPartition::by_rule(gpt->space(), gpt->structure(), BlockRule::kComponent);
  CHECK(fused.names() ==
        std::vector<std::string>{"embeddings", "transformer.h.0.norm", "transformer.h.0.attn.qkv",
                                 "transformer.h.0.attn.o", "transformer.h.0.mlp", "head"});
}

TEST_CASE("curvtrain trains the built-in llama with Muon and ndsprobe audits it by component",
          "[hf_models][curvtrain][ndsprobe]") {
  TempDir dir;
  const std::string config = dir.file("llama.json");
  std::ofstream(config) << R"({"arch": "llama", "vocab_size": 256, "hidden_size": 16,
    "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 16, "tie_word_embeddings": true})";
  int status = 0;
  std::string log = run_tool(
      "curvtrain",
      fmt::format("-o {} --model {} --optimizer muon --steps 4 --batch-size 4 --save-every 2 "
                  "--eval-every 2 --train-tokens 4000 --eval-sequences 4 --probe-sequences 8 "
                  "--threads 2",
                  dir.file("run"), config),
      &status);
  INFO(log);
  REQUIRE(status == 0);
  // Muon's default partition by roles: the projections and MLP matrices are hidden, the tied
  // embedding is not.
  const Checkpoint last = load_checkpoint(list_checkpoints(dir.file("run")).back());
  REQUIRE(last.meta.optimizer);
  const std::map<std::string, std::string> partition(last.meta.optimizer->partition.begin(),
                                                     last.meta.optimizer->partition.end());
  CHECK(partition.at("model.layers.0.self_attn.q_proj.weight") == "muon");
  CHECK(partition.at("model.layers.1.mlp.down_proj.weight") == "muon");
  CHECK(partition.at("model.embed_tokens.weight") == "adamw");
  CHECK(partition.at("model.norm.weight") == "adamw");
  log = run_tool(
      "ndsprobe",
      fmt::format("{} --data {} --directions update,delta --blocks component --within "
                  "--quiet -o {}",
                  dir.file("run"), dir.file("run/probe.safetensors"), dir.file("probe.h5")),
      &status);
  INFO(log);
  REQUIRE(status == 0);
  H5Reader reader(dir.file("probe.h5"));
  CHECK(reader.table("/taylor").num_rows() >= 2);
  CHECK_THAT(reader.attribute_string("/", "block_names"), Contains("model.layers.1.attn.vo"));
}

TEST_CASE("modded-nanogpt state_step files load as the built-in modded GPT and equal its forward",
          "[hf_models][modded]") {
  TempDir dir;
  run_python("modded_reference.py", {dir.path()});
  const auto ref = read_json(dir.path() + "/reference.json");
  const std::string run = dir.path() + "/run";
  REQUIRE(detect_checkpoint_layout(run) == CheckpointLayout::kTorchSteps);
  const auto infos = list_checkpoints(run);
  REQUIRE(infos.size() == 2);
  CHECK(infos[1].step == 20);
  const Checkpoint before = load_checkpoint(infos[0]);
  const Checkpoint after = load_checkpoint(infos[1]);
  LoadedModel model = model_of(after);
  REQUIRE(model.config.arch() == "modded");
  CHECK(model.config.as<ModdedConfig>().head_dim == 8);
  CHECK(model.config.as<ModdedConfig>().attention_scale == 0.12);
  Objective& objective = *model.objective;
  CHECK(objective.space().names() == ref["param_names"].get<std::vector<std::string>>());

  Batch batch{tokens_of(ref["inputs"]), tokens_of(ref["targets"])};
  CurvatureEngine engine(objective, ProbeSet({batch}));
  engine.set_parameters(parameters_from(before, objective.space(), objective.parameters()));
  CHECK(std::abs(engine.loss() - ref["loss_at_10"].get<double>()) <=
        1e-12 * ref["loss_at_10"].get<double>());
  engine.set_parameters(parameters_from(after, objective.space(), objective.parameters()));
  CHECK(std::abs(engine.loss() - ref["loss"].get<double>()) <= 1e-12 * ref["loss"].get<double>());
  ParamVector u;
  for (size_t i = 0; i < objective.space().size(); ++i) {
    u.push_back(
        flat_of(ref["direction"][objective.space()[i].name]).reshape(objective.space()[i].shape));
  }
  const ParamVector& g = engine.gradient();
  const ParamVector hu = engine.hvp(u);
  for (size_t i = 0; i < objective.space().size(); ++i) {
    const auto& name = objective.space()[i].name;
    INFO(name);
    CHECK(relative_error(g[i], flat_of(ref["grad"][name])) <= 1e-10);
    CHECK(relative_error(hu[i], flat_of(ref["hvp"][name])) <= 1e-10);
  }
  CHECK(std::abs(dot(u, hu) - ref["curvature"].get<double>()) <=
        1e-10 * std::abs(ref["curvature"].get<double>()));
  // Component blocks by roles: the separate q/k/v projections split as in LLaMA.
  const auto blocks =
      BlockPartition::by_rule(objective.space(), objective.structure(), BlockRule::kComponent);
  CHECK(blocks.names() ==
        std::vector<std::string>{"embeddings", "blocks.0.attn.qk", "blocks.0.attn.vo",
                                 "blocks.0.mlp", "blocks.0.norm", "blocks.1.attn.qk",
                                 "blocks.1.attn.vo", "blocks.1.mlp", "blocks.1.norm", "head"});
}

TEST_CASE("llama HVPs equal the dense Hessian with GQA and tied or untied heads and biases",
          "[hf_models]") {
  struct Case {
    const char* name;
    int64_t heads, kv_heads, head_dim;
    bool tied, attention_bias, qkv_bias, mlp_bias;
  };
  const Case c = GENERATE(Case{"gqa untied", 4, 2, 0, false, false, false, false},
                          Case{"tied qkv biases", 2, 1, 0, true, false, true, false},
                          Case{"all biases, head_dim 6", 2, 2, 6, false, true, false, true});
  INFO(c.name);
  LlamaConfig config;
  config.vocab_size = 7;
  config.hidden_size = 8;
  config.intermediate_size = 6;
  config.num_hidden_layers = 1;
  config.num_attention_heads = c.heads;
  config.num_key_value_heads = c.kv_heads;
  config.head_dim = c.head_dim;
  config.max_position_embeddings = 4;
  config.tie_word_embeddings = c.tied;
  config.attention_bias = c.attention_bias;
  config.qkv_bias = c.qkv_bias;
  config.mlp_bias = c.mlp_bias;
  auto model = make_model(ModelConfig("llama", config), ModelInit{3, at::kDouble});
  CurvatureEngine engine(*model, gpt_probe(5, 5, 3, config.vocab_size, 4));
  // Values well away from the initialisation's, so every term of the Hessian is exercised.
  ParamVector theta = random_direction(*model, 1);
  for (auto& t : theta) t.mul_(0.5);
  engine.set_parameters(theta);
  const int64_t n = engine.space().numel();
  const Eigen::MatrixXd h = dense_hessian(engine);
  CHECK((h - h.transpose()).norm() <= 1e-12 * h.norm());
  for (uint64_t seed : {11, 12}) {
    const ParamVector v = random_direction(*model, seed);
    const Eigen::VectorXd want = h * flat(v, n), got = flat(engine.hvp(v), n);
    CHECK((got - want).norm() <= 1e-10 * want.norm());
  }
}

TEST_CASE("within-block groups of Conv1D weights equal those of the same model stored as Linear",
          "[hf_models][within]") {
  // HF GPT-2 stores [in, out]: the same function as the Linear layout with every projection
  // transposed, so per-head groups, singular values and mode curvatures must agree.
  GptConfig linear_config;
  linear_config.vocab_size = 7;
  linear_config.block_size = 4;
  linear_config.n_layer = 1;
  linear_config.n_head = 2;
  linear_config.n_embd = 4;
  linear_config.tied = true;
  GptConfig conv_config = linear_config;
  conv_config.conv1d = true;
  auto linear = make_model(ModelConfig("gpt", linear_config), ModelInit{2, at::kDouble});
  auto conv = make_model(ModelConfig("gpt", conv_config), ModelInit{2, at::kDouble});
  REQUIRE(linear->space().names() == conv->space().names());
  auto transposed = [&](const ParamVector& x) {
    ParamVector out;
    for (size_t i = 0; i < x.size(); ++i) {
      const bool projection = x[i].dim() == 2 && !linear->structure().is_embedding(i);
      out.push_back(projection ? x[i].t().contiguous() : x[i].clone());
    }
    return out;
  };
  const ProbeSet probe = gpt_probe(7, 4, 2, linear_config.vocab_size, 4);
  CurvatureEngine linear_engine(*linear, probe), conv_engine(*conv, probe);
  ParamVector theta = random_direction(*linear, 5);
  for (auto& t : theta) t.mul_(0.5);
  linear_engine.set_parameters(theta);
  conv_engine.set_parameters(transposed(theta));
  const ParamVector u = random_direction(*linear, 6);
  WithinOptions options;
  options.n_head = 2;
  options.row_chunks = 2;
  options.modes = 2;
  const WithinReport a = within_block(linear_engine, u, options);
  const WithinReport b = within_block(conv_engine, transposed(u), options);
  REQUIRE(a.params.size() == b.params.size());
  for (size_t p = 0; p < a.params.size(); ++p) {
    INFO(a.params[p].name);
    REQUIRE(a.params[p].groups.size() == b.params[p].groups.size());
    CHECK(a.params[p].groups.size() >= 2);
    for (size_t g = 0; g < a.params[p].groups.size(); ++g) {
      CHECK(a.params[p].groups[g].name == b.params[p].groups[g].name);
      const double want = a.params[p].groups[g].curvature;
      CHECK(std::abs(b.params[p].groups[g].curvature - want) <= 1e-10 * std::abs(want) + 1e-14);
    }
    for (size_t m = 0; m < a.params[p].modes.size(); ++m) {
      const double want = a.params[p].modes[m].curvature;
      CHECK(std::abs(b.params[p].modes[m].curvature - want) <= 1e-10 * std::abs(want) + 1e-14);
    }
  }
}

TEST_CASE("a config.json far larger than its weights is refused before the model is allocated",
          "[hf_models][ndsprobe]") {
  auto hf = make_hf_run("gpt2");
  const auto& ref = hf->reference;
  const std::string probe = hf->dir.path() + "/probe.safetensors";
  write_safetensors(probe,
                    {{"inputs", tokens_of(ref["inputs"])}, {"targets", tokens_of(ref["targets"])}});
  for (const auto& [field, value, shown] :
       {std::tuple<const char*, int64_t, const char*>{"vocab_size", 2000000000, "vocab=2000000000"},
        {"n_layer", 100000000, "n_layer=100000000"}}) {
    INFO(field);
    std::map<std::string, std::string> original;
    for (const char* step : {"checkpoint-10", "checkpoint-20"}) {
      const std::string path = fmt::format("{}/{}/config.json", hf->run(), step);
      nlohmann::json config = read_json(path);
      original[path] = config.dump();
      config[field] = value;
      std::ofstream(path) << config.dump();
    }
    const auto start = std::chrono::steady_clock::now();
    int status = 0;
    const std::string log = run_tool("ndsprobe",
                                     fmt::format("{} --data {} --directions delta -o {}/big.h5",
                                                 hf->run(), probe, hf->dir.path()),
                                     &status);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO(log);
    CHECK(status != 0);
    CHECK_THAT(log, Contains("checkpoint-10/config.json"));
    CHECK_THAT(log, Contains(shown));
    CHECK_THAT(log, Contains("the config does not belong to these weights"));
    CHECK(log.find("internal error") == std::string::npos);
    CHECK(seconds < 5.0);  // the tool's start included; the check itself allocates nothing
    for (const auto& [path, text] : original) std::ofstream(path) << text;
  }
}

TEST_CASE("a published model's parameter count from its config.json, with nothing allocated",
          "[hf_models][models]") {
  // The counts transformers' own models give for these configs (built on the meta device), which
  // are the published sizes: GPT-2 small, Llama 2 7B, Llama 3.2 1B, Pythia-70M, Mixtral 8x7B,
  // OLMoE-1B-7B, OLMo 2 1B, Gemma 2 2B, Phi-3 mini and Qwen3-30B-A3B.
  const std::pair<const char*, double> published[] = {
      {R"({"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768,
           "n_layer": 12, "n_head": 12})",
       124439808.0},
      {R"({"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
           "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 32, "max_position_embeddings": 4096,
           "tie_word_embeddings": false})",
       6738415616.0},
      {R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
           "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
           "rope_theta": 500000.0, "tie_word_embeddings": true})",
       1235814400.0},
      {R"({"model_type": "gpt_neox", "vocab_size": 50304, "hidden_size": 512,
           "intermediate_size": 2048, "num_hidden_layers": 6, "num_attention_heads": 8,
           "rotary_pct": 0.25, "max_position_embeddings": 2048, "use_parallel_residual": true,
           "tie_word_embeddings": false})",
       70426624.0},
      {R"({"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
           "max_position_embeddings": 32768, "rope_theta": 1000000.0})",
       46702792704.0},
      {R"({"model_type": "olmoe", "vocab_size": 50304, "hidden_size": 2048,
           "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16,
           "num_key_value_heads": 16, "num_experts": 64, "num_experts_per_tok": 8,
           "max_position_embeddings": 4096})",
       6919161856.0},
      {R"({"model_type": "olmo2", "vocab_size": 100352, "hidden_size": 2048,
           "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 16,
           "num_key_value_heads": 16, "max_position_embeddings": 4096, "rope_theta": 500000.0,
           "tie_word_embeddings": false})",
       1484916736.0},
      {R"({"model_type": "gemma2", "vocab_size": 256000, "hidden_size": 2304,
           "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
           "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 8192,
           "tie_word_embeddings": true})",
       2614341888.0},
      {R"({"model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072,
           "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 32, "max_position_embeddings": 4096,
           "original_max_position_embeddings": 4096, "tie_word_embeddings": false})",
       3821079552.0},
      {R"({"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
           "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
           "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
           "num_experts": 128, "num_experts_per_tok": 8, "max_position_embeddings": 40960,
           "tie_word_embeddings": false})",
       30532122624.0},
  };
  for (const auto& [json, count] : published) {
    const ModelConfig config = ModelConfig::from_json(json, "config.json");
    INFO(config.describe());
    CHECK(config.parameter_count() == count);
  }
  INFO("counting stops once it passes a limit: a config of 10^8 layers is not built through");
  const ModelConfig deep = ModelConfig::from_json(
      R"({"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
          "intermediate_size": 11008, "num_hidden_layers": 100000000, "num_attention_heads": 32})",
      "config.json");
  const double past = deep.parameter_count(1e9);
  CHECK(past > 1e9);
  CHECK(past < 2e9);
  INFO("every built-in language model counts as it builds");
  for (const char* arch : {"gpt", "llama", "modded", "gpt_neox", "olmo2", "phi3", "gemma2",
                           "gemma3", "mixtral", "olmoe", "qwen3_moe"}) {
    INFO(arch);
    const ModelConfig config = ModelConfig::defaults(arch);
    auto model = make_model(config, ModelInit{0, at::kFloat});
    CHECK(config.parameter_count() == static_cast<double>(model->space().numel()));
  }
}

TEST_CASE("Gemma 2 and Gemma 3 configs as transformers 4.x and 5.x write them",
          "[hf_models][models]") {
  // google/gemma-3-1b-pt's config.json as transformers 4.50 wrote it (sizes shrunk): the rotary
  // bases and scaling by their 4.x names, the sliding pattern as a number.
  const nlohmann::json v4 = {{"architectures", {"Gemma3ForCausalLM"}},
                             {"model_type", "gemma3_text"},
                             {"attention_bias", false},
                             {"attention_dropout", 0.0},
                             {"attn_logit_softcapping", nullptr},
                             {"cache_implementation", "hybrid"},
                             {"final_logit_softcapping", nullptr},
                             {"head_dim", 8},
                             {"hidden_activation", "gelu_pytorch_tanh"},
                             {"hidden_size", 16},
                             {"intermediate_size", 24},
                             {"max_position_embeddings", 64},
                             {"num_attention_heads", 4},
                             {"num_hidden_layers", 7},
                             {"num_key_value_heads", 1},
                             {"pad_token_id", 0},
                             {"query_pre_attn_scalar", 8},
                             {"rms_norm_eps", 1e-6},
                             {"rope_local_base_freq", 10000},
                             {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}},
                             {"rope_theta", 1000000},
                             {"sliding_window", 4},
                             {"sliding_window_pattern", 6},
                             {"torch_dtype", "bfloat16"},
                             {"transformers_version", "4.50.0.dev0"},
                             {"vocab_size", 37}};
  // The same model as transformers 5 writes it.
  nlohmann::json v5 = v4;
  for (const char* key : {"rope_local_base_freq", "rope_scaling", "rope_theta",
                          "sliding_window_pattern", "cache_implementation", "torch_dtype"}) {
    v5.erase(key);
  }
  v5["_sliding_window_pattern"] = 6;
  v5["dtype"] = "bfloat16";
  v5["use_bidirectional_attention"] = false;
  v5["layer_types"] = nlohmann::json::array();
  for (int l = 0; l < 7; ++l) {
    v5["layer_types"].push_back(l == 5 ? "full_attention" : "sliding_attention");
  }
  v5["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  const ModelConfig a = ModelConfig::from_json(v4.dump(), "v4/config.json");
  const ModelConfig b = ModelConfig::from_json(v5.dump(), "v5/config.json");
  CHECK(a.arch() == "gemma3");
  CHECK(a.to_json() == b.to_json());
  CHECK_THAT(a.describe(), Contains("layers=7 (6 sliding, window 4)"));
  const auto native = nlohmann::json::parse(a.to_json());
  CHECK(native["rope_factor"] == 8.0);
  CHECK(native["rope_theta"] == 1e6);
  CHECK(native["rope_local_theta"] == 1e4);
  CHECK(native["qk_norm"] == true);
  CHECK(ModelConfig::from_json(a.to_json()).to_json() == a.to_json());
  // A native config takes its generation's defaults for the keys it leaves out.
  CHECK(nlohmann::json::parse(
            ModelConfig::from_json(R"({"arch": "gemma3"})").to_json())["qk_norm"] == true);
  CHECK(nlohmann::json::parse(
            ModelConfig::from_json(R"({"arch": "gemma2"})").to_json())["final_logit_softcapping"] ==
        30.0);

  // Gemma 2 (4.42's keys): alternating layers, the first sliding; soft-capping by default.
  nlohmann::json gemma2 = v4;
  gemma2["model_type"] = "gemma2";
  for (const char* key : {"rope_local_base_freq", "rope_scaling", "sliding_window_pattern",
                          "attn_logit_softcapping", "final_logit_softcapping"}) {
    gemma2.erase(key);
  }
  gemma2["hidden_act"] = "gelu_pytorch_tanh";
  const ModelConfig g2 = ModelConfig::from_json(gemma2.dump(), "g2/config.json");
  CHECK(g2.arch() == "gemma2");
  CHECK_THAT(g2.describe(), Contains("layers=7 (4 sliding, window 4)") &&
                                Contains("attention softcap 50") && Contains("logit softcap 30"));

  // The window is applied, not refused: sequences longer than it give another loss than the same
  // model with a window covering them.
  nlohmann::json wide = gemma2;
  wide["sliding_window"] = 64;
  const at::Tensor tokens = at::arange(10, at::kLong).remainder(37).view({1, 10});
  auto loss = [&](const nlohmann::json& config) {
    return make_model(ModelConfig::from_json(config.dump(), "c"), ModelInit{3, at::kDouble})
        ->loss(Batch{tokens, tokens})
        .item<double>();
  };
  CHECK(std::isfinite(loss(gemma2)));
  CHECK(loss(gemma2) != loss(wide));

  auto refused = [&](const nlohmann::json& base, const std::string& key, nlohmann::json value,
                     const std::string& named) {
    nlohmann::json c = base;
    c[key] = std::move(value);
    INFO(c.dump());
    CURV_CHECK_THROWS(ModelConfig::from_json(c.dump(), "ckpt/config.json"), FormatError,
                      Contains("ckpt/config.json") && Contains(named));
  };
  refused(v4, "use_bidirectional_attention", true, "use_bidirectional_attention");
  refused(v4, "hidden_activation", "relu", "hidden_activation");
  refused(v4, "rope_scaling", {{"rope_type", "yarn"}, {"factor", 8.0}}, "yarn");
  refused(v5, "rope_parameters",
          {{"sliding_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}}, "linear");
  refused(v5, "rope_parameters", {{"chunked_attention", {{"rope_type", "default"}}}},
          "chunked_attention");
  refused(v5, "layer_types", {"sliding_attention", "chunked_attention"}, "layer_types");
  refused(v4, "sliding_window_pattern", 0, "sliding_window_pattern");

  // The parameter count by arithmetic equals the model's, tied and untied, with biases.
  for (const bool variant : {false, true}) {
    for (const ModelConfig& base : {a, g2}) {
      nlohmann::json c = nlohmann::json::parse(base.to_json());
      c["tie_word_embeddings"] = !variant;
      c["attention_bias"] = variant;
      const ModelConfig config = ModelConfig::from_json(c.dump());
      INFO(config.describe());
      auto model = make_model(config, ModelInit{0, at::kFloat});
      int64_t n = 0;
      for (const auto& p : model->parameters()) n += p.numel();
      CHECK(config.parameter_count() == static_cast<double>(n));
    }
  }
}

TEST_CASE("mixture-of-experts names give the router role and each expert's index, as built in",
          "[hf_models][models]") {
  for (const char* arch : {"mixtral", "olmoe", "qwen3_moe"}) {
    INFO(arch);
    const ModelConfig config = ModelConfig::from_json(fmt::format(
        R"({{"arch": "{}", "vocab_size": 11, "hidden_size": 8, "intermediate_size": 12,
            "expert_intermediate_size": 6, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_experts": 3, "num_experts_per_tok": 2, "dense_layers": [1]}})",
        arch));
    auto model = make_model(config, ModelInit{0, at::kDouble});
    CHECK(config.parameter_count() == static_cast<double>(model->space().numel()));
    // The built-in structure is the one the name rules give any model with these names.
    const ModelStructure built_in = model->structure();
    const ModelStructure named = ModelStructure::from_names(model->space());
    int64_t routers = 0, expert_params = 0;
    for (size_t i = 0; i < model->space().size(); ++i) {
      INFO(model->space()[i].name);
      CHECK(role_name(named[i].role) == std::string(role_name(built_in[i].role)));
      CHECK(named[i].layer == built_in[i].layer);
      CHECK(named[i].expert == built_in[i].expert);
      routers += built_in[i].role == ParamRole::kRouter;
      expert_params += built_in[i].expert >= 0;
    }
    CHECK(routers == 1);
    CHECK(expert_params == 9);
    const BlockPartition partition =
        BlockPartition::by_rule(model->space(), built_in, BlockRule::kComponent);
    std::vector<std::string> blocks;
    for (const auto& b : partition.blocks()) blocks.push_back(b.name);
    CHECK_THAT(fmt::format("{}", fmt::join(blocks, " ")),
               Contains("model.layers.0.router model.layers.0.mlp.expert0 "
                        "model.layers.0.mlp.expert1 model.layers.0.mlp.expert2") &&
                   Contains("model.layers.1.mlp ") && Contains("model.layers.1.norm"));
    // Routing: each token's top 2 of 3 experts in ascending order, for the one routed layer.
    const at::Tensor tokens = at::arange(10, at::kLong).remainder(11).view({2, 5});
    const at::Tensor choices = model->expert_choices(Batch{tokens, tokens});
    REQUIRE(choices.sizes() == at::IntArrayRef({10, 2}));
    CHECK((choices.select(1, 0) < choices.select(1, 1)).all().item<bool>());
    CHECK(!make_model(tiny_gpt_config())->expert_choices(Batch{tokens, tokens}).defined());
  }
}
