// Layer-wise recomputation (EngineOptions::recompute_layers): the staged loss composes to the
// loss, and the gradients and Hessian-vector products formed one layer's graph at a time equal
// those of the whole graph (float64: to rounding) on the built-in LLaMA, with partial
// supports and targets, micro-batches and finite differences, returned or written into a caller's
// flat vector (hvp_into); ndsprobe plans one layer's graph and
// writes the whole graph's numbers; models not computed in stages are refused by name.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <utility>

#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/io/safetensors.h"
#include "curv/models/models.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;
namespace fs = std::filesystem;

namespace {

ModelConfig llama_config(bool tied) {
  return ModelConfig::from_json(fmt::format(
      R"({{"arch": "llama", "vocab_size": 11, "hidden_size": 8, "intermediate_size": 12,
          "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 8, "qk_norm": {}, "mlp_bias": {},
          "tie_word_embeddings": {}, "attention_bias": {}}})",
      !tied, !tied, tied, tied));
}

}  // namespace

TEST_CASE("a staged loss composes to the loss", "[engine][layers]") {
  auto model = make_model(llama_config(false), ModelInit{5, at::kDouble});
  const ProbeSet probe = gpt_probe(3, 6, 3, 11, 5);
  REQUIRE(model->loss_stages() == 3 + 2);
  at::Tensor x;
  for (size_t s = 0; s < model->loss_stages(); ++s) x = model->loss_stage(s, x, probe[0]);
  CHECK(x.dim() == 0);
  CHECK(x.item<double>() == model->loss(probe[0]).item<double>());
  CHECK_THROWS_AS(model->loss_stage(model->loss_stages(), x, probe[0]), ModelError);
  // The first stage checks the batch as loss() does.
  Batch wrong = probe[0];
  wrong.inputs = wrong.inputs.clone().fill_(11);
  CHECK_THROWS_WITH(model->loss_stage(0, {}, wrong), Catch::Contains("vocabulary"));
  // modded-nanogpt's loss is scaled: its last stage too.
  auto modded = make_model(ModelConfig::from_json(R"({"arch": "modded", "vocab_size": 11,
      "num_layers": 2, "model_dim": 8, "head_dim": 4, "context": 8, "loss_scale": 3.0})"),
                           ModelInit{5, at::kDouble});
  at::Tensor y;
  for (size_t s = 0; s < modded->loss_stages(); ++s) y = modded->loss_stage(s, y, probe[0]);
  CHECK(y.item<double>() == modded->loss(probe[0]).item<double>());
}

TEST_CASE("layer-wise recomputation gives the whole graph's gradient and HVPs",
          "[engine][layers]") {
  for (const bool tied : {false, true}) {
    INFO((tied ? "tied head, attention biases" : "untied head, q/k norms, MLP biases"));
    auto model = make_model(llama_config(tied), ModelInit{7, at::kDouble});
    const ProbeSet probe = gpt_probe(4, 7, 3, 11, 5);
    const ParamVector u = random_direction(*model, 11);
    CurvatureEngine whole(*model, probe);
    for (const int64_t micro_batch : {int64_t{0}, int64_t{2}}) {
      INFO("micro_batch " << micro_batch);
      EngineOptions options;
      options.recompute_layers = true;
      options.micro_batch = micro_batch;
      CurvatureEngine layered(*model, probe, options);
      CHECK_FALSE(layered.options().reuse_graph);
      CHECK(std::abs(layered.loss() - whole.loss()) <= 1e-14 * std::abs(whole.loss()));
      CHECK(relative_error(layered.gradient(), whole.gradient()) <= 1e-12);
      // Per-batch terms reach an observer as with the whole graph.
      std::vector<double> gu_layered, gu_whole;
      const ParamVector hu = layered.hvp(u, [&](const BatchTerms& t) {
        gu_layered.push_back(dot(*t.gradient, u) + dot(*t.hvp, u));
      });
      const ParamVector want = whole.hvp(u, [&](const BatchTerms& t) {
        gu_whole.push_back(dot(*t.gradient, u) + dot(*t.hvp, u));
      });
      CHECK(relative_error(hu, want) <= 1e-12);
      REQUIRE(gu_layered.size() == probe.size());
      for (size_t b = 0; b < probe.size(); ++b) {
        CHECK(std::abs(gu_layered[b] - gu_whole[b]) <= 1e-11 * std::abs(gu_whole[b]));
      }
      // A direction on the last layers only, read on the first parameters: the tangents start
      // part-way up and the products run down to the embedding.
      const size_t n = u.size();
      std::vector<size_t> support, targets;
      for (size_t i = n / 2; i < n; ++i) support.push_back(i);
      for (size_t i = 0; i < n / 2 + 2; ++i) targets.push_back(i);
      const ParamVector part = layered.hvp(u, support, targets);
      const ParamVector part_want = whole.hvp(u, support, targets);
      CHECK(relative_error(part, part_want) <= 1e-12);
      for (size_t i = n / 2 + 2; i < n; ++i) CHECK(part[i].abs().max().item<double>() == 0.0);
    }
    // Finite differences difference the layer-wise gradients.
    EngineOptions fd;
    fd.hvp_method = HvpMethod::kFiniteDifference;
    EngineOptions fd_layered = fd;
    fd_layered.recompute_layers = true;
    CurvatureEngine fd_whole(*model, probe, fd), fd_by_layer(*model, probe, fd_layered);
    CHECK(relative_error(fd_by_layer.hvp(u), fd_whole.hvp(u)) <= 1e-9);
  }
}

