// PyTorch checkpoint layouts against the native layout holding the same weights, and ndsprobe's
// numbers on them against torch.autograd (tests/python/make_torch_fixtures.py).
#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/io/probe_data.h"
#include "curv/io/safetensors.h"
#include "curv/io/token_data.h"
#include "curv/models/models.h"
#include "test_support.h"
#include "torch_fixtures.h"

using namespace curv;
using namespace curv_test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::string fixture(const std::string& name) { return torch_fixtures() + "/" + name; }

std::vector<int64_t> steps_of(const std::vector<CheckpointInfo>& infos) {
  std::vector<int64_t> out;
  for (const auto& info : infos) out.push_back(info.step);
  return out;
}

std::unique_ptr<Objective> fixture_model(const Checkpoint& native) {
  return make_model(ModelConfig::from_json(native.model_config_json(), "meta.json"),
                    ModelInit{0, at::kDouble});
}

void check_same_tensors(const NamedTensors& got, const NamedTensors& want) {
  std::map<std::string, at::Tensor> by_name(got.begin(), got.end());
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(by_name.count(name));
    CHECK(at::equal(by_name.at(name), t));
  }
}

std::string ndsprobe(const std::string& args, int* status = nullptr) {
  return run_tool("ndsprobe", args, status);
}

}  // namespace

TEST_CASE("checkpoint layouts are detected and listed", "[torch_checkpoint]") {
  CHECK(detect_checkpoint_layout(fixture("native")) == CheckpointLayout::kNative);
  CHECK(detect_checkpoint_layout(fixture("nanogpt")) == CheckpointLayout::kNanoGPT);
  CHECK(detect_checkpoint_layout(fixture("compiled")) == CheckpointLayout::kNanoGPT);
  CHECK(detect_checkpoint_layout(fixture("hf")) == CheckpointLayout::kHuggingFace);
  CHECK(detect_checkpoint_layout(fixture("hf_sharded")) == CheckpointLayout::kHuggingFace);
  CHECK(detect_checkpoint_layout(fixture("pt")) == CheckpointLayout::kTorchSteps);
  for (const char* run : {"native", "nanogpt", "compiled", "hf", "pt"}) {
    INFO(run);
    CHECK(steps_of(list_checkpoints(fixture(run))) == std::vector<int64_t>{2, 3});
  }
  // ckpt.pt has no step in its name: it comes from iter_num.
  CHECK(list_checkpoints(fixture("compiled"))[0].path == fixture("compiled") + "/ckpt.pt");
  CHECK(parse_checkpoint_layout("hf") == CheckpointLayout::kHuggingFace);
  CURV_CHECK_THROWS(parse_checkpoint_layout("keras"), InvalidArgument, Contains("keras"));
  // The layout can be forced; a layout with nothing to list says what it looked for.
  CURV_CHECK_THROWS(list_checkpoints(fixture("nanogpt"), {}, CheckpointLayout::kHuggingFace),
                    FormatError, Contains("checkpoint-<N>"));

  TempDir mixed;
  fs::copy(fixture("pt"), mixed.path());
  fs::copy(fixture("nanogpt"), mixed.path());
  CURV_CHECK_THROWS(detect_checkpoint_layout(mixed.path()), FormatError,
                    Contains("several layouts") && Contains("ProbeRunOptions.layout"));
  CHECK(steps_of(list_checkpoints(mixed.path(), {}, CheckpointLayout::kTorchSteps)) ==
        std::vector<int64_t>{2, 3});
  // A native checkpoint beside them decides.
  fs::copy(fixture("native"), mixed.path(), fs::copy_options::recursive);
  CHECK(detect_checkpoint_layout(mixed.path()) == CheckpointLayout::kNative);
}

