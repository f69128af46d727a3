// Which rule rebuilds a saved torch optimizer state: the real classes' states (torch 2.x,
// pytorch-optimizer), saved by torch.save and in a Hugging Face Trainer folder, are each
// recognised as their own rule or refused by name, never rebuilt by another rule
// (tests/python/make_optimizer_states.py; docs/optimizers.md#saved-torch-states).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <tuple>

#include "curv/core/error.h"
#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/io/safetensors.h"
#include "curv/optim/optimizer_directions.h"
#include "curv/optim/optimizers.h"
#include "test_support.h"
#include "torch/version.h"

using namespace curv;
using namespace curv_test;
using Catch::Matchers::Contains;

namespace {

// The fixtures' torch.optim.Muon is torch 2.15's, whose Newton-Schulz runs in bfloat16: a 2.x
// LibTorch rounds those products alike; Debian's 1.13 rounds them otherwise, and bfloat16's
// iteration itself is only a few per cent from float64's (2% and 8% on one 3 x 4 matrix under
// 2.15 and 1.13, 7% between the two), so against 1.13 the step agrees to that.
// An audit along such a step (g·u, uᵀHu, NDS, ‖u‖ against torch.autograd's) agrees to the float64
// HVP's precision under 2.x, and to that precision of the step under 1.13.
#if TORCH_VERSION_MAJOR >= 2
constexpr double kTorchMuonTolerance = 1e-12;
constexpr double kTorchMuonAuditTolerance = kTolFloat64;
#else
constexpr double kTorchMuonTolerance = 0.1;
constexpr double kTorchMuonAuditTolerance = 0.25;
#endif

// The states written by .venv's torch 2.x with pytorch-optimizer and schedulefree
// (`transformers`), or by Debian's torch 1.13, once per build for every test case here.
std::string written_by(bool transformers) {
  return python_fixture("make_optimizer_states.py",
                        {"make_torch_fixtures.py", "../../tools/python/curv_export.py"},
                        "cases.json", transformers);
}

const std::string& states() {
  static const std::string dir = written_by(true);
  return dir;
}

const std::string& states_1_13() {
  static const std::string dir = written_by(false);
  return dir;
}

bool has_case(const std::string& name) {
  const auto cases = nlohmann::json::parse(std::ifstream(states() + "/cases.json"))["cases"];
  return std::find(cases.begin(), cases.end(), name) != cases.end();
}

// The case's checkpoint in the pt layout ("") or the Trainer folder ("_hf").
Checkpoint load(const std::string& name, const std::string& layout,
                const std::string& dir = states()) {
  return load_checkpoint(list_checkpoints(dir + "/" + name + layout)[0]);
}

// The checkpoint's parameters (only its matrices with `matrices`) in file order.
ParamSpace space_of(const Checkpoint& ckpt, bool matrices = false) {
  std::vector<std::string> names;
  std::vector<at::Tensor> values;
  for (const auto& [name, t] : ckpt.model) {
    if (matrices && t.dim() != 2) continue;
    names.push_back(name);
    values.push_back(t);
  }
  return ParamSpace(names, values);
}

// The step the recorded rule rebuilds from the saved state with the case's gradient, against the
// step the optimizer itself took: the relative error. As ndsprobe does, each recorded parameter
// group takes its step under its own hyper-parameters. `note`: what the rebuilt step left out of
// the reference's (Optimizer::step_note).
double rebuilt_step_error(Checkpoint ckpt, const std::string& name,
                          const std::string& dir = states(), bool matrices = false,
                          const std::string& param_order = "model", std::string* note = nullptr) {
  const ParamSpace space = space_of(ckpt, matrices);
  resolve_optimizer_state(ckpt, space, param_order);
  const SavedOptimizer saved = saved_optimizer(ckpt);
  SafetensorsReader next(dir + "/" + name + "_next_step.safetensors");
  ParamVector theta, grad;
  for (const auto& [param, value] : ckpt.model) {
    if (!space.find(param)) continue;
    theta.push_back(value.clone());
    grad.push_back(next.tensor("g." + param));
  }
  const RebuiltStep step = rebuild_saved_step(saved, space, theta, grad);
  const ParamVector& u = step.u;
  if (note) {
    const auto split = step.note.find("; ");
    *note = split == std::string::npos ? "" : step.note.substr(split + 2);
  }
  double diff = 0, ref = 0;
  for (size_t i = 0; i < space.size(); ++i) {
    const at::Tensor want = next.tensor("u." + space[i].name);
    diff += (u[i] - want).pow(2).sum().item<double>();
    ref += want.pow(2).sum().item<double>();
  }
  return std::sqrt(diff / ref);
}

}  // namespace

