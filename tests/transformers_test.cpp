// Folders written by the real transformers (the version scripts/setup-pypi.sh pins): tiny LLaMA,
// Llama 3.1 (rotary scaling llama3), Qwen2, Qwen3, Mistral, GPT-2, GPT-NeoX (Pythia's
// architecture, with its residual in parallel and in turn), OLMo 2, Phi-3, Gemma 2 and Gemma 3
// (text) and mixture-of-experts (Mixtral, OLMoE, Qwen3-MoE) models trained four steps by
// transformers' own Trainer on the CPU and read as saved, with no --model. ndsprobe's audits of
// the checkpoint delta and of the rebuilt AdamW step equal transformers' modelling code and
// torch.optim.AdamW in float64 (tests/python/transformers_reference.py); the linear schedule's
// last learning rate is 0, so the last checkpoint's AdamW step is a zero direction, recorded as
// such while the run completes.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/models/model_loader.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;
using Catch::Matchers::Contains;

TEST_CASE("folders saved by transformers' Trainer equal transformers' own float64 model",
          "[transformers][hf_models][ndsprobe]") {
  const std::string arch = GENERATE("llama", "llama3", "qwen2", "qwen3", "mistral", "gpt2",
                                    "gpt_neox", "gpt_neox_sequential", "olmo2", "phi3", "gemma2",
                                    "gemma3", "mixtral", "olmoe", "qwen3_moe");
  INFO(arch);
  // transformers 5 trains a mixture of experts with each layer's experts fused into two tensors,
  // so its optimizer.pt is over those; the checkpoints store them per expert.
  const bool moe = arch == "mixtral" || arch == "olmoe" || arch == "qwen3_moe";
  TempDir dir;
  run_transformers_python("transformers_reference.py", {dir.path(), arch});
  const nlohmann::json ref = read_json(dir.file("reference.json"));
  INFO("transformers " << ref["transformers"].get<std::string>());
  const std::string out = dir.file("probe.h5");
  int status = 0;
  const std::string log =
      run_tool("ndsprobe",
               fmt::format("{}/run --data {} --dtype float64 --directions {} --blocks component "
                           "-o {}",
                           dir.path(), dir.file("probe.safetensors"), "delta,adamw", out),
               &status);
  INFO(log);
  REQUIRE(status == 0);
  H5Reader reader(out);
  CHECK(reader.attribute_string("/", "param_names") ==
        fmt::format("{}", fmt::join(ref["param_names"].get<std::vector<std::string>>(), ",")));
  const Table taylor = reader.table("/taylor");
  if (moe) {
    INFO("the share of routing choices that differ at θ + u, as transformers' routers choose");
    const double changed = reader.attribute_double("/runs/run/step_2/delta", "routing_changed");
    CHECK(changed == ref["delta"]["routing_changed"].get<double>());
    CHECK(changed > 0.0);
    INFO("the router and each expert are blocks of their own");
    const auto names = reader.table("/runs/run/step_2/delta/blocks").strings("name");
    CHECK(std::count(names.begin(), names.end(), "model.layers.0.router") == 1);
    CHECK(std::count(names.begin(), names.end(), "model.layers.0.mlp.expert3") == 1);
  } else {
    CHECK(std::isnan(reader.attribute_double("/runs/run/step_2/delta", "routing_changed")));
  }
  {
    INFO("optimizer.pt's indices named by the Trainer's own decay / no-decay grouping");
    Checkpoint ckpt = load_checkpoint(list_checkpoints(dir.path() + "/run").front());
    const LoadedModel model =
        load_model(ModelSource{}, ckpt.model_config_json(), ckpt.model_config_file);
    const ModelStructure structure = model.objective->structure();
    resolve_optimizer_state(ckpt, model.objective->space(), "auto", &structure);
    REQUIRE(ckpt.meta.optimizer);
    CHECK(ckpt.meta.optimizer->param_order == "trainer");
    INFO(
        "the groups name each parameter once (a mixture of experts' fused tensors as their "
        "experts' projections)");
    std::vector<std::string> grouped;
    for (const auto& g : ckpt.meta.optimizer->param_groups) {
      grouped.insert(grouped.end(), g.params.begin(), g.params.end());
    }
    std::sort(grouped.begin(), grouped.end());
    std::vector<std::string> names = model.objective->space().names();
    std::sort(names.begin(), names.end());
    CHECK(grouped == names);
  }
  {
    INFO("delta at checkpoint-2: u = θ4 − θ2");
    check_audit(taylor, taylor_row(taylor, 2, "delta"), ref["delta"]);
  }
  {
    INFO("adamw at checkpoint-2: torch.optim.AdamW's step from optimizer.pt and scheduler.pt");
    check_audit(taylor, taylor_row(taylor, 2, "adamw"), ref["adamw"]);
  }
  // The schedule's learning rate at checkpoint-4 is 0: the rebuilt step is zero, the unit holds
  // its loss and zero terms with NaN ratios and a status, and the run completes.
  REQUIRE(ref["lr_at_4"][0].get<double>() == 0.0);
  const size_t last = taylor_row(taylor, 4, "adamw");
  CHECK(std::abs(taylor.doubles("loss")[last] - ref["loss_at_4"].get<double>()) <=
        1e-10 * ref["loss_at_4"].get<double>());
  CHECK(taylor.doubles("update_norm")[last] == 0.0);
  CHECK(taylor.doubles("first_order")[last] == 0.0);
  CHECK(taylor.doubles("curvature")[last] == 0.0);
  CHECK(taylor.doubles("realized")[last] == 0.0);
  CHECK(std::isnan(taylor.doubles("nds")[last]));
  CHECK(std::isnan(taylor.doubles("rho_within")[last]));
  const std::string unit = "/runs/run/step_4/adamw";
  CHECK(reader.attribute_string(unit, "status") == "zero_direction");
  const Table statuses = reader.table("/status");
  std::vector<std::string> listed;
  for (size_t i = 0; i < statuses.num_rows(); ++i) {
    listed.push_back(fmt::format("{} {} {}", statuses.int64s("step")[i],
                                 statuses.strings("direction")[i], statuses.strings("status")[i]));
  }
  CHECK_THAT(fmt::format("{}", fmt::join(listed, "; ")), Contains("4 adamw zero_direction"));
  if (arch == "mixtral") {
    INFO("a state over the fused experts of a rule whose step is not elementwise is refused");
    run_transformers_python("as_muon_state.py", {dir.path() + "/run/checkpoint-2/optimizer.pt"});
    const std::string refused = run_tool(
        "ndsprobe",
        fmt::format("{}/run --data {} --dtype float64 --directions muon --optimizer muon -o {}",
                    dir.path(), dir.file("probe.safetensors"), dir.file("muon.h5")),
        &status);
    CHECK(status != 0);
    CHECK_THAT(refused, Contains("checkpoint-2/optimizer.pt") &&
                            Contains("muon's step on a fused tensor is not elementwise"));
  }
  CHECK_THAT(log, Contains("1 unit(s) along a zero direction"));

  if (arch == "gpt_neox") {
    INFO("query_key_value's rows interleave q, k and v head by head: a group per head and role");
    const std::string within = dir.file("within.h5");
    run_tool("ndsprobe", fmt::format("{}/run --data {} --dtype float64 --directions delta "
                                     "--steps 2 --within -o {}",
                                     dir.path(), dir.file("probe.safetensors"), within));
    const Table groups = H5Reader(within).table(
        "/runs/run/step_2/delta/within/gpt_neox.layers.0.attention.query_key_value.weight/groups");
    const auto& names = groups.strings("name");
    REQUIRE(names.size() == 12);
    CHECK(names[0] == "q.head0");
    CHECK(names[4] == "k.head1");
    CHECK(names[11] == "v.head3");

    INFO(
        "the same models published as a series of revisions named by their step (Pythia's "
        "step<N>/, OLMo's stage1-step<N>-tokens<M>/): model folders alone, listed in step order");
    const std::string series = dir.file("series");
    for (const auto& [from, to] :
         {std::pair{"checkpoint-2", "step2"}, std::pair{"checkpoint-4", "stage1-step4-tokens1M"}}) {
      std::filesystem::create_directories(series + "/" + to);
      for (const char* file : {"config.json", "model.safetensors"}) {
        std::filesystem::copy_file(dir.path() + "/run/" + from + "/" + file,
                                   series + "/" + to + "/" + file);
      }
    }
    const std::string revisions = dir.file("revisions.h5");
    run_tool("ndsprobe", fmt::format("{} --data {} --dtype float64 --directions delta -o {}",
                                     series, dir.file("probe.safetensors"), revisions));
    H5Reader r(revisions);
    CHECK(r.attribute_string("/runs/series", "layout") == "hf_revisions");
    const Table t = r.table("/taylor");
    check_audit(t, taylor_row(t, 2, "delta"), ref["delta"]);
  }

  if (arch == "llama") {
    INFO("the same checkpoints in bfloat16, sharded with model.safetensors.index.json");
    REQUIRE(ref["bf16_shards"].get<int>() > 1);
    const std::string sharded = dir.file("sharded.h5");
    run_tool("ndsprobe",
             fmt::format("{}/sharded --data {} --dtype float64 --directions delta -o {}",
                         dir.path(), dir.file("probe.safetensors"), sharded));
    const Table t = H5Reader(sharded).table("/taylor");
    const double want = ref["bf16_loss_at_2"].get<double>();
    CHECK(std::abs(t.doubles("loss")[taylor_row(t, 2, "delta")] - want) <= 1e-10 * want);
  }
}
