// Runs saved by DeepSpeed itself: the tiny LLaMA of the DCP tests trained on 2 CPU ranks under
// ZeRO stage 2 (bfloat16 mixed precision) and ZeRO stage 3 (float32), with torch's AdamW in two
// parameter groups (tests/python/make_deepspeed_runs.py, made once per build). ndsprobe reads
// global_step<N>/ as saved: the fp32 master weights and the AdamW state, joined from the ranks'
// flat partitions, equal DeepSpeed's own gathered values in transformers' float64 model.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "curv/io/checkpoint.h"
#include "curv/io/checkpoint_layout.h"
#include "curv/io/h5_file.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;
using Catch::Matchers::Contains;

TEST_CASE("DeepSpeed ZeRO 2 and 3 saves equal DeepSpeed's gathered state in float64",
          "[deepspeed][transformers][ndsprobe]") {
  const std::string root = torchrun_fixture("make_deepspeed_runs.py", "DS_ACCELERATOR=cpu");
  const nlohmann::json all = read_json(root + "/reference.json");
  INFO("deepspeed " << all["deepspeed"].get<std::string>());
  const std::string run = GENERATE("zero2", "zero3");
  INFO(run);
  const nlohmann::json& ref = all[run];
  CHECK(detect_checkpoint_layout(root + "/" + run).name() == "deepspeed");
  {
    INFO("the fp32 master weights are audited, and the checkpoint says so");
    const Checkpoint ckpt = load_checkpoint(list_checkpoints(root + "/" + run).front());
    CHECK_THAT(ckpt.model_file, Contains("fp32 master weights"));
    CHECK(ckpt.model.front().second.scalar_type() == at::kFloat);
  }
  TempDir out;
  audit_in_float64(root + "/" + run, root + "/probe.safetensors", out.file("probe.h5"));
  H5Reader reader(out.file("probe.h5"));
  const Table taylor = reader.table("/taylor");
  {
    INFO("delta at step 2: the fp32 master weights of global_step4 minus global_step2");
    check_audit(taylor, taylor_row(taylor, 2, "delta"), ref["delta"]);
  }
  {
    INFO("adamw at step 2: torch.optim.AdamW's step from the partitioned state, two groups");
    check_audit(taylor, taylor_row(taylor, 2, "adamw"), ref["adamw"]);
    CHECK(reader.attribute_string(fmt::format("/runs/{}/step_2/adamw", run), "optimizer_rule") ==
          "adamw");
  }
}