TEST_CASE("torch layouts load into the same Checkpoint as the native layout",
          "[torch_checkpoint]") {
  const Checkpoint native = load_checkpoint(list_checkpoints(fixture("native"))[0]);
  auto model = fixture_model(native);
  const auto& space = model->space();
  const ParamVector want = parameters_from(native, space, {});
  const auto native_meta = nlohmann::json::parse(native.meta_json());

  for (const char* run : {"nanogpt", "compiled", "hf", "hf_sharded", "pt"}) {
    INFO(run);
    Checkpoint ckpt = load_checkpoint(list_checkpoints(fixture(run))[0]);
    CHECK(ckpt.step == 2);
    for (const auto& [name, t] : ckpt.model) {
      CHECK(name.find("_orig_mod.") == std::string::npos);
      CHECK(t.dim() != 4);  // the causal-mask buffers are dropped
    }
    const ParamVector got = parameters_from(ckpt, space, {});
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(at::equal(got[i], want[i]));
    if (std::string(run) == "pt") {
      CHECK_FALSE(ckpt.indexed_optimizer);
      continue;
    }
    REQUIRE(ckpt.indexed_optimizer);
    const bool trainer_folder = std::string(run).rfind("hf", 0) == 0;
    if (trainer_folder) {
      // torch 1.13's AdamW records no decoupled_weight_decay, and nothing else in a Trainer
      // folder says Adam or AdamW: refused until named.
      CHECK(ckpt.optimizer_name().empty());
      CHECK_THAT(ckpt.meta.optimizer->refusal,
                 Catch::Matchers::Contains("optimizer.pt") &&
                     Catch::Matchers::Contains("decoupled_weight_decay") &&
                     Catch::Matchers::Contains("the optimizer adamw"));
      name_optimizer(ckpt, "adamw");
      CHECK_THAT(ckpt.meta.optimizer->recognition,
                 Catch::Matchers::Contains("named by the user (adamw)"));
    } else {
      // nanoGPT's train.py builds AdamW: that settles it.
      CHECK_THAT(ckpt.meta.optimizer->recognition, Catch::Matchers::Contains("nanoGPT"));
    }
    resolve_optimizer_state(ckpt, space);
    CHECK_FALSE(ckpt.indexed_optimizer);
    check_same_tensors(ckpt.optimizer, native.optimizer);
    const auto meta = nlohmann::json::parse(ckpt.meta_json());
    CHECK(meta["optimizer"]["name"] == "adamw");
    CHECK(meta["optimizer"]["step_count"] == 2);
    CHECK(meta["optimizer"]["param_order"] == "ndim");
    CHECK(meta["optimizer"]["hyper"] == native_meta["optimizer"]["hyper"]);
    CHECK(meta["optimizer"]["param_groups"] == native_meta["optimizer"]["param_groups"]);
    if (!trainer_folder) {
      // nanoGPT's model_args become the built-in GPT's config.
      CHECK(ModelConfig::from_json(ckpt.model_config_json(), run).to_json() ==
            ModelConfig::from_json(native.model_config_json(), "native").to_json());
    }
  }
}

TEST_CASE("optimizer parameter order: overrides, ambiguity, state of another model",
          "[torch_checkpoint]") {
  const Checkpoint native = load_checkpoint(list_checkpoints(fixture("native"))[0]);
  auto model = fixture_model(native);
  const auto& space = model->space();
  const auto info = list_checkpoints(fixture("nanogpt"))[0];

  Checkpoint ckpt = load_checkpoint(info);
  CURV_CHECK_THROWS(resolve_optimizer_state(ckpt, space, "model"), InvalidArgument,
                    Contains("ckpt_2.pt ['optimizer']") && Contains("ParamOrderSpec = model") &&
                        Contains("shape"));
  CURV_CHECK_THROWS(resolve_optimizer_state(ckpt, space, "alphabetical"), InvalidArgument,
                    Contains("alphabetical"));

  // An order file naming the parameters in nanoGPT's group order gives the same state.
  TempDir dir;
  std::vector<std::string> order;
  for (const auto& p : space.params())
    if (p.shape.size() >= 2) order.push_back(p.name);
  for (const auto& p : space.params())
    if (p.shape.size() < 2) order.push_back(p.name);
  {
    std::ofstream out(dir.file("order.txt"));
    for (const auto& name : order) out << name << "\n";
  }
  resolve_optimizer_state(ckpt, space, "file:" + dir.file("order.txt"));
  check_same_tensors(ckpt.optimizer, native.optimizer);

  Checkpoint misspelt = load_checkpoint(info);
  {
    std::ofstream out(dir.file("bad.txt"));
    for (const auto& name : order) out << (name == order[2] ? name + "x" : name) << "\n";
  }
  CURV_CHECK_THROWS(resolve_optimizer_state(misspelt, space, "file:" + dir.file("bad.txt")),
                    InvalidArgument, Contains("bad.txt") && Contains("did you mean '" + order[2]));

  Checkpoint other = load_checkpoint(list_checkpoints(fixture("other_optimizer"))[0]);
  CURV_CHECK_THROWS(resolve_optimizer_state(other, space), InvalidArgument,
                    Contains("other_optimizer/ckpt.pt ['optimizer']") &&
                        Contains("different model") && Contains("[11, 12]"));

  // Names recorded by the optimizer (param_names) decide, whatever the group order.
  Checkpoint named = load_checkpoint(list_checkpoints(fixture("named_optimizer"))[0]);
  resolve_optimizer_state(named, space);
  CHECK(nlohmann::json::parse(named.meta_json())["optimizer"]["param_order"] == "names");
  check_same_tensors(named.optimizer,
                     SafetensorsReader(fixture("named_optimizer_expected.safetensors")).tensors());

  // State for only one matrix: model order and nanoGPT's order both fit, and they disagree.
  ModelConfig mlp = ModelConfig::defaults("mlp");
  mlp.as<MlpConfig>().sizes = {4, 4, 4};
  auto small = make_model(mlp, ModelInit{0, at::kDouble});
  Checkpoint ambiguous = load_checkpoint(list_checkpoints(fixture("ambiguous"))[0]);
  CURV_CHECK_THROWS(resolve_optimizer_state(ambiguous, small->space()), InvalidArgument,
                    Contains("ambiguous") && Contains("ParamOrderSpec"));
  resolve_optimizer_state(ambiguous, small->space(), "ndim");
  REQUIRE(ambiguous.optimizer.size() == 2);
  CHECK(ambiguous.optimizer[0].first == "layers.0.weight.exp_avg");
}

