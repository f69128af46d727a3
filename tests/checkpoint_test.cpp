#include "curv/io/checkpoint.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "curv/core/error.h"
#include "curv/io/safetensors.h"
#include "curv/models/models.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using Catch::Matchers::Contains;
using curv_test::TempDir;

namespace {

namespace fs = std::filesystem;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

// A step folder holding `tensors` as model.safetensors (and nothing else).
std::string write_step(const std::string& dir, const std::string& folder,
                       const NamedTensors& tensors = {{"w", at::zeros({2})}}) {
  const std::string path = dir + "/" + folder;
  fs::create_directories(path);
  write_safetensors(path + "/model.safetensors", tensors);
  return path;
}

std::vector<int64_t> steps_of(const std::vector<CheckpointInfo>& infos) {
  std::vector<int64_t> out;
  for (const auto& info : infos) out.push_back(info.step);
  return out;
}

std::vector<CheckpointInfo> fake_infos(const std::vector<int64_t>& steps) {
  std::vector<CheckpointInfo> out;
  for (auto s : steps) out.push_back({s, "step_" + std::to_string(s)});
  return out;
}

// The tensors of `model`'s parameters, by name, as a checkpoint would hold them.
NamedTensors named(Objective& model) {
  NamedTensors out;
  auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    out.emplace_back(model.space()[i].name, params[i].detach().clone());
  }
  return out;
}

Checkpoint in_memory(NamedTensors tensors) {
  Checkpoint ckpt;
  ckpt.step = 3;
  ckpt.path = "/runs/a/step_3";
  ckpt.model = std::move(tensors);
  return ckpt;
}

}  // namespace

TEST_CASE("save_checkpoint, list, load and parameters_from round-trip a model", "[checkpoint]") {
  TempDir dir;
  auto model = make_model(curv_test::tiny_gpt_config(), ModelInit{7, at::kFloat});
  const auto& space = model->space();
  const auto params = model->parameters();
  NamedTensors optimizer;
  for (size_t i = 0; i < space.size(); ++i) {
    optimizer.emplace_back(space[i].name + ".exp_avg", at::full_like(params[i], 0.5).detach());
    optimizer.emplace_back(space[i].name + ".exp_avg_sq", at::full_like(params[i], 2.0).detach());
  }
  const std::string meta = R"({"optimizer": {"name": "adamw", "hyper": {"lr": 0.001,
      "betas": [0.9, 0.95]}, "step_count": 40}, "model": )" +
                           curv_test::tiny_gpt_config().to_json() + R"(, "note": "kept"})";
  save_checkpoint(dir.path(), 40, space, params, optimizer, meta);
  save_checkpoint(dir.path(), 0, space, params, {}, "");

  const auto infos = list_checkpoints(dir.path());
  REQUIRE(steps_of(infos) == std::vector<int64_t>{0, 40});
  CHECK(infos[1].path == dir.path() + "/step_40");
  CHECK_FALSE(fs::exists(dir.path() + "/step_40/model.safetensors.tmp"));

  const auto ckpt = load_checkpoint(infos[1]);
  CHECK(ckpt.step == 40);
  CHECK(ckpt.model.size() == space.size());
  CHECK(ckpt.optimizer.size() == 2 * space.size());
  CHECK(ckpt.optimizer_name() == "adamw");
  CHECK(ckpt.step_count() == std::optional<int64_t>(40));
  CHECK(ckpt.hyper("lr", 1.0) == 0.001);
  CHECK(ckpt.hyper("weight_decay", 0.1) == 0.1);
  CURV_CHECK_THROWS(ckpt.hyper("betas", 0.0), FormatError,
                    Contains("meta.json") && Contains("betas"));
  CHECK(ModelConfig::from_json(ckpt.model_config_json()).to_json() ==
        curv_test::tiny_gpt_config().to_json());
  CHECK_THAT(ckpt.meta_json(), Contains("\"note\": \"kept\"") && Contains("\"step\": 40"));

  // Converted to the dtype of `like`, in the space's order, values exact.
  auto like = model->parameters();
  for (auto& t : like) t = t.detach().to(at::kDouble);
  const auto loaded = parameters_from(ckpt, space, like);
  REQUIRE(loaded.size() == space.size());
  for (size_t i = 0; i < space.size(); ++i) {
    CHECK(loaded[i].scalar_type() == at::kDouble);
    CHECK(at::equal(loaded[i].to(at::kFloat), params[i].detach()));
  }
  CHECK(parameters_from(ckpt, space, {})[0].scalar_type() == at::kFloat);

  // Opened rather than loaded, the state stays in optimizer.safetensors, read by name.
  const auto opened = open_checkpoint(infos[1]);
  CHECK(opened.optimizer.empty());
  REQUIRE(opened.optimizer_source);
  REQUIRE(opened.optimizer_source->entries().size() == ckpt.optimizer.size());
  for (const auto& [name, t] : ckpt.optimizer) {
    CHECK(at::equal(opened.optimizer_source->read(name), t));
  }
  CHECK(saved_optimizer(opened).state == opened.optimizer_source);

  // Model only: the same parameters and metadata, no optimizer state.
  const auto model_only = load_checkpoint(infos[1], CheckpointParts::kModelOnly);
  CHECK(model_only.optimizer.empty());
  CHECK_FALSE(open_checkpoint(infos[1], CheckpointParts::kModelOnly).optimizer_source);
  CHECK(model_only.step_count() == std::optional<int64_t>(40));
  const auto loaded_only = parameters_from(model_only, space, like);
  for (size_t i = 0; i < space.size(); ++i) CHECK(at::equal(loaded_only[i], loaded[i]));

  // Without optimizer.safetensors and meta.json content: empty state, defaults.
  const auto bare = load_checkpoint(infos[0]);
  CHECK(bare.optimizer.empty());
  CHECK(bare.optimizer_name().empty());
  CHECK_FALSE(bare.step_count().has_value());
  CHECK(bare.model_config_json().empty());
  fs::remove(infos[0].path + "/meta.json");
  CHECK(load_checkpoint(infos[0]).meta_json() == "{}");

  // Re-saving a step without optimizer state removes the stale optimizer file.
  save_checkpoint(dir.path(), 40, space, params, {}, "");
  CHECK_FALSE(fs::exists(dir.path() + "/step_40/optimizer.safetensors"));
  CHECK(load_checkpoint(infos[1]).optimizer.empty());
}

