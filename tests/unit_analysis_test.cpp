// A per-unit analysis added from this file alone: registered by name, switched on through
// ProbeRunOptions::analyses, called by the probe loop at every unit and checkpoint, and its
// declared table written below each unit beside the built-in analyses' output.
#include "curv/analysis/unit_analysis.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>

#include "curv/analysis/output_table.h"
#include "curv/analysis/probe_run.h"
#include "curv/analysis/report.h"
#include "curv/analysis/taylor.h"
#include "curv/core/engine.h"
#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/io/safetensors.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

// ‖u_l‖² of each block, the simplest per-unit breakdown there is.
struct BlockNorm {
  std::string block;
  double sq_norm = 0;
};

const TableLayout<BlockNorm>& block_norm_layout() {
  static const TableLayout<BlockNorm> layout = [] {
    TableLayout<BlockNorm> t("block_norms", "");
    t.column("block", "", "block name", [](const BlockNorm& b) {
       return b.block;
     }).column("sq_norm", "parameter²", "‖u_l‖²", [](const BlockNorm& b) { return b.sq_norm; });
    return t;
  }();
  return layout;
}

struct Calls {
  int runs = 0, checkpoints = 0, units = 0, ends = 0;
};

class BlockNormAnalysis : public UnitAnalysis {
 public:
  explicit BlockNormAnalysis(Calls* calls) : calls_(calls) {}
  std::string name() const override { return "block_norms"; }
  void begin_run(CurvatureEngine&, ProbeReport&) override { ++calls_->runs; }
  CheckpointWork begin_checkpoint(CheckpointContext&) override {
    ++calls_->checkpoints;
    return CheckpointWork::kNone;
  }
  void unit(UnitContext& c) override {
    ++calls_->units;
    REQUIRE(c.taylor != nullptr);  // the audit ran before, and created the unit's group
    std::vector<BlockNorm> rows;
    for (const Block& b : c.blocks.blocks()) {
      double sq = 0;
      for (size_t p : b.params) sq += c.u[p].to(at::kDouble).pow(2).sum().item<double>();
      rows.push_back({b.name, sq});
    }
    c.report.unit_group(c.run, c.step, c.direction).table(block_norm_layout(), rows);
  }
  bool end_run(ProbeReport&) override {
    ++calls_->ends;
    return false;
  }

 private:
  Calls* calls_;
};

}  // namespace

TEST_CASE("a unit analysis registered from a test file runs at every unit and writes its table",
          "[unit_analysis]") {
  TempDir dir;
  const std::string run = dir.file("run"), data = dir.file("probe.safetensors");
  const auto cfg = tiny_gpt_config();
  auto model = make_model(cfg, ModelInit{1, at::kDouble});
  const ProbeSet probe = gpt_probe(7, 12, 6);
  at::Tensor inputs = at::cat({probe[0].inputs, probe[1].inputs});
  at::Tensor targets = at::cat({probe[0].targets, probe[1].targets});
  write_safetensors(data, {{"inputs", inputs}, {"targets", targets}});
  for (int step = 0; step <= 2; ++step) {
    ParamVector theta = snapshot_parameters(*model);
    save_checkpoint(run, step, model->space(), theta, {}, R"({"model": )" + cfg.to_json() + "}");
    axpy(0.01, random_direction(*model, static_cast<uint64_t>(step)), theta);
    load_parameters(*model, theta);
  }

  Calls calls;
  register_unit_analysis(
      "block_norms",
      [&calls](const ProbeRunOptions&) { return std::make_unique<BlockNormAnalysis>(&calls); },
      "‖u_l‖² per block (test)");
  ProbeRunOptions options;
  options.runs = {run};
  options.directions = {"delta", "gradient"};
  options.analyses = {"block_norms"};
  ProbeRun probe_run(options);
  CHECK(probe_run.units() == 6);  // the analysis adds no per-checkpoint unit

  ProbeDataSource source;
  source.path = data;
  CurvatureEngine engine(*model, source.load());
  const BlockPartition blocks = BlockOptions{}.partition(model->space(), model->structure());
  Provenance provenance = make_provenance("unit analysis test", "", "float64", 0, 0);
  provenance.model = model->describe();
  const std::string out = dir.file("out.h5");
  {
    ProbeReport report(out, provenance, /*resume=*/false);
    probe_run.execute(engine, blocks, report);
  }
  CHECK(calls.runs == 1);
  CHECK(calls.checkpoints == 3);
  CHECK(calls.units == 5);  // the delta at the last checkpoint is unavailable
  CHECK(calls.ends == 1);

  H5Reader reader(out);
  for (const std::string unit : {"/runs/run/step_0/delta", "/runs/run/step_1/gradient"}) {
    INFO(unit);
    const Table norms = reader.table(unit + "/block_norms");
    CHECK(norms.names() == block_norm_layout().spec().column_names());
    CHECK(norms.strings("block") == blocks.names());
    const Table taylor_blocks = reader.table(unit + "/blocks");
    for (size_t l = 0; l < blocks.size(); ++l) {
      CHECK(norms.doubles("sq_norm")[l] ==
            Approx(taylor_blocks.doubles("sq_norm")[l]).epsilon(1e-12));
    }
  }
  CHECK_FALSE(reader.exists("/runs/run/step_2/delta/block_norms"));

  // Not named in the options: not run.
  options.analyses.clear();
  const int before = calls.units;
  ProbeRun without(options);
  ProbeReport other(dir.file("other.h5"), provenance, /*resume=*/false);
  without.execute(engine, blocks, other);
  CHECK(calls.units == before);

  options.analyses = {"no_such_analysis"};
  CHECK_THROWS_WITH(ProbeRun(options),
                    Catch::Contains("no_such_analysis") && Catch::Contains("block_norms"));
}

TEST_CASE("every declared output table is a layout its writer follows", "[unit_analysis][docs]") {
  for (const TableSpec& spec : output_table_specs()) {
    INFO(spec.name);
    const Table empty = spec.empty();
    CHECK(empty.names() == spec.column_names());
    CHECK_NOTHROW(spec.check(empty, spec.name));
    Table other = empty;
    other.add_column("extra_column", std::vector<double>{});
    CHECK_THROWS_WITH(spec.check(other, "resumed " + spec.name),
                      Catch::Contains("resumed " + spec.name) && Catch::Contains("extra_column"));
  }
}