TEST_CASE("ndsprobe on torch layouts equals ndsprobe on the native layout and torch.autograd",
          "[torch_checkpoint][ndsprobe]") {
  TempDir out;
  const std::string probe = fixture("probe.safetensors");
  const std::string model_json = out.file("model.json");
  {
    const Checkpoint native = load_checkpoint(list_checkpoints(fixture("native"))[0]);
    std::ofstream(model_json) << native.model_config_json();
  }
  const std::string common = " --data " + probe + " --batch-size 4 --dtype float64 --no-realized";
  struct Run {
    const char* name;
    std::string extra, directions;
  };
  const std::vector<Run> runs = {
      {"native", "", "delta,gradient,adamw"},
      {"nanogpt", "", "delta,gradient,adamw"},
      {"compiled", " --layout nanogpt --param-order ndim", "delta,gradient,adamw"},
      {"hf", " --model " + model_json + " --optimizer adamw", "delta,gradient,adamw"},
      {"pt", " --model " + model_json + " --layout pt", "delta,gradient"},
  };
  const auto reference = nlohmann::json::parse(std::ifstream(fixture("reference.json")));
  std::map<std::string, double> native;  // "direction/key" -> value of the native run
  for (const auto& run : runs) {
    INFO(run.name);
    const std::string h5 = out.file(std::string(run.name) + ".h5");
    ndsprobe(fixture(run.name) + common + run.extra + " --directions " + run.directions + " -o " +
             h5);
    H5Reader reader(h5);
    CHECK(reader.attribute_string(std::string("/runs/") + run.name, "layout") ==
          (std::string(run.name) == "compiled" ? "nanogpt" : run.name));
    const std::string step = std::string("/runs/") + run.name + "/step_2";
    CHECK(reader.attribute_double(step, "loss") ==
          Approx(reference["loss"].get<double>()).epsilon(kTolFloat64));
    if (run.directions.find("adamw") != std::string::npos) {
      // How the rule was chosen, per layout.
      const std::string how = reader.attribute_string(step + "/adamw", "optimizer_recognition");
      CHECK(reader.attribute_string(step + "/adamw", "optimizer_rule") == "adamw");
      const std::string name = run.name;
      CHECK_THAT(how, Catch::Matchers::Contains(name == "native" ? "recorded in"
                                                : name == "hf"   ? "named by the user (adamw)"
                                                                 : "nanoGPT's train.py"));
    }
    for (const char* direction : {"delta", "gradient", "adamw"}) {
      if (run.directions.find(direction) == std::string::npos) continue;
      INFO(direction);
      for (const char* key : {"first_order", "curvature", "nds", "update_norm"}) {
        INFO(key);
        const double want = reference[direction][key].get<double>();
        const double got = reader.attribute_double(step + "/" + direction, key);
        CHECK(std::abs(got - want) <= kTolFloat64 * std::abs(want));
        // The same weights and state through another layout give the same numbers.
        const std::string id = std::string(direction) + "/" + key;
        if (std::string(run.name) == "native") native[id] = got;
        CHECK(std::abs(got - native.at(id)) <= 1e-13 * std::abs(native.at(id)));
      }
    }
  }

  // Without --optimizer, torch 1.13's AdamW state in a Trainer folder is refused, not guessed:
  // a non-zero exit naming the file and the choice; the direction that needs no state still runs.
  int status = 0;
  const std::string refused = ndsprobe(fixture("hf") + common + " --model " + model_json +
                                           " --directions update -o " + out.file("refused.h5"),
                                       &status);
  CHECK(status != 0);
  CHECK_THAT(refused, Contains("checkpoint-2/optimizer.pt") && Contains("the optimizer adamw") &&
                          Contains("decoupled_weight_decay"));
  ndsprobe(fixture("hf") + common + " --model " + model_json + " --directions delta -o " +
           out.file("delta_only.h5"));

  // Half-precision weights (bfloat16 matrices, float16 vectors) in a .pt and in safetensors.
  const std::string half = common + " --model " + model_json + " --directions delta,gradient";
  ndsprobe(fixture("pt_half") + half + " -o " + out.file("pt_half.h5"));
  ndsprobe(fixture("native_half") + half + " -o " + out.file("native_half.h5"));
  H5Reader pt_half(out.file("pt_half.h5")), native_half(out.file("native_half.h5"));
  for (const char* direction : {"delta", "gradient"}) {
    for (const char* key : {"first_order", "curvature", "nds"}) {
      INFO(direction << " " << key);
      CHECK(
          pt_half.attribute_double(std::string("/runs/pt_half/step_2/") + direction, key) ==
          native_half.attribute_double(std::string("/runs/native_half/step_2/") + direction, key));
    }
  }
}

