#include "curv/io/checkpoint_layout.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <mutex>
#include <set>

#include "curv/analysis/probe_run.h"
#include "curv/analysis/report.h"
#include "curv/core/error.h"
#include "curv/io/h5_file.h"
#include "curv/io/safetensors.h"
#include "curv/models/models.h"
#include "test_support.h"

using namespace curv;
using Catch::Matchers::Contains;
using curv_test::TempDir;

namespace {

namespace fs = std::filesystem;

constexpr const char* kToyModel = R"({"arch": "mlp", "sizes": [4, 6, 3]})";

// A layout that exists only in this file: a run directory of snapshot-<N>.safetensors files, each
// holding the model's tensors, all of one built-in MLP. Registering it is all the readers need.
class ToyLayout : public CheckpointLayoutReader {
 public:
  std::string name() const override { return "toy"; }
  std::string brief() const override { return "snapshot-<N>.safetensors"; }
  bool holds(const std::string& path, const std::string& entry) const override {
    return entry.rfind("snapshot-", 0) == 0 && fs::path(entry).extension() == ".safetensors" &&
           fs::is_regular_file(path);
  }
  int64_t step(const std::string& path, const std::string& entry) const override {
    const std::string digits = fs::path(entry).stem().string().substr(9);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
      throw FormatError(path + ": no step in the name");
    }
    return std::stoll(digits);
  }
  Checkpoint load(const CheckpointInfo& info, CheckpointParts) const override {
    Checkpoint ckpt;
    ckpt.step = info.step;
    ckpt.path = info.path;
    ckpt.model_file = ckpt.meta_file = ckpt.model_config_file = info.path;
    ckpt.model = SafetensorsReader(info.path).tensors();
    ckpt.meta = parse_checkpoint_meta(std::string(R"({"model": )") + kToyModel + "}", info.path);
    return ckpt;
  }
};

void register_toy_layout() {
  static std::once_flag once;
  std::call_once(once, [] { register_checkpoint_layout(std::make_shared<ToyLayout>()); });
}

// A toy run: the MLP at `steps`, its parameters drawn from the step's seed.
void write_toy_run(const std::string& dir, const std::vector<int64_t>& steps) {
  for (int64_t step : steps) {
    ModelInit init;
    init.seed = static_cast<uint64_t>(step) + 1;
    init.dtype = at::kDouble;
    auto model = make_model(ModelConfig::from_json(kToyModel), init);
    NamedTensors tensors;
    for (size_t i = 0; i < model->space().size(); ++i) {
      tensors.emplace_back(model->space()[i].name, model->parameters()[i].detach());
    }
    write_safetensors(dir + "/snapshot-" + std::to_string(step) + ".safetensors", tensors);
  }
}

}  // namespace

TEST_CASE("a checkpoint layout registered from outside the library is detected, listed and loaded",
          "[checkpoint_layout][checkpoint]") {
  register_toy_layout();
  TempDir dir;
  write_toy_run(dir.path(), {20, 3, 10});

  const auto names = checkpoint_layout_names();
  CHECK(std::vector<std::string>(names.begin(), names.begin() + 4) ==
        std::vector<std::string>{"native", "nanogpt", "hf", "pt"});
  CHECK(names.back() == "toy");
  CHECK(parse_checkpoint_layout("toy") == CheckpointLayout("toy"));
  CURV_CHECK_THROWS(register_checkpoint_layout(std::make_shared<ToyLayout>()), InvalidArgument,
                    Contains("'toy' is already registered"));
  CURV_CHECK_THROWS(parse_checkpoint_layout("toys"), InvalidArgument,
                    Contains("expected auto, native, nanogpt, hf, pt, torchtitan, accelerate, "
                             "deepspeed, hf_revisions or toy"));

  CHECK(detect_checkpoint_layout(dir.path()) == CheckpointLayout("toy"));
  const auto listed = list_checkpoints(dir.path(), StepSelection::parse("5:"));
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].step == 10);
  CHECK(listed[1].step == 20);
  CHECK(layout_name(listed[0].layout) == "toy");

  const Checkpoint ckpt = load_checkpoint(listed[1]);
  ModelInit init;
  init.seed = 21;
  init.dtype = at::kDouble;
  auto model = make_model(ModelConfig::from_json(ckpt.model_config_json()), init);
  const ParamVector loaded = parameters_from(ckpt, model->space(), model->parameters());
  for (size_t i = 0; i < loaded.size(); ++i) CHECK(at::equal(loaded[i], model->parameters()[i]));

  // Another layout's checkpoint beside the toy's makes detection ambiguous; --layout chooses.
  write_safetensors(dir.file("step_7.pt"), {{"w", at::zeros({1})}});
  CURV_CHECK_THROWS(detect_checkpoint_layout(dir.path()), FormatError,
                    Contains("several layouts: pt (step_7.pt), toy (snapshot-10.safetensors)"));
  CHECK(list_checkpoints(dir.path(), {}, CheckpointLayout("toy")).size() == 3);
}

TEST_CASE("ndsprobe's run loop reads a registered layout's run", "[checkpoint_layout][ndsprobe]") {
  register_toy_layout();
  TempDir dir;
  const std::string run = dir.file("run");
  fs::create_directories(run);
  write_toy_run(run, {0, 1, 2});
  const at::Tensor inputs = at::randn({8, 4}, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor targets = at::arange(8, at::TensorOptions().dtype(at::kLong)) % 3;
  write_safetensors(dir.file("probe.safetensors"), {{"inputs", inputs}, {"targets", targets}});

  ProbeJob job;
  job.run.runs = {run};
  job.run.directions = {"delta"};
  job.model.init.dtype = at::kDouble;
  job.data.path = dir.file("probe.safetensors");
  job.data.options.batch_size = 4;
  job.output = dir.file("out.h5");
  job.provenance = make_provenance("checkpoint_layout_test", "", "float64", 0, 1);
  const ProbeJobResult result = run_probe_job(job);

  CHECK(result.summary.units == 3);
  const auto& steps = result.table("/taylor").int64s("step");
  // The delta at the last checkpoint has no next one: no rows for step 2.
  CHECK(std::set<int64_t>(steps.begin(), steps.end()) == std::set<int64_t>{0, 1});
  H5Reader h5(job.output);
  // The tables in memory are the file's, column for column.
  for (const auto& path : {std::string("/taylor"), unit_path("run", 1, "delta") + "/blocks",
                           unit_path("run", 0, "delta") + "/batches"}) {
    INFO(path);
    const Table& memory = result.table(path);
    const Table file = h5.table(path);
    REQUIRE(memory.names() == file.names());
    for (const auto& name : file.names()) {
      INFO(name);
      if (file.column(name).index() != 0) {
        CHECK(memory.column(name) == file.column(name));
        continue;
      }
      // Doubles: equal, or both NaN (the columns a unit leaves unmeasured).
      const auto &a = memory.doubles(name), &b = file.doubles(name);
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) CHECK((a[i] == b[i] || (a[i] != a[i] && b[i] != b[i])));
    }
  }
  CHECK(&result.unit_table("run", 1, "delta", "blocks") ==
        &result.table("/runs/run/step_1/delta/blocks"));
  CURV_CHECK_THROWS(result.table("/runs/run/step_2/delta/blocks"), InvalidArgument,
                    Catch::Matchers::Contains("no table /runs/run/step_2/delta/blocks"));
  CHECK(h5.attribute_string("/runs/run", "layout") == "toy");
}
