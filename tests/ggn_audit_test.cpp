// The Gauss-Newton split inside the Taylor audit and ndsprobe: the engine's probe-set sum of the
// per-batch Gauss-Newton forms, their standard errors, the residual against the dense Hessian,
// and the error for a model without logits.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>

#include "curv/analysis/taylor.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/gauss_newton.h"
#include "curv/core/statistics.h"
#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/io/safetensors.h"
#include "curv/models/script_objective.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

TEST_CASE("the audit's Gauss-Newton split sums the per-batch forms and splits every block",
          "[ggn][taylor]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{4, at::kDouble});
  const ProbeSet probe = gpt_probe(3, 7, 3);  // batches of 3, 3 and 1 sequences
  const ParamVector u = scaled(random_direction(*model, 8), 1e-1);
  const auto blocks = BlockPartition::by_rule(model->space(), BlockRule::kLayer);
  CurvatureEngine engine(*model, probe);
  TaylorOptions options;
  options.ggn = true;
  options.ggn_blocks = true;
  const TaylorResult r = taylor_audit(engine, u, blocks, options);

  // Per batch, the same forms with the building block itself; weighted as the loss weighs them.
  std::vector<std::vector<size_t>> supports;
  for (const auto& b : blocks.blocks()) supports.push_back(b.params);
  std::vector<double> w, ggn_b, residual_b;
  double ggn = 0;
  Eigen::MatrixXd g_sum = Eigen::MatrixXd::Zero(blocks.size(), blocks.size());
  for (size_t b = 0; b < probe.size(); ++b) {
    const Eigen::MatrixXd g = gauss_newton_coupling(*model, probe[b], u, supports);
    w.push_back(probe.weight(b));
    ggn_b.push_back(g.sum());
    residual_b.push_back(r.batches.curvature[b] - g.sum());
    ggn += probe.weight(b) * g.sum();
    g_sum += probe.weight(b) * g;
  }
  const double u_sq = r.update_norm * r.update_norm;
  CHECK(r.ggn_curvature == Approx(ggn).epsilon(1e-12));
  CHECK(r.ggn_curvature >= 0);
  CHECK(r.ggn_nds == Approx(ggn / u_sq).epsilon(1e-12));
  CHECK(r.residual_curvature == Approx(r.curvature - ggn).epsilon(1e-12));
  CHECK(r.ggn_nds_stderr == Approx(batch_stderr(ggn_b, w) / u_sq).epsilon(1e-12));
  CHECK(r.residual_nds_stderr == Approx(batch_stderr(residual_b, w) / u_sq).epsilon(1e-12));
  double ggn_diagonal = 0;
  for (size_t l = 0; l < blocks.size(); ++l) {
    INFO("block " << blocks[l].name);
    const auto& b = r.blocks[l];
    CHECK(b.ggn_curvature == Approx(g_sum(l, l)).epsilon(1e-12));
    CHECK(b.ggn_curvature >= 0);
    CHECK(b.residual_curvature == Approx(b.curvature - b.ggn_curvature).epsilon(1e-12));
    ggn_diagonal += b.ggn_curvature;
  }
  // The blocks' G_ll are the diagonal of G's coupling: with the off-diagonal G_lm they give uᵀGu.
  CHECK(g_sum.sum() == Approx(r.ggn_curvature).epsilon(1e-12));
  CHECK(std::isfinite(ggn_diagonal));

  // Without --ggn-blocks: the totals from one JVP per batch, the same numbers.
  options.ggn_blocks = false;
  const TaylorResult totals_only = taylor_audit(engine, u, blocks, options);
  CHECK(totals_only.ggn_curvature == Approx(r.ggn_curvature).epsilon(1e-12));
  CHECK(std::isnan(totals_only.blocks.front().ggn_curvature));
  // Without --ggn nothing is computed.
  options.ggn = false;
  CHECK(std::isnan(taylor_audit(engine, u, blocks, options).ggn_nds));
}

TEST_CASE("ndsprobe --ggn writes the split and refuses a loss-mode TorchScript model",
          "[ggn][ndsprobe][script]") {
  TempDir dir;
  run_python("make_script_fixture.py", {dir.path(), "float64"});
  const ProbeSet probe = load_script_fixture_probe(dir.path());
  write_safetensors(dir.file("probe.safetensors"),
                    {{"inputs", probe[0].inputs}, {"targets", probe[0].targets}});
  for (const std::string mode : {"logits", "loss"}) {
    auto model = load_script_objective(dir.file("model_" + mode + ".pt"));
    const std::string run = dir.file("run_" + mode);
    for (int step : {0, 1}) {
      save_checkpoint(run, step, model->space(), snapshot_parameters(*model), {}, "{}");
    }
    int rc = 0;
    const std::string out = dir.file(mode + ".h5");
    const std::string text =
        run_tool("ndsprobe",
                 run + " --model " + dir.file("model_" + mode + ".pt") + " --data " +
                     dir.file("probe.safetensors") +
                     " --dtype float64 --directions gradient --ggn --batch-size 2 -o " + out,
                 &rc);
    if (mode == "logits") {
      CHECK(rc == 0);
      H5Reader reader(out);
      const double ggn = reader.attribute_double("/runs/run_logits/step_0/gradient", "ggn_nds");
      const double nds = reader.attribute_double("/runs/run_logits/step_0/gradient", "nds");
      const double residual =
          reader.attribute_double("/runs/run_logits/step_0/gradient", "residual_nds");
      CHECK(ggn >= 0);
      CHECK(ggn + residual == Approx(nds).epsilon(1e-12));
    } else {
      CHECK(rc == 1);
      CHECK_THAT(text, Catch::Matchers::Contains("--ggn") && Catch::Matchers::Contains("logits"));
      CHECK_FALSE(std::ifstream(out).good());
    }
  }
}