TEST_CASE("optimizer_state finds, misses and shape-checks state tensors", "[checkpoint]") {
  auto model = make_model(curv_test::tiny_gpt_config(), ModelInit{0, at::kFloat});
  const auto& space = model->space();
  const auto& c_attn = space[space.index("transformer.h.0.attn.c_attn.weight")];
  const auto& wte = space[space.index("transformer.wte.weight")];
  auto ckpt = in_memory(named(*model));
  ckpt.optimizer = {{c_attn.name + ".exp_avg_sq", at::ones(c_attn.shape)},
                    {c_attn.name + ".exp_avg", at::zeros(c_attn.shape)},
                    {wte.name + ".exp_avg_sq", at::ones({3})}};

  auto state = optimizer_state(ckpt, c_attn.name, "exp_avg_sq");
  REQUIRE(state.defined());
  CHECK(state.sizes().vec() == c_attn.shape);
  CHECK_FALSE(optimizer_state(ckpt, c_attn.name, "momentum_buffer").defined());
  CHECK_FALSE(optimizer_state(ckpt, "nope", "exp_avg").defined());

  CHECK(optimizer_state(ckpt, c_attn, "exp_avg", true).defined());
  CHECK_FALSE(optimizer_state(ckpt, c_attn, "momentum_buffer").defined());
  CURV_CHECK_THROWS(optimizer_state(ckpt, c_attn, "momentum_buffer", true), InvalidArgument,
                    Contains("/runs/a/step_3/optimizer.safetensors") &&
                        Contains("momentum_buffer") && Contains(c_attn.name) &&
                        Contains("exp_avg_sq, exp_avg"));
  CURV_CHECK_THROWS(optimizer_state(ckpt, wte, "exp_avg_sq"), InvalidArgument,
                    Contains("optimizer.safetensors") && Contains(wte.name) &&
                        Contains("exp_avg_sq") && Contains("[3]") && Contains("[5, 4]"));
  ckpt.optimizer.clear();
  CURV_CHECK_THROWS(optimizer_state(ckpt, wte, "exp_avg", true), InvalidArgument,
                    Contains("optimizer.safetensors") && Contains("absent"));
}