TEST_CASE("layer-wise recomputation in float32 and bfloat16 stays within their rounding",
          "[engine][layers]") {
  auto reference = make_model(llama_config(false), ModelInit{7, at::kDouble});
  const ProbeSet probe = gpt_probe(4, 6, 3, 11, 5);
  const ParamVector u = random_direction(*reference, 11);
  CurvatureEngine exact(*reference, probe);
  const ParamVector want = exact.hvp(u);
  for (const auto& [dtype, tol] : {std::pair{at::kFloat, 1e-5}, std::pair{at::kBFloat16, 5e-2}}) {
    INFO(dtype_name(dtype));
    auto model = make_model(llama_config(false), ModelInit{7, dtype});
    EngineOptions options;
    options.recompute_layers = true;
    CurvatureEngine whole(*model, probe), layered(*model, probe, options);
    const ParamVector got = layered.hvp(u);
    CHECK(got.front().scalar_type() == default_vector_dtype(dtype));
    // As close to float64 as the whole graph's product in the same dtype.
    CHECK(relative_error(got, want) <= tol);
    CHECK(relative_error(got, whole.hvp(u)) <= tol);
  }
}

TEST_CASE("hvp_into writes the product into views of a caller's flat vector", "[engine][layers]") {
  auto model = make_model(llama_config(true), ModelInit{7, at::kDouble});
  const ProbeSet probe = gpt_probe(4, 7, 3, 11, 5);
  const ParamVector u = random_direction(*model, 11);
  CurvatureEngine reference(*model, probe);
  const ParamVector want = reference.hvp(u);
  const size_t n = u.size();
  std::vector<size_t> support, targets;
  for (size_t i = n / 2; i < n; ++i) support.push_back(i);
  for (size_t i = 0; i < n / 2 + 2; ++i) targets.push_back(i);
  const ParamVector part_want = reference.hvp(u, support, targets);
  for (const bool by_layer : {false, true}) {
    for (const int64_t micro_batch : {int64_t{0}, int64_t{2}}) {
      INFO((by_layer ? "layer-wise" : "whole graph") << ", micro_batch " << micro_batch);
      EngineOptions options;
      options.recompute_layers = by_layer;
      options.micro_batch = micro_batch;
      CurvatureEngine engine(*model, probe, options);
      // One float64 buffer holding every parameter's product, pre-filled with garbage.
      const at::Tensor flat = at::full({engine.space().numel()}, 7.0, at::kDouble);
      ParamVector views(n);
      int64_t offset = 0;
      for (size_t i = 0; i < n; ++i) {
        views[i] = flat.narrow(0, offset, engine.space()[i].numel).view(engine.space()[i].shape);
        offset += engine.space()[i].numel;
      }
      engine.hvp_into(u, views);
      CHECK(relative_error(views, want) <= 1e-12);
      CHECK(flat.data_ptr() == views.front().data_ptr());
      // On targets only: the others are neither read nor written.
      ParamVector part(n);
      for (size_t i : targets) part[i] = at::full(engine.space()[i].shape, 7.0, at::kDouble);
      engine.hvp_into(u, support, targets, part);
      for (size_t i : targets) {
        CHECK(relative_error({part[i]}, {part_want[i]}) <= 1e-12);
      }
    }
  }
  // A float32 destination of a bfloat16 model (the default vector dtype of 16-bit models) gets
  // the product hvp() returns, within bfloat16's rounding of the passes.
  auto bf16 = make_model(llama_config(true), ModelInit{7, at::kBFloat16});
  EngineOptions layered;
  layered.recompute_layers = true;
  CurvatureEngine engine(*bf16, probe, layered);
  ParamVector out(n);
  for (size_t i = 0; i < n; ++i) out[i] = at::empty(engine.space()[i].shape, at::kFloat);
  engine.hvp_into(u, out);
  CHECK(relative_error(out, engine.hvp(u)) <= 1e-2);
  CHECK(relative_error(out, want) <= 5e-2);
  // A destination of the wrong shape is named.
  ParamVector wrong = out;
  wrong[1] = at::empty({3}, at::kFloat);
  CURV_CHECK_THROWS(engine.hvp_into(u, wrong), InvalidArgument,
                    Catch::Matchers::Contains(engine.space()[1].name));
}