TEST_CASE("ndsprobe on a nanoGPT run without biases equals torch.autograd",
          "[torch_checkpoint][ndsprobe]") {
  TempDir out;
  ndsprobe(fixture("nanogpt_nobias") + " --data " + fixture("probe.safetensors") +
           " --dtype float64 --no-realized --directions gradient,adamw -o " + out.file("o.h5"));
  const auto reference = nlohmann::json::parse(std::ifstream(fixture("reference_nobias.json")));
  H5Reader reader(out.file("o.h5"));
  CHECK_THAT(reader.attribute_string("/", "model"), Contains("bias=false"));
  CHECK(reader.attribute_double("/runs/nanogpt_nobias/step_2", "loss") ==
        Approx(reference["loss"].get<double>()).epsilon(kTolFloat64));
  for (const char* direction : {"gradient", "adamw"}) {
    for (const char* key : {"first_order", "curvature", "nds", "update_norm"}) {
      INFO(direction << " " << key);
      const double want = reference[direction][key].get<double>();
      const double got =
          reader.attribute_double(std::string("/runs/nanogpt_nobias/step_2/") + direction, key);
      CHECK(std::abs(got - want) <= kTolFloat64 * std::abs(want));
    }
  }
}

TEST_CASE("ndsprobe rebuilds MuonWithAuxAdam's step from a nanoGPT checkpoint as torch does",
          "[torch_checkpoint][ndsprobe]") {
  TempDir out;
  ndsprobe(fixture("muon") + " --data " + fixture("probe.safetensors") +
           " --dtype float64 --no-realized --directions muon,update -o " + out.file("o.h5"));
  const auto reference = nlohmann::json::parse(std::ifstream(fixture("reference_muon.json")));
  H5Reader reader(out.file("o.h5"));
  for (const char* direction : {"muon", "update"}) {
    for (const char* key : {"first_order", "curvature", "nds", "update_norm"}) {
      INFO(direction << " " << key);
      const double want = reference["muon"][key].get<double>();
      const double got =
          reader.attribute_double(std::string("/runs/muon/step_2/") + direction, key);
      CHECK(std::abs(got - want) <= kTolFloat64 * std::abs(want));
    }
  }
  // The optimizer's own groups decide which matrices are orthogonalised.
  Checkpoint ckpt = load_checkpoint(list_checkpoints(fixture("muon"))[0]);
  auto model = make_model(ModelConfig::from_json(ckpt.model_config_json(), "muon"),
                          ModelInit{0, at::kDouble});
  resolve_optimizer_state(ckpt, model->space());
  const auto meta = nlohmann::json::parse(ckpt.meta_json())["optimizer"];
  CHECK(meta["name"] == "muon");
  CHECK(meta["param_order"] == "hidden");
  CHECK_THAT(meta["muon_params"].get<std::string>(),
             Contains("transformer\\.h\\.0\\.attn\\.c_attn\\.weight"));
  CHECK(meta["hyper"]["adam_lr"] == 3e-3);
  CHECK(meta["hyper"]["lr"] == 0.05);
}