TEST_CASE("list_checkpoints sorts numerically and ignores unrelated entries", "[checkpoint]") {
  TempDir dir;
  for (auto folder : {"step_10", "step_2", "step_100", "step_0"}) write_step(dir.path(), folder);
  fs::create_directories(dir.path() + "/step_5");  // incomplete: no model.safetensors
  write_step(dir.path(), "step_x");                // not a number
  write_step(dir.path(), "step_-3");               // negative
  write_step(dir.path(), "step_3.5");
  write_step(dir.path(), "checkpoint-7");  // other layout
  write_file(dir.path() + "/step_8", "a file, not a folder");
  write_file(dir.path() + "/notes.txt", "hello");
  const auto infos = list_checkpoints(dir.path());
  CHECK(steps_of(infos) == std::vector<int64_t>{0, 2, 10, 100});
  CHECK(infos[2].path == dir.path() + "/step_10");

  CHECK(steps_of(list_checkpoints(dir.path(), StepSelection::parse("2:10", 1))) ==
        std::vector<int64_t>{2, 10});
  CHECK(steps_of(list_checkpoints(dir.path(), StepSelection::parse("", 2))) ==
        std::vector<int64_t>{0, 10});
  CURV_CHECK_THROWS(list_checkpoints(dir.path(), StepSelection::parse("11:99", 1)), InvalidArgument,
                    Contains("11:99") && Contains(dir.path()) && Contains("0 to 100"));

  write_step(dir.path(), "step_02");
  CURV_CHECK_THROWS(list_checkpoints(dir.path()), FormatError,
                    Contains("step_2") && Contains("step_02"));
}

TEST_CASE("list_checkpoints names the directory when there is nothing to list", "[checkpoint]") {
  TempDir dir;
  CURV_CHECK_THROWS(
      list_checkpoints(dir.path()), FormatError,
      Contains("no checkpoints in " + dir.path()) && Contains("step_<N>/model.safetensors"));
  fs::create_directories(dir.path() + "/step_1");
  CURV_CHECK_THROWS(list_checkpoints(dir.path()), FormatError, Contains(dir.path()));
  const std::string missing = dir.path() + "/no_such_run";
  CURV_CHECK_THROWS(list_checkpoints(missing), FormatError,
                    Contains(missing) && Contains("does not exist"));
  write_file(dir.file("plain"), "x");
  CURV_CHECK_THROWS(list_checkpoints(dir.file("plain")), FormatError,
                    Contains(dir.file("plain")) && Contains("not a directory"));
  const auto single = write_step(dir.path(), "step_9");
  CURV_CHECK_THROWS(list_checkpoints(single), FormatError, Contains("pass its parent"));
}

TEST_CASE("StepSelection keeps a range, then every stride-th by position", "[checkpoint]") {
  const auto infos = fake_infos({0, 50, 100, 150, 200, 400, 800, 1600, 3200});
  auto selected = [&](const std::string& range, int64_t stride) {
    return steps_of(StepSelection::parse(range, stride).select(infos));
  };
  CHECK(selected("", 1) == steps_of(infos));
  CHECK(selected("100:800", 1) == std::vector<int64_t>{100, 150, 200, 400, 800});
  CHECK(selected("120:800", 2) == std::vector<int64_t>{150, 400});
  CHECK(selected("100:", 3) == std::vector<int64_t>{100, 400, 3200});
  CHECK(selected(":150", 1) == std::vector<int64_t>{0, 50, 100, 150});
  CHECK(selected("", 4) == std::vector<int64_t>{0, 200, 3200});
  CHECK(selected("400", 1) == std::vector<int64_t>{400});
  CHECK(selected("401:799", 1).empty());
  CHECK(StepSelection{}.select(infos).size() == infos.size());

  const auto s = StepSelection::parse("100:2000", 2);
  CHECK(s.first == 100);
  CHECK(s.last == 2000);
  CHECK(s.stride == 2);
  CHECK(s.describe() == "100:2000, stride 2");
  CHECK(StepSelection::parse(":5", 1).describe() == ":5");

  for (const std::string bad : {"abc", "1:2:3", "-5:", "10:5", "1.5:", "1e3", " 1:2", "1:x"}) {
    INFO(bad);
    CURV_CHECK_THROWS(StepSelection::parse(bad, 1), InvalidArgument, Contains("'" + bad + "'"));
  }
  CURV_CHECK_THROWS(StepSelection::parse("", 0), InvalidArgument, Contains("stride 0"));
}

