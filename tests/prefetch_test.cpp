// Reading checkpoints ahead (ProbeRunOptions::prefetch): the next checkpoint read in the
// background while the current one computes, the delta's successor kept for its own turn. The
// results are the same bit for bit, every checkpoint is read once, and a file that fails to read
// in the background fails where its checkpoint is needed, with the units before it committed.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "curv/analysis/probe_run.h"
#include "curv/analysis/report.h"
#include "curv/core/error.h"
#include "curv/core/precision.h"
#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/io/safetensors.h"
#include "curv/models/models.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using curv_test::TempDir;

namespace {

// Three checkpoints of the tiny GPT (steps 0, 10, 20) and a probe file of 4 sequences.
struct ThreeCheckpointRun {
  TempDir dir;
  std::string run = dir.file("run");
  std::string probe = dir.file("probe.safetensors");

  ThreeCheckpointRun() {
    auto model = make_model(curv_test::tiny_gpt_config(), ModelInit{3, at::kDouble});
    const std::string meta = R"({"model": )" + curv_test::tiny_gpt_config().to_json() + "}";
    const ParamVector first = model->parameters();
    for (int64_t k = 0; k < 3; ++k) {
      const ParamVector step = curv_test::random_direction(*model, 7 + k);
      ParamVector theta;
      for (size_t i = 0; i < first.size(); ++i)
        theta.push_back(first[i].detach() + 0.01 * k * step[i]);
      save_checkpoint(run, 10 * k, model->space(), theta, {}, meta);
    }
    const ProbeSet set = curv_test::gpt_probe(9, 4, 4);
    write_safetensors(probe, {{"inputs", set[0].inputs}, {"targets", set[0].targets}});
  }

  ProbeJob job(bool prefetch, const std::string& name) const {
    ProbeJob j;
    j.run.runs = {run};
    j.run.directions = {"delta", "gradient"};
    j.run.prefetch = prefetch;
    j.model.init.dtype = at::kDouble;
    j.data.path = probe;
    j.data.options.batch_size = 2;
    j.output = dir.file(name);
    j.provenance = make_provenance("prefetch_test", "", "float64", 0, 1);
    return j;
  }
};

}  // namespace

TEST_CASE("reading checkpoints ahead gives the same file and reads each checkpoint once",
          "[ndsprobe][prefetch]") {
  ThreeCheckpointRun fixture;
  const ProbeJobResult ahead = run_probe_job(fixture.job(true, "ahead.h5"));
  const ProbeJobResult direct = run_probe_job(fixture.job(false, "direct.h5"));
  // Without reading ahead, each checkpoint's own load and the delta's read of its successor:
  // 3 + 2 reads at their turn. Ahead, every one of those loads is served by a read made before.
  CHECK(direct.summary.checkpoints_read_ahead == 0);
  CHECK(ahead.summary.checkpoints_read_ahead == 5);
  H5Reader a(ahead.output), d(direct.output);
  for (const std::string unit : {"step_0/delta", "step_10/delta", "step_0/gradient",
                                 "step_10/gradient", "step_20/gradient"}) {
    for (const std::string value : {"loss", "first_order", "curvature", "realized", "s_within"}) {
      INFO(unit << " " << value);
      CHECK(a.attribute_double("/runs/run/" + unit, value) ==
            d.attribute_double("/runs/run/" + unit, value));
    }
  }
  for (const std::string step : {"step_0", "step_10", "step_20"}) {
    CHECK(a.attribute_double("/runs/run/" + step, "loss") ==
          d.attribute_double("/runs/run/" + step, "loss"));
    CHECK(a.attribute_string("/runs/run/" + step, "checkpoint_digest") ==
          d.attribute_string("/runs/run/" + step, "checkpoint_digest"));
  }
}

TEST_CASE("a checkpoint that fails to read ahead fails at its turn, the units before committed",
          "[ndsprobe][prefetch]") {
  ThreeCheckpointRun fixture;
  const std::string broken = fixture.run + "/step_20/model.safetensors";
  std::ofstream(broken, std::ios::binary | std::ios::trunc) << "not a safetensors file";
  std::string ahead_error, direct_error;
  for (bool prefetch : {true, false}) {
    const ProbeJob job = fixture.job(prefetch, prefetch ? "ahead.h5" : "direct.h5");
    try {
      run_probe_job(job);
      FAIL("a broken checkpoint went unnoticed");
    } catch (const FormatError& e) {
      (prefetch ? ahead_error : direct_error) = e.what();
    }
    // Step 0's units were written before step 10's delta needed step 20.
    H5Reader h5(job.output);
    CHECK(h5.exists("/runs/run/step_0/delta"));
  }
  CHECK_THAT(ahead_error, Catch::Matchers::Contains(broken));
  CHECK(ahead_error == direct_error);
}

TEST_CASE("reduced matmul precision is recorded with the errors it brings on a probe batch",
          "[ndsprobe][precision]") {
  CHECK(parse_matmul_precision("high") == MatmulPrecision::kHigh);
  CHECK_THROWS_WITH(parse_matmul_precision("tf32"), Catch::Matchers::Contains("highest, high"));
  {
    const ScopedMatmulPrecision scope(MatmulPrecision::kMedium);
    CHECK(matmul_precision() == MatmulPrecision::kMedium);
  }
  CHECK(matmul_precision() == MatmulPrecision::kHighest);

  ThreeCheckpointRun fixture;
  ProbeJob job = fixture.job(true, "high.h5");
  job.run.matmul_precision = MatmulPrecision::kHigh;
  run_probe_job(job);
  CHECK(matmul_precision() == MatmulPrecision::kHighest);  // restored after the run
  H5Reader h5(job.output);
  CHECK(h5.attribute_string("/", "matmul_precision") == "high");
  CHECK(h5.attribute_string("/runs/run/step_0", "matmul_precision") == "high");
  for (const std::string what : {"loss", "gradient", "hvp", "curvature"}) {
    INFO(what);
    const double e = h5.attribute_double("/runs/run/step_0", "matmul_precision_" + what + "_error");
    // float64 parameters: TF32 never applies, the two precisions give the same numbers.
    CHECK(e == 0.0);
  }
  CHECK_FALSE(h5.has_attribute("/runs/run/step_10", "matmul_precision_hvp_error"));
}