TEST_CASE("the Hessian-vector product on a nanoGPT checkpoint equals torch.autograd's",
          "[torch_checkpoint]") {
  Checkpoint ckpt = load_checkpoint(list_checkpoints(fixture("nanogpt"))[0]);
  auto model = make_model(ModelConfig::from_json(ckpt.model_config_json(), "ckpt_2.pt"),
                          ModelInit{0, at::kDouble});
  ProbeDataOptions options;
  options.batch_size = 2;  // two batches: the size-weighted mean is the full-set loss
  CurvatureEngine engine(*model, load_probe_data(fixture("probe.safetensors"), options));
  engine.set_parameters(parameters_from(ckpt, model->space(), model->parameters()));
  SafetensorsReader reference(fixture("hvp_delta.safetensors"));
  ParamVector u;
  for (const auto& p : model->space().params()) u.push_back(reference.tensor("u." + p.name));
  const ParamVector hu = engine.hvp(u);
  for (size_t i = 0; i < hu.size(); ++i) {
    const auto& name = model->space()[i].name;
    INFO(name);
    const at::Tensor want = reference.tensor("hu." + name);
    const double error = (hu[i] - want).norm().item<double>();
    CHECK(error <= kTolFloat64 * std::max(1e-12, want.norm().item<double>()));
  }
}

TEST_CASE("ndsprobe: bad torch checkpoints fail with the file and key",
          "[torch_checkpoint][ndsprobe]") {
  TempDir out;
  const std::string common = " --data " + fixture("probe.safetensors") + " -o " + out.file("x.h5");
  int status = 0;
  std::string text = ndsprobe(fixture("other_optimizer") + common + " --directions adamw", &status);
  CHECK(status != 0);
  CHECK_THAT(text, Contains("ckpt.pt ['optimizer']") && Contains("different model"));

  std::ofstream(out.file("model.json"))
      << load_checkpoint(list_checkpoints(fixture("native"))[0]).model_config_json();
  text = ndsprobe(fixture("misnamed") + common + " --model " + out.file("model.json") +
                      " --directions gradient",
                  &status);
  CHECK(status != 0);
  CHECK_THAT(text, Contains("step_2.pt") &&
                       Contains("'transformer.h.0.attn.c_attn.weight' is missing") &&
                       Contains("c_atn"));

  const std::string evil_run = out.file("evil_run");
  fs::create_directories(evil_run);
  fs::copy_file(fixture("reader/evil.pt"), evil_run + "/step_1.pt");
  text = ndsprobe(evil_run + common + " --directions gradient", &status);
  CHECK(status != 0);
  CHECK_THAT(text, Contains("step_1.pt") && Contains("not allowed"));
  CHECK_FALSE(fs::exists(fixture("reader/pwned")));

  text = ndsprobe(fixture("nanogpt") + common + " --param-order file:" + out.file("none.txt"),
                  &status);
  CHECK(status != 0);
  CHECK_THAT(text, Contains("none.txt") && Contains("no such file"));

  text = ndsprobe(fixture("nanogpt") + common + " --layout hf", &status);
  CHECK(status != 0);
  CHECK_THAT(text, Contains("checkpoint-<N>"));
}