TEST_CASE("parameters_from names missing, extra and mis-shaped parameters", "[checkpoint]") {
  auto model = make_model(curv_test::tiny_gpt_config(), ModelInit{0, at::kFloat});
  const auto& space = model->space();
  const auto like = model->parameters();
  const std::string file = "/runs/a/step_3/model.safetensors";

  SECTION("missing parameter, with the closest names in the file") {
    auto tensors = named(*model);
    for (auto& [name, t] : tensors) {
      if (name == "transformer.h.0.ln_1.weight") name = "transformer.h.0.ln_1.gain";
    }
    CURV_CHECK_THROWS(parameters_from(in_memory(tensors), space, like), InvalidArgument,
                      Contains(file) && Contains("'transformer.h.0.ln_1.weight' is missing") &&
                          Contains("did you mean") && Contains("'transformer.h.0.ln_1.gain'"));
    CHECK_THROWS_WITH(parameters_from(in_memory(tensors), space, like),
                      !Contains("parameters are missing"));
    tensors.pop_back();
    tensors.erase(tensors.begin());
    CURV_CHECK_THROWS(parameters_from(in_memory(tensors), space, like), InvalidArgument,
                      Contains("3 of the model's 17 parameters are missing") &&
                          Contains("'lm_head.weight'") && Contains("'transformer.wte.weight'"));
  }
  SECTION("extra tensors are listed, or ignored with allow_extra") {
    auto tensors = named(*model);
    tensors.emplace_back("transformer.h.0.attn.bias", at::ones({1, 1, 4, 4}));
    for (int i = 0; i < 6; ++i) tensors.emplace_back("aux." + std::to_string(i), at::ones({1}));
    CURV_CHECK_THROWS(parameters_from(in_memory(tensors), space, like), InvalidArgument,
                      Contains(file) && Contains("7 tensors are not a parameter") &&
                          Contains("'transformer.h.0.attn.bias' (did you mean "
                                   "'transformer.h.0.ln_1.bias'") &&
                          Contains("'aux.3'") && Contains("(7 in all)"));
    const auto loaded = parameters_from(in_memory(tensors), space, like, true);
    CHECK(loaded.size() == space.size());
  }
  SECTION("a tied head stored twice is accepted; an untied one is not") {
    auto config = curv_test::tiny_gpt_config();
    config.as<GptConfig>().tied = true;
    auto tied = make_model(config, ModelInit{0, at::kFloat});
    REQUIRE_FALSE(tied->space().find("lm_head.weight"));
    auto tensors = named(*tied);
    const auto wte = tensors[0].second;
    REQUIRE(tensors[0].first == "transformer.wte.weight");
    tensors.emplace_back("lm_head.weight", wte.clone());
    const auto loaded = parameters_from(in_memory(tensors), tied->space(), tied->parameters());
    CHECK(at::equal(loaded[0], wte));
    tensors.back().second = wte + 1;
    CURV_CHECK_THROWS(parameters_from(in_memory(tensors), tied->space(), tied->parameters()),
                      InvalidArgument, Contains(file) && Contains("untied head"));
    CHECK(parameters_from(in_memory(tensors), tied->space(), tied->parameters(), true).size() ==
          tied->space().size());
    // The untied model has its own lm_head.weight: it is a plain parameter, never an alias.
    CHECK(space.find("lm_head.weight"));
  }
  SECTION("shape mismatch names both shapes") {
    auto tensors = named(*model);
    for (auto& [name, t] : tensors) {
      if (name == "transformer.wpe.weight") t = at::zeros({8, 4});
    }
    CURV_CHECK_THROWS(parameters_from(in_memory(tensors), space, like), InvalidArgument,
                      Contains(file) && Contains("transformer.wpe.weight") && Contains("[8, 4]") &&
                          Contains("[4, 4]"));
  }
  SECTION("non-floating tensors and a misaligned `like` are rejected") {
    auto tensors = named(*model);
    tensors[1].second = at::zeros(tensors[1].second.sizes(), at::kLong);
    CURV_CHECK_THROWS(parameters_from(in_memory(tensors), space, like), InvalidArgument,
                      Contains(tensors[1].first) && Contains("Long"));
    CURV_CHECK_THROWS(parameters_from(in_memory(named(*model)), space, {like[0]}), InvalidArgument,
                      Contains(file));
  }
}