TEST_CASE("each torch state is recognised as its own rule, in both layouts", "[optimizers]") {
  const std::vector<std::pair<std::string, std::vector<std::string>>> recognised = {
      {"adamw", {"adamw", "torch.optim.AdamW", "decoupled_weight_decay=True"}},
      {"adam", {"adam", "torch.optim.Adam", "decoupled_weight_decay=False"}},
      {"adam_no_decay", {"adam", "torch.optim.Adam", "recognised by keys"}},
      {"sgd", {"sgd", "torch.optim.SGD", "dampening"}},
      {"legacy_adamw_no_decay", {"adamw", "same step at weight_decay 0", "recognised by keys"}},
  };
  for (const std::string layout : {"", "_hf"}) {
    for (const auto& [name, want] : recognised) {
      INFO(name << layout);
      const Checkpoint ckpt = load(name, layout);
      REQUIRE(ckpt.meta.optimizer);
      CHECK(ckpt.meta.optimizer->refusal.empty());
      CHECK(ckpt.optimizer_name() == want[0]);
      for (size_t k = 1; k < want.size(); ++k) {
        CHECK_THAT(ckpt.meta.optimizer->recognition, Contains(want[k]));
      }
    }
  }
  // The recognised rule takes the optimizer's own next step (torch's Adam: the decay in the
  // gradient; AdamW: decoupled).
  for (const std::string name : {"adamw", "adam", "adam_no_decay", "sgd"}) {
    INFO(name);
    CHECK(rebuilt_step_error(load(name, ""), name) < 1e-13);
  }
}

TEST_CASE("states no rule fits, or two fit alike, are refused by name", "[optimizers]") {
  const std::vector<std::pair<std::string, std::vector<std::string>>> refused = {
      {"amsgrad", {"fits no rule", "max_exp_avg_sq", "amsgrad is not False"}},
      {"extra_key", {"fits no rule", "lookahead_k in excess"}},
      {"legacy_adamw", {"decoupled_weight_decay", "the optimizer adamw", "or adam "}},
      {"keller_muon", {"none of their markers", "the optimizer sgd or muon"}},
  };
  for (const std::string layout : {"", "_hf"}) {
    for (const auto& [name, want] : refused) {
      if (!has_case(name))
        continue;  // SOAP needs pytorch-optimizer (scripts/requirements-pypi.txt)
      INFO(name << layout);
      const Checkpoint ckpt = load(name, layout);
      REQUIRE(ckpt.meta.optimizer);
      CHECK(ckpt.optimizer_name().empty());
      const std::string& why = ckpt.meta.optimizer->refusal;
      CHECK_THAT(why, Contains(layout.empty() ? "step_3.pt ['optimizer']" : "optimizer.pt"));
      for (const auto& part : want) CHECK_THAT(why, Contains(part));
      // The refusal survives a round trip through meta.json.
      CHECK(parse_checkpoint_meta(ckpt.meta_json(), "meta").optimizer->refusal == why);
    }
  }
}