TEST_CASE("ndsprobe reads uint16 token files as probe data", "[torch_checkpoint][ndsprobe]") {
  TempDir out;
  const std::string bin = out.file("val.bin");
  {
    std::ofstream f(bin, std::ios::binary);
    for (int i = 0; i < 200; ++i) {
      const uint16_t token = static_cast<uint16_t>((i * 7 + i / 3) % 11);
      f.write(reinterpret_cast<const char*>(&token), sizeof token);
    }
  }
  // The same windows through a safetensors file give the same numbers.
  const ProbeSet windows = load_token_probe_data(bin, 6, 5, 0, 3);
  REQUIRE(windows.size() == 1);
  CHECK(windows[0].inputs.sizes() == at::IntArrayRef({5, 6}));
  CHECK(at::equal(windows[0].inputs.narrow(1, 1, 5), windows[0].targets.narrow(1, 0, 5)));
  const std::string st = out.file("windows.safetensors");
  write_safetensors(st, {{"inputs", windows[0].inputs}, {"targets", windows[0].targets}});
  const std::string args =
      fixture("nanogpt") + " --dtype float64 --directions delta --no-realized --seed 3";
  ndsprobe(args + " --data " + bin + " --block-size 6 --examples 5 -o " + out.file("a.h5"));
  ndsprobe(args + " --data " + st + " -o " + out.file("b.h5"));
  H5Reader a(out.file("a.h5")), b(out.file("b.h5"));
  for (const char* key : {"first_order", "curvature", "nds"}) {
    CHECK(a.attribute_double("/runs/nanogpt/step_2/delta", key) ==
          b.attribute_double("/runs/nanogpt/step_2/delta", key));
  }
  int status = 0;
  const std::string text = ndsprobe(args + " --data " + bin + " -o " + out.file("c.h5"), &status);
  CHECK(status != 0);
  CHECK_THAT(text, Contains("--block-size"));
}

TEST_CASE("tools/python/curv_export.py: a custom architecture exported and saved natively",
          "[torch_checkpoint][ndsprobe]") {
  TempDir out;
  run_python("use_curv_export.py", {CURV_SOURCE_DIR, out.path()});
  const auto reference = nlohmann::json::parse(std::ifstream(out.file("reference.json")));
  ndsprobe(out.file("run") + " --model " + out.file("model.pt") + " --data " +
           out.file("probe.safetensors") +
           " --dtype float64 --directions delta,adamw --no-realized -o " + out.file("o.h5"));
  H5Reader reader(out.file("o.h5"));
  CHECK(reader.attribute_double("/runs/run/step_1", "loss") ==
        Approx(reference["loss"].get<double>()).epsilon(kTolFloat64));
  for (const char* key : {"first_order", "curvature", "nds", "update_norm"}) {
    INFO(key);
    const double want = reference[key].get<double>();
    CHECK(std::abs(reader.attribute_double("/runs/run/step_1/delta", key) - want) <=
          kTolFloat64 * std::abs(want));
  }
  CHECK_THAT(reader.attribute_string("/runs/run/step_1/adamw", "note"),
             Contains("2 parameter groups"));

  // Exported without a loss: logits scored by cross-entropy.
  ndsprobe(out.file("run_logits") + " --model " + out.file("logits.pt") +
           " --script-mode logits --data " + out.file("probe.safetensors") +
           " --dtype float64 --directions gradient --no-realized -o " + out.file("l.h5"));
  CHECK(H5Reader(out.file("l.h5")).attribute_double("/runs/run_logits/step_2", "loss") ==
        Approx(reference["logits_loss"].get<double>()).epsilon(kTolFloat64));
}

TEST_CASE("torch layouts: inconsistent files name the file and key", "[torch_checkpoint]") {
  TempDir run;
  fs::copy(fixture("hf"), run.path(), fs::copy_options::recursive);
  std::ofstream(run.file("checkpoint-2/trainer_state.json")) << R"({"global_step": 5})";
  CURV_CHECK_THROWS(
      load_checkpoint(list_checkpoints(run.path())[0]), FormatError,
      Contains("checkpoint-2/trainer_state.json") && Contains("global_step") && Contains("5"));
  // A nanoGPT file named for a step other than its iter_num keeps the name's step.
  TempDir renamed;
  fs::copy_file(fixture("nanogpt/ckpt_2.pt"), renamed.file("ckpt_7.pt"));
  const Checkpoint ckpt = load_checkpoint(list_checkpoints(renamed.path())[0]);
  CHECK(ckpt.step == 7);
  CHECK(nlohmann::json::parse(ckpt.meta_json())["iter_num"] == 2);
}