TEST_CASE("bad meta.json is a FormatError naming the file", "[checkpoint]") {
  TempDir dir;
  const auto folder = write_step(dir.path(), "step_5");
  const CheckpointInfo info{5, folder};
  const std::string meta = folder + "/meta.json";
  write_file(meta, "{\"step\": 5, ");
  CURV_CHECK_THROWS(load_checkpoint(info), FormatError, Contains(meta) && Contains("JSON"));
  write_file(meta, "[1, 2]");
  CURV_CHECK_THROWS(load_checkpoint(info), FormatError, Contains(meta) && Contains("object"));
  write_file(meta, R"({"optimizer": {"name": 3}})");
  CURV_CHECK_THROWS(load_checkpoint(info), FormatError,
                    Contains(meta) && Contains("optimizer.name"));
  write_file(meta, R"({"optimizer": {"step_count": "many"}})");
  CURV_CHECK_THROWS(load_checkpoint(info), FormatError,
                    Contains(meta) && Contains("optimizer.step_count") && Contains("many"));
  write_file(meta, R"({"model": "gpt"})");
  CURV_CHECK_THROWS(load_checkpoint(info), FormatError, Contains(meta) && Contains("\"model\""));
  write_file(meta, R"({"step": 6})");
  CURV_CHECK_THROWS(load_checkpoint(info), FormatError,
                    Contains(meta) && Contains("6") && Contains("step 5"));
  write_file(meta, R"({"step": 5, "extra": {"anything": [1, 2]}})");
  CHECK_THAT(load_checkpoint(info).meta_json(), Contains("anything"));
  write_file(folder + "/optimizer.safetensors", "garbage");
  CURV_CHECK_THROWS(load_checkpoint(info), FormatError, Contains("optimizer.safetensors"));
}

TEST_CASE("save_checkpoint rejects bad input before writing", "[checkpoint]") {
  TempDir dir;
  auto model = make_model(curv_test::tiny_mlp_config(), ModelInit{0, at::kDouble});
  const auto& space = model->space();
  auto params = model->parameters();
  CURV_CHECK_THROWS(save_checkpoint(dir.path(), -1, space, params, {}), InvalidArgument,
                    Contains("-1"));
  CURV_CHECK_THROWS(save_checkpoint(dir.path(), 1, space, {params[0]}, {}), InvalidArgument,
                    Contains("step_1"));
  auto wrong = params;
  wrong[0] = at::zeros({2, 2}, at::kDouble);
  CURV_CHECK_THROWS(save_checkpoint(dir.path(), 1, space, wrong, {}), InvalidArgument,
                    Contains(space[0].name) && Contains("[2, 2]"));
  CURV_CHECK_THROWS(save_checkpoint(dir.path(), 1, space, params, {}, "{oops"), InvalidArgument,
                    Contains("meta_json"));
  CURV_CHECK_THROWS(save_checkpoint(dir.path(), 1, space, params, {}, R"({"step": 2})"),
                    InvalidArgument, Contains("\"step\": 2"));
  CHECK_FALSE(fs::exists(dir.path() + "/step_1"));
  save_checkpoint(dir.path() + "/nested/run", 1, space, params, {}, R"({"step": 1})");
  const auto ckpt = load_checkpoint(list_checkpoints(dir.path() + "/nested/run").at(0));
  const auto loaded = parameters_from(ckpt, space, params);
  for (size_t i = 0; i < space.size(); ++i) CHECK(at::equal(loaded[i], params[i].detach()));
}

