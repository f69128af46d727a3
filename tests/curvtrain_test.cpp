// curvtrain end to end: determinism, exact resume, checkpoints ndsprobe can rebuild steps from.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>

#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/models/models.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

std::string curvtrain(const std::string& args) {
  return run_tool("curvtrain", args + " --threads 2");
}

ParamVector final_params(const std::string& dir) {
  auto listing = list_checkpoints(dir);
  Checkpoint ckpt = load_checkpoint(listing.back());
  ParamVector out;
  for (const auto& [name, t] : ckpt.model) out.push_back(t);
  return out;
}

bool equal(const ParamVector& a, const ParamVector& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

const char* kSmall =
    " --steps 12 --batch-size 4 --save-every 4 --eval-every 4 --train-tokens 20000"
    " --eval-sequences 8 --probe-sequences 8";

}  // namespace

TEST_CASE("curvtrain is deterministic and resumes exactly", "[curvtrain]") {
  TempDir dir;
  for (const std::string opt : {"adamw:lr=1e-2", "muon:lr=0.05,adam_lr=1e-2"}) {
    const std::string a = dir.file("a_" + opt.substr(0, 4)), b = dir.file("b_" + opt.substr(0, 4)),
                      c = dir.file("c_" + opt.substr(0, 4));
    curvtrain("-o " + a + " --optimizer " + opt + kSmall);
    curvtrain("-o " + b + " --optimizer " + opt + kSmall);
    CHECK(equal(final_params(a), final_params(b)));
    // Interrupted after step 6 (between saves), resumed to the end: bit for bit the same run.
    curvtrain("-o " + c + " --optimizer " + opt + kSmall + " --stop-at 6");
    CHECK(list_checkpoints(c).back().step == 6);
    curvtrain("-o " + c + " --optimizer " + opt + kSmall + " --resume");
    INFO(opt);
    CHECK(list_checkpoints(c).back().step == 12);
    CHECK(equal(final_params(a), final_params(c)));
  }
}

TEST_CASE(
    "the in-training probe audits the applied update: on the probe set it equals ndsprobe's "
    "delta between the saved checkpoints",
    "[curvtrain]") {
  TempDir dir;
  const std::string run = dir.file("run"), live = dir.file("live.h5"),
                    offline = dir.file("offline.h5");
  curvtrain("-o " + run +
            " --optimizer muon:lr=0.05,adam_lr=1e-2 --dtype float64 --steps 4 "
            "--batch-size 4 --save-every 1 --eval-every 2 --train-tokens 20000 --eval-sequences 8 "
            "--probe-sequences 8 --probe-every 2 --probe-on both --probe-output " +
            live);
  run_tool("ndsprobe", run + " --data " + run +
                           "/probe.safetensors --directions delta --dtype float64 -o " + offline);
  const Table a = H5Reader(live).table("/taylor"), b = H5Reader(offline).table("/taylor");
  int matched = 0, on_batch = 0;
  for (size_t i = 0; i < a.num_rows(); ++i) {
    if (a.strings("block")[i] != "total") continue;
    if (a.strings("direction")[i] == "update") {
      ++on_batch;
      CHECK(std::isfinite(a.doubles("nds")[i]));
      CHECK(std::isfinite(a.doubles("realized")[i]));
      continue;
    }
    REQUIRE(a.strings("direction")[i] == "update.probe");
    for (size_t j = 0; j < b.num_rows(); ++j) {
      if (b.strings("block")[j] != "total" || b.int64s("step")[j] != a.int64s("step")[i]) continue;
      INFO("step " << a.int64s("step")[i]);
      for (const char* column :
           {"loss", "first_order", "curvature", "nds", "realized", "update_norm"}) {
        INFO(column);
        CHECK(a.doubles(column)[i] == Approx(b.doubles(column)[j]).epsilon(1e-9).margin(1e-14));
      }
      ++matched;
    }
  }
  CHECK(on_batch == 2);  // updates 0 and 2
  CHECK(matched == 2);
  // Each unit records the precision it was measured at.
  H5Reader r(live);
  for (const auto& name : r.children("/runs")) {
    for (const std::string direction : {"update", "update.probe"}) {
      const std::string unit = "/runs/" + name + "/step_2/" + direction;
      INFO(unit);
      CHECK(r.attribute_string(unit, "dtype") == "float64");
      CHECK(r.attribute_string(unit, "vector_dtype") == "float64");
      CHECK(r.attribute_string(unit, "hvp_method") == "exact");
    }
  }
}

TEST_CASE("curvtrain rejects an optimizer key the optimizer does not read", "[curvtrain]") {
  TempDir dir;
  int status = 0;
  const std::string output =
      run_tool("curvtrain", "--optimizer adamw:momentum=0.9 -o " + dir.file("run"), &status);
  CHECK(status != 0);
  CHECK_THAT(output, Catch::Matchers::Contains("momentum") && Catch::Matchers::Contains("adamw"));
  CHECK_FALSE(std::ifstream(dir.file("run/step_0/model.safetensors")).good());
}

TEST_CASE("curvtrain writes the training stream's token counts and ndsprobe buckets tokens by them",
          "[curvtrain]") {
  TempDir dir;
  const std::string run = dir.file("run"), out = dir.file("buckets.h5");
  curvtrain("-o " + run + " --optimizer adamw:lr=1e-2" + kSmall);
  const nlohmann::json counts = read_json(run + "/token_counts.json");
  const auto meta = read_json(run + "/step_0/meta.json");
  REQUIRE(counts.at("counts").size() == meta.at("model").at("vocab_size").get<size_t>());
  int64_t total = 0;
  for (const auto& c : counts.at("counts")) total += c.get<int64_t>();
  // --train-tokens: whole sentences, at least 20000 tokens; a sentence is far shorter than 100.
  CHECK(total >= 20000);
  CHECK(total < 20100);
  CHECK(counts.at("data") == meta.at("data"));
  run_tool("ndsprobe", run + " --data " + run + "/probe.safetensors --directions update" +
                           " --token-buckets head --token-counts " + run +
                           "/token_counts.json --steps 4:4 -o " + out);
  const Table buckets = H5Reader(out).table("/token_buckets");
  REQUIRE(buckets.num_rows() > 0);
  int head = 0;
  for (size_t i = 0; i < buckets.num_rows(); ++i) head += buckets.strings("bucket")[i] == "head";
  CHECK(head > 0);
}
