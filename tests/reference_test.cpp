// The demo's pipeline at test size (curvtrain with AdamW and Muon, then ndsprobe with the demo's
// directions and within-block flags) against reference numbers committed in tests/data, written
// by the release before the library was split into areas (restructuring changed no number) and
// extended with the standard errors and per-batch terms when they were added.
#include <catch2/catch.hpp>

#include "test_support.h"

using namespace curv_test;

TEST_CASE("the demo-sized probe gives the committed reference numbers", "[reference][ndsprobe]") {
  TempDir dir;
  // float64 on one thread: only BLAS rounding differs between machines, far below the check's
  // tolerance (relative 1e-9).
  const std::string common =
      " --zipf-s 1 --steps 20 --batch-size 8 --warmup 5 --save-every 20 --eval-every 10 "
      "--eval-sequences 8 --probe-sequences 16 --train-tokens 65536 --dtype float64 --threads 1";
  run_tool("curvtrain",
           "-o " + dir.file("adamw") + " --optimizer adamw:lr=1e-2,weight_decay=0" + common);
  run_tool("curvtrain",
           "-o " + dir.file("muon") + " --optimizer muon:lr=0.05,adam_lr=1e-2" + common);
  const std::string out = dir.file("probe.h5");
  run_tool("ndsprobe", dir.file("adamw") + " " + dir.file("muon") + " --data " +
                           dir.file("adamw/probe.safetensors") +
                           " --directions update,delta --within --modes 4 --batch-size 8 "
                           "--dtype float64 --threads 1 -o " +
                           out);
  run_python("demo_reference.py",
             {"check", out, std::string(CURV_SOURCE_DIR) + "/tests/data/demo_reference.json"});
}