TEST_CASE("the optimizer zoo: each rule takes its reference's own next step", "[optimizers]") {
  // case, rule, writer, steps: each saved state is recognised by its keys, in both layouts, and
  // the rule rebuilds the step the reference class itself took from that state, to rounding.
  struct Case {
    std::string name, rule, writer;
    double tolerance = 1e-12;  // bfloat16 Newton-Schulz: kTorchMuonTolerance
  };
  const std::vector<Case> cases = {
      {"nadam", "nadam", "torch.optim.NAdam"},
      {"nadamw", "nadam", "torch.optim.NAdam"},
      {"radam", "radam", "torch.optim.RAdam"},
      {"radam_rectified", "radam", "torch.optim.RAdam"},
      {"radamw", "radam", "torch.optim.RAdam"},
      {"adafactor", "adafactor", "torch.optim.Adafactor"},
      {"soap", "soap", "pytorch-optimizer's SOAP"},
      {"soap_options", "soap", "pytorch-optimizer's SOAP"},
      {"shampoo", "shampoo", "pytorch-optimizer's Shampoo"},
      {"shampoo_decoupled", "shampoo", "pytorch-optimizer's Shampoo"},
      {"kron", "kron", "pytorch-optimizer's Kron"},
      {"kron_schedule", "kron", "pytorch-optimizer's Kron"},
      {"adam_mini", "adam-mini", "adam-mini's Adam_mini"},
      {"scion", "scion", "pytorch-optimizer's SCION", kTorchMuonTolerance},
      {"scion_oracles", "scion", "pytorch-optimizer's SCION"},
      {"schedulefree", "adamw-schedulefree", "AdamWScheduleFree in train mode"},
      {"adamuon", "adamuon", "pytorch-optimizer's AdaMuon", kTorchMuonTolerance},
      {"adamuon_l2", "adamuon", "pytorch-optimizer's AdaMuon", kTorchMuonTolerance},
      {"mars", "mars", "pytorch-optimizer's MARS"},
      {"mars_l2", "mars", "pytorch-optimizer's MARS"},
      {"ademamix", "ademamix", "pytorch-optimizer's AdEMAMix"},
      {"ademamix_l2", "ademamix", "pytorch-optimizer's AdEMAMix"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    REQUIRE(has_case(c.name));  // .venv's torch 2.15 and pytorch-optimizer have every class
    for (const std::string layout : {"", "_hf"}) {
      const Checkpoint ckpt = load(c.name, layout);
      REQUIRE(ckpt.meta.optimizer);
      CHECK(ckpt.meta.optimizer->refusal.empty());
      CHECK(ckpt.optimizer_name() == c.rule);
      CHECK_THAT(ckpt.meta.optimizer->recognition,
                 Contains(c.writer) && Contains("recognised by keys"));
    }
    const double error = rebuilt_step_error(load(c.name, ""), c.name, states(), false, "auto");
    INFO("relative error " << error);
    CHECK(error < c.tolerance);
  }
  // pytorch-optimizer keeps its step count in the group.
  CHECK(load("soap", "").meta.optimizer->step_count == 3);
  // Schedule-Free counts its steps in 'k'; saved in eval mode, its parameters are not the point
  // its step moves.
  CHECK(load("schedulefree", "").meta.optimizer->step_count == 3);
  const Checkpoint eval = load("schedulefree_eval", "_hf");
  CHECK(eval.optimizer_name().empty());
  CHECK_THAT(eval.meta.optimizer->refusal,
             Contains("optimizer.pt") && Contains("eval mode") && Contains("optimizer.train()"));
  // MARS's other types take other steps: refused by name.
  CHECK(load("mars_lion", "").optimizer_name().empty());
  CHECK_THAT(load("mars_lion", "").meta.optimizer->refusal, Contains("mars_type is not 'adamw'"));
  // Kron's fit at the next step draws from the global generator: the saved factors are used as
  // they are, and the step says so; a step without a fit is the reference's own.
  std::string note;
  CHECK(rebuilt_step_error(load("kron_schedule", ""), "kron_schedule", states(), false, "auto",
                           &note) < 1e-12);
  CHECK_THAT(note, Contains("without the fit") && Contains("global generator"));
  rebuilt_step_error(load("kron", ""), "kron", states(), false, "auto", &note);
  CHECK(note.empty());
  CHECK(load("kron", "").meta.optimizer->step_count == 4);
  // Shampoo's inverse-root period is not in its state: every step unless named.
  CHECK(rebuilt_step_error(load("shampoo_every2", ""), "shampoo_every2") > 1e-3);
  Checkpoint every2 = load("shampoo_every2", "");
  name_optimizer(every2, "shampoo", {{"precondition_frequency", 2}});
  CHECK(rebuilt_step_error(every2, "shampoo_every2") < 1e-12);
}

TEST_CASE("torch.optim.Muon: rebuilt with its bfloat16 Newton-Schulz", "[optimizers]") {
  for (const std::string name : {"torch_muon", "torch_muon_rms"}) {
    INFO(name);
    REQUIRE(has_case(name));
    const Checkpoint ckpt = load(name, "");
    CHECK(ckpt.optimizer_name() == "torch-muon");
    CHECK_THAT(ckpt.meta.optimizer->recognition, Contains("torch.optim.Muon"));
    // The iteration runs in bfloat16 as torch's does: with the same LibTorch the kernels round
    // alike; another LibTorch's bfloat16 matrix products may round differently, to bfloat16's
    // 2^-8 relative precision.
    const double error = rebuilt_step_error(ckpt, name, states(), /*matrices=*/true);
    INFO("relative error " << error);
    CHECK(error < kTorchMuonTolerance);
  }
  // Muon on the matrices with AdamW on the rest, saved as the list of the two states: one
  // torch-muon state whose AdamW part is AdamW's groups.
  Checkpoint pair = load("muon_adamw", "");
  CHECK(pair.optimizer_name() == "torch-muon");
  CHECK_THAT(pair.meta.optimizer->recognition,
             Contains("torch.optim.Muon with torch.optim.AdamW") && Contains("['optimizer'][1]"));
  CHECK(pair.hyper("adam_lr", 0) == 3e-3);
  CHECK(pair.hyper("adam_beta2", 0) == 0.95);
  CHECK(pair.hyper("weight_decay", 0) == 0.05);
  // Muon's matrices first, then AdamW's parameters: the order "auto" finds is "hidden".
  const double pair_error = rebuilt_step_error(pair, "muon_adamw", states(), false, "auto");
  INFO("Muon with AdamW: relative error " << pair_error);
  CHECK(pair_error < kTorchMuonTolerance);
  resolve_optimizer_state(pair, space_of(pair));
  CHECK(pair.meta.optimizer->param_order == "hidden");
  CHECK(pair.meta.optimizer->muon_params ==
        std::optional<std::string>("^(0\\.weight|2\\.weight)$"));

  // Its partition takes matrices only; the hidden matrices by default, the rest get AdamW.
  const ParamSpace conv({"conv.weight", "fc.weight", "fc.bias"},
                        {at::zeros({2, 3, 3, 3}), at::zeros({4, 5}), at::zeros({4})});
  CURV_CHECK_THROWS(make_optimizer(OptimizerConfig::parse("torch-muon"), conv), InvalidArgument,
                    Contains("'conv.weight'") && Contains("matrices only"));
  CHECK(make_optimizer(OptimizerConfig::parse("torch-muon:muon_params=^fc"), conv)->partition() ==
        std::vector<std::string>{"adamw", "torch-muon", "adamw"});
}

TEST_CASE("a named rule is checked against the state, and decides an ambiguity", "[optimizers]") {
  // AdamW's state from torch < 2.7: adamw gives AdamW's own step, adam a different one.
  Checkpoint legacy = load("legacy_adamw", "");
  name_optimizer(legacy, "adamw");
  CHECK(legacy.optimizer_name() == "adamw");
  CHECK_THAT(legacy.meta.optimizer->recognition,
             Contains("torch.optim.AdamW") && Contains("named by the user (adamw)"));
  CHECK(legacy.meta.optimizer->refusal.empty());
  CHECK(rebuilt_step_error(legacy, "legacy_adamw") < 1e-13);
  Checkpoint as_adam = load("legacy_adamw", "");
  name_optimizer(as_adam, "adam");
  CHECK(as_adam.optimizer_name() == "adam");
  CHECK(rebuilt_step_error(as_adam, "legacy_adamw") > 1e-3);

  // Keller Jordan's plain Muon, named: every group is orthogonalised.
  Checkpoint muon = load("keller_muon", "_hf");
  name_optimizer(muon, "muon");
  CHECK(muon.optimizer_name() == "muon");
  CHECK_THAT(muon.meta.optimizer->recognition, Contains("Keller Jordan's Muon, named"));
  resolve_optimizer_state(muon, space_of(muon, true), "model");
  REQUIRE(muon.meta.optimizer->muon_params);
  CHECK(*muon.meta.optimizer->muon_params == "^(0\\.weight|2\\.weight)$");
  // A named partition replaces the one the groups give.
  Checkpoint partial = load("keller_muon", "_hf");
  name_optimizer(partial, "muon", {}, std::string("^0\\.weight$"));
  resolve_optimizer_state(partial, space_of(partial, true), "model");
  CHECK(partial.meta.optimizer->muon_params == std::optional<std::string>("^0\\.weight$"));

  // A named rule that does not fit the state is an error naming the file and what differs.
  Checkpoint adamw = load("adamw", "");
  CURV_CHECK_THROWS(
      name_optimizer(adamw, "sgd"), InvalidArgument,
      Contains("step_3.pt") && Contains("not sgd's") && Contains("exp_avg, exp_avg_sq in excess"));
  CURV_CHECK_THROWS(name_optimizer(adamw, "signum"), InvalidArgument,
                    Contains("no rule of that name") && Contains("adamw, adam, sgd, muon, lion"));
  Checkpoint torch_muon = load("torch_muon", "");
  CURV_CHECK_THROWS(name_optimizer(torch_muon, "muon"), InvalidArgument,
                    Contains("not muon's") && Contains("ns_coefficients"));
  // Named hyper-parameters replace the saved ones in every group.
  Checkpoint sgd = load("sgd", "");
  name_optimizer(sgd, "sgd", {{"lr", 0.5}});
  CHECK(sgd.hyper("lr", 0) == 0.5);
  CHECK_THROWS_AS(NamedOptimizer::parse("sgd:beta1=0.5"), InvalidArgument);
  CHECK(NamedOptimizer::parse("muon:ns_steps=7,muon_params=h").hyper ==
        std::vector<std::pair<std::string, double>>{{"ns_steps", 7.0}});
}

TEST_CASE("torch 1.13's states: SGD recognised, Adam and AdamW refused until named",
          "[optimizers]") {
  const std::string& dir = states_1_13();
  for (const std::string layout : {"", "_hf"}) {
    INFO("layout " << layout);
    CHECK(load("sgd", layout, dir).optimizer_name() == "sgd");
    // AdamW and Adam record the same keys in torch 1.13 (no decoupled_weight_decay).
    for (const std::string name : {"adamw", "adam"}) {
      INFO(name);
      const Checkpoint ckpt = load(name, layout, dir);
      CHECK(ckpt.optimizer_name().empty());
      CHECK_THAT(ckpt.meta.optimizer->refusal,
                 Contains("the optimizer adamw") && Contains("or adam "));
    }
    // Without weight decay they take the same step.
    CHECK(load("adam_no_decay", layout, dir).optimizer_name() == "adamw");
  }
  CHECK(rebuilt_step_error(load("sgd", "", dir), "sgd", dir) < 1e-13);
  CHECK(rebuilt_step_error(load("adam_no_decay", "", dir), "adam_no_decay", dir) < 1e-13);
  // Named, each is its optimizer's own next step; the other name gives another step.
  for (const auto& [name, other] : {std::pair<std::string, std::string>{"adamw", "adam"},
                                    std::pair<std::string, std::string>{"adam", "adamw"}}) {
    INFO(name);
    Checkpoint right = load(name, "", dir), wrong = load(name, "", dir);
    name_optimizer(right, name);
    name_optimizer(wrong, other);
    CHECK(rebuilt_step_error(right, name, dir) < 1e-13);
    CHECK(rebuilt_step_error(wrong, name, dir) > 1e-3);
  }
}

TEST_CASE("curv_export.save_checkpoint saves each rule's state in the native layout",
          "[optimizers]") {
  // case, rule, matrices only (a torch.optim.Muon alone holds no other parameter)
  const std::vector<std::tuple<std::string, std::string, bool>> cases = {
      {"adamw", "adamw", false},
      {"adam", "adam", false},
      {"sgd", "sgd", false},
      {"nadamw", "nadam", false},
      {"radam_rectified", "radam", false},
      {"adafactor", "adafactor", false},
      {"torch_muon_rms", "torch-muon", true},
      {"muon_adamw", "torch-muon", false},
      {"soap_options", "soap", false},
      {"shampoo", "shampoo", false},
      {"kron", "kron", false},
      {"adam_mini", "adam-mini", false},
      {"scion_oracles", "scion", false},
      {"ademamix", "ademamix", false},
      {"schedulefree", "adamw-schedulefree", false},
      {"adamuon", "adamuon", false},
      {"mars", "mars", false},
  };
  const auto natives = nlohmann::json::parse(std::ifstream(states() + "/cases.json"))["native"];
  for (const auto& [name, rule, matrices] : cases) {
    INFO(name);
    REQUIRE(std::find(natives.begin(), natives.end(), name) != natives.end());
    const Checkpoint ckpt = load(name, "_native");
    CHECK(ckpt.optimizer_name() == rule);
    const double error = rebuilt_step_error(ckpt, name, states(), matrices);
    INFO("relative error " << error);
    CHECK(error < (rule == "torch-muon" || rule == "adamuon" ? kTorchMuonTolerance : 1e-12));
  }
  const Checkpoint pair = load("muon_adamw", "_native");
  CHECK(pair.meta.optimizer->muon_params ==
        std::optional<std::string>("^(0\\.weight|2\\.weight)$"));
}

TEST_CASE("ndsprobe audits a nanoGPT run of torch.optim.Muon with AdamW along its update",
          "[optimizers][ndsprobe]") {
  REQUIRE(has_case("nanogpt_muon_adamw"));
  TempDir out;
  run_tool("ndsprobe", states() + "/nanogpt_muon_adamw --data " + states() +
                           "/nanogpt_probe.safetensors --dtype float64 --no-realized "
                           "--directions update,torch-muon -o " +
                           out.file("o.h5"));
  const auto reference =
      nlohmann::json::parse(std::ifstream(states() + "/nanogpt_muon_adamw.json"));
  H5Reader reader(out.file("o.h5"));
  for (const std::string direction : {"update", "torch-muon"}) {
    const std::string unit = "/runs/nanogpt_muon_adamw/step_2/" + direction;
    CHECK(reader.attribute_string(unit, "optimizer_rule") == "torch-muon");
    CHECK_THAT(reader.attribute_string(unit, "optimizer_recognition"),
               Contains("torch.optim.Muon with torch.optim.AdamW"));
    for (const char* key : {"first_order", "curvature", "nds", "update_norm"}) {
      INFO(direction << " " << key);
      const double want = reference["torch_muon"][key].get<double>();
      const double got = reader.attribute_double(unit, key);
      CHECK(std::abs(got - want) <= kTorchMuonAuditTolerance * std::abs(want));
    }
  }
}