TEST_CASE("layer-wise recomputation refuses a model not computed in stages", "[engine][layers]") {
  auto model = make_model(tiny_mlp_config(), ModelInit{3, at::kDouble});
  EngineOptions options;
  options.recompute_layers = true;
  CHECK(model->loss_stages() == 0);
  CHECK_THROWS_WITH(CurvatureEngine(*model, mlp_probe(1, 4, 2), options),
                    Catch::Contains("EngineOptions.recompute_layers") &&
                        Catch::Contains("not computed in layer stages"));
}

TEST_CASE("ndsprobe --recompute-layers: one layer's graph in the plan, the whole graph's numbers",
          "[ndsprobe][memory_plan][layers]") {
  TempDir dir;
  const std::string run = dir.file("llama"), data = dir.file("probe.safetensors");
  const ModelConfig config = llama_config(false);
  auto model = make_model(config, ModelInit{3, at::kDouble});
  const ProbeSet probe = gpt_probe(5, 6, 6, 11, 8);
  write_safetensors(data, {{"inputs", probe[0].inputs}, {"targets", probe[0].targets}});
  for (int64_t step = 0; step <= 1; ++step) {
    save_checkpoint(run, step, model->space(), snapshot_parameters(*model), {},
                    R"({"model": )" + config.to_json() + "}");
    ParamVector next = snapshot_parameters(*model);
    axpy(1e-2, random_direction(*model, 40 + static_cast<uint64_t>(step)), next);
    load_parameters(*model, next);
  }
  const std::string base = run + " --data " + data +
                           " --steps 0:0 --directions delta,gradient --dtype float64 "
                           "--micro-batch 3 --spectrum --eig-top 1 --krylov-basis none --quiet";
  int rc = -1;
  const std::string plan = run_tool("ndsprobe", base + " --recompute-layers --plan", &rc);
  INFO(plan);
  CHECK(rc == 0);
  CHECK_THAT(plan, Catch::Matchers::Contains("layer-wise pass") &&
                       Catch::Matchers::Contains("a layer's graph of 24 tokens") &&
                       Catch::Matchers::Contains("between the 5 stages"));
  // The spectrum's products are added into the solver's vectors as each stage's share appears.
  CHECK_THAT(plan, !Catch::Matchers::Contains("  product ") &&
                       !Catch::Matchers::Contains("kept graphs") &&
                       !Catch::Matchers::Contains("recomputed graph"));
  // The spectrum runs without the cached gradient.
  CHECK_THAT(plan, Catch::Matchers::Matches("(.|\n)*\n  gradient [^\n]*\\[audit\\]\n(.|\n)*"));
  for (const std::string mode : {"--recompute-layers", "--recompute-graphs"}) {
    run_tool("ndsprobe", base + " " + mode + " -o " + dir.file(mode.substr(2) + ".h5"), &rc);
    CHECK(rc == 0);
  }
  const H5Reader layered(dir.file("recompute-layers.h5")), whole(dir.file("recompute-graphs.h5"));
  for (const char* unit : {"/runs/llama/step_0/delta", "/runs/llama/step_0/gradient"}) {
    INFO(unit);
    const double want = whole.attribute_double(unit, "nds");
    CHECK(std::abs(layered.attribute_double(unit, "nds") - want) <= 1e-11 * std::abs(want));
  }
  // A model not computed in stages: one line naming the flag, from the plan and from the run.
  const std::string mlp = dir.file("mlp"), mlp_data = dir.file("mlp.safetensors");
  auto small = make_model(tiny_mlp_config(), ModelInit{1, at::kFloat});
  const ProbeSet mlp_batches = mlp_probe(2, 4, 4);
  write_safetensors(mlp_data,
                    {{"inputs", mlp_batches[0].inputs}, {"targets", mlp_batches[0].targets}});
  save_checkpoint(mlp, 0, small->space(), snapshot_parameters(*small), {},
                  R"({"model": )" + tiny_mlp_config().to_json() + "}");
  for (const char* plan_only : {" --plan", ""}) {
    INFO(plan_only);
    const std::string refused =
        run_tool("ndsprobe",
                 mlp + " --data " + mlp_data + " --directions gradient --recompute-layers -o " +
                     dir.file("mlp.h5") + plan_only,
                 &rc);
    CHECK(rc != 0);
    CHECK_THAT(refused, Catch::Matchers::Contains("--recompute-layers: mlp(") &&
                            Catch::Matchers::Contains("is not computed in layer stages"));
    CHECK_FALSE(fs::exists(dir.file("mlp.h5")));
  }
}
