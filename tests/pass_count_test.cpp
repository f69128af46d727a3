// The passes ndsprobe's default audit makes, counted by the engine: the gradient with its kept
// graphs at a checkpoint whose direction is audited, the HVPs the coupling needs on those graphs,
// and one forward per batch for L(θ + u), evaluated at the next checkpoint's parameters where the
// delta lands. A checkpoint where nothing needs the gradient (a run's last) takes its loss from
// that forward and makes no pass of its own.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "curv/analysis/probe_run.h"
#include "curv/analysis/report.h"
#include "curv/core/engine.h"
#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/io/probe_data.h"
#include "curv/io/safetensors.h"
#include "curv/models/models.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using curv_test::TempDir;

namespace {

constexpr int64_t kBatches = 3;

// A two-checkpoint run of the tiny GPT (steps 0 and 10) and its probe file of 6 sequences.
struct TwoCheckpointRun {
  TempDir dir;
  std::string run = dir.file("run");
  std::string probe = dir.file("probe.safetensors");
  ParamVector last;  // θ at step 10

  TwoCheckpointRun() {
    auto model = make_model(curv_test::tiny_gpt_config(), ModelInit{3, at::kDouble});
    const std::string meta = R"({"model": )" + curv_test::tiny_gpt_config().to_json() + "}";
    const ParamVector first = model->parameters();
    save_checkpoint(run, 0, model->space(), first, {}, meta);
    last = curv_test::random_direction(*model, 5);
    for (size_t i = 0; i < last.size(); ++i) last[i] = first[i].detach() + 0.01 * last[i];
    save_checkpoint(run, 10, model->space(), last, {}, meta);
    const ProbeSet set = curv_test::gpt_probe(9, 2 * kBatches, 2 * kBatches);
    write_safetensors(probe, {{"inputs", set[0].inputs}, {"targets", set[0].targets}});
  }

  ProbeJob job(CouplingMode coupling) const {
    ProbeJob j;
    j.run.runs = {run};
    j.run.directions = {"delta"};
    j.run.taylor.coupling = coupling;
    j.model.init.dtype = at::kDouble;
    j.data.path = probe;
    j.data.options.batch_size = 2;
    j.output = dir.file(coupling == CouplingMode::kNone ? "none.h5" : "full.h5");
    j.provenance = make_provenance("pass_count_test", "", "float64", 0, 1);
    return j;
  }
};

}  // namespace

TEST_CASE("the delta audit makes the passes its numbers need and no more", "[ndsprobe][passes]") {
  TwoCheckpointRun fixture;
  auto model = make_model(curv_test::tiny_gpt_config(), ModelInit{3, at::kDouble});
  const size_t blocks =
      BlockOptions{}.partition(model->space(), model->structure()).blocks().size();
  REQUIRE(blocks > 1);

  // coupling none: one HVP of u; full coupling (the default): one per block, on the same graphs.
  for (const auto coupling : {CouplingMode::kNone, CouplingMode::kFull}) {
    const ProbeJob job = fixture.job(coupling);
    const EngineCounters c = run_probe_job(job).summary.counters;
    const int64_t hvps = coupling == CouplingMode::kNone ? 1 : static_cast<int64_t>(blocks);
    CAPTURE(c.brief());
    CHECK(c.gradients == 1);                       // step 0 only
    CHECK(c.backwards == kBatches);                // its one backward per batch, graphs kept
    CHECK(c.hvps == hvps);                         // on those kept graphs...
    CHECK(c.second_backwards == hvps * kBatches);  // ...with no forward or backward again
    CHECK(c.forwards == 2 * kBatches);             // the gradient's and L(θ + u)'s

    // The last checkpoint's loss is there, equal to a forward pass at its parameters and to the
    // engine's gradient-pass loss; its gradient norm is not, as nothing there used the gradient.
    H5Reader h5(job.output);
    CHECK(h5.has_attribute("/runs/run/step_0", "grad_norm"));
    CHECK_FALSE(h5.has_attribute("/runs/run/step_10", "grad_norm"));
    ProbeDataOptions data_options;
    data_options.batch_size = 2;
    CurvatureEngine engine(*model, load_probe_data(fixture.probe, data_options));
    engine.set_parameters(fixture.last);
    const double loss = h5.attribute_double("/runs/run/step_10", "loss");
    CHECK(loss == engine.forward_loss());  // no gradient pass yet: one forward per batch
    CHECK(std::abs(loss - engine.loss()) <= 1e-14 * std::abs(engine.loss()));
    CHECK(engine.forward_loss() == engine.loss());  // the cached value once the pass has run

    // The delta's realized change is the difference of the two checkpoints' recorded losses.
    const Table taylor = h5.table("/taylor");
    const double before = h5.attribute_double("/runs/run/step_0", "loss");
    bool found = false;
    for (size_t i = 0; i < taylor.num_rows(); ++i) {
      if (taylor.strings("block")[i] != "total") continue;
      found = true;
      CHECK(taylor.doubles("realized")[i] == loss - before);
    }
    CHECK(found);
  }
}