TEST_CASE("typed meta.json: every fixed key parsed once, wrong types named", "[checkpoint]") {
  const std::string text = R"({"step": 7, "note": "kept",
      "model": {"arch": "mlp", "sizes": [2, 3]},
      "optimizer": {"name": "muon", "step_count": 6, "muon_params": "^h\\.",
                    "hyper": {"lr": 0.02, "ns_steps": 5, "betas": [0.9, 0.95]},
                    "partition": {"h.weight": "muon", "b": "adamw"},
                    "param_order": "hidden",
                    "param_groups": [{"params": ["h.weight"], "hyper": {"lr": 0.02}},
                                     {"params": ["b"], "hyper": {"adam_lr": 0.003}}]}})";
  const CheckpointMeta meta = parse_checkpoint_meta(text, "run/meta.json");
  CHECK(meta.step == std::optional<int64_t>(7));
  CHECK_THAT(meta.model_json, Contains("\"arch\":\"mlp\""));
  REQUIRE(meta.optimizer);
  const OptimizerRecord& r = *meta.optimizer;
  CHECK(r.name == "muon");
  CHECK(r.step_count == std::optional<int64_t>(6));
  CHECK(r.muon_params == std::optional<std::string>("^h\\."));
  CHECK(r.hyper_or("lr", 1.0, "m") == 0.02);
  CHECK(r.hyper_or("ns_steps", 1.0, "m") == 5.0);
  CHECK(r.hyper_or("eps", 0.5, "m") == 0.5);
  CURV_CHECK_THROWS(r.hyper_or("betas", 0.0, "run/meta.json"), FormatError,
                    Contains("run/meta.json") && Contains("optimizer.hyper.betas"));
  CHECK(r.partition ==
        std::vector<std::pair<std::string, std::string>>{{"b", "adamw"}, {"h.weight", "muon"}});
  CHECK(r.param_order == "hidden");
  REQUIRE(r.param_groups.size() == 2);
  CHECK(r.param_groups[1].params == std::vector<std::string>{"b"});
  CHECK(r.param_groups[1].hyper == std::vector<std::pair<std::string, double>>{{"adam_lr", 0.003}});
  // Written back: the unknown key survives, numbers keep their form.
  const std::string back = checkpoint_meta_json(meta);
  CHECK_THAT(back, Contains("\"note\": \"kept\"") && Contains("\"ns_steps\": 5\n") &&
                       Contains("\"param_order\": \"hidden\""));
  CHECK(parse_checkpoint_meta(back, "again").optimizer->param_groups.size() == 2);

  const std::vector<std::pair<std::string, std::string>> wrong = {
      {R"({"step": "7"})", "\"step\""},
      {R"({"model": []})", "\"model\""},
      {R"({"optimizer": 3})", "\"optimizer\""},
      {R"({"optimizer": {"name": 3}})", "optimizer.name"},
      {R"({"optimizer": {"hyper": [1]}})", "optimizer.hyper"},
      {R"({"optimizer": {"step_count": 1.5}})", "optimizer.step_count"},
      {R"({"optimizer": {"muon_params": 1}})", "optimizer.muon_params"},
      {R"({"optimizer": {"param_order": false}})", "optimizer.param_order"},
      {R"({"optimizer": {"partition": {"w": 1}}})", "optimizer.partition.w"},
      {R"({"optimizer": {"param_groups": {}}})", "optimizer.param_groups"},
      {R"({"optimizer": {"param_groups": [{"params": ["w"]}]}})", "optimizer.param_groups[0]"},
      {R"({"optimizer": {"param_groups": [{"params": [1], "hyper": {}}]}})",
       "optimizer.param_groups[0].params"},
      {R"({"optimizer": {"param_groups": [{"params": [], "hyper": {"lr": "x"}}]}})", "\"lr\""},
  };
  for (const auto& [bad, key] : wrong) {
    INFO(bad);
    CURV_CHECK_THROWS(parse_checkpoint_meta(bad, "d/meta.json"), FormatError,
                      Contains("d/meta.json") && Contains(key));
  }
}
