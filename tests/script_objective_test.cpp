#include "curv/models/script_objective.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

ParamVector tensor_list(const c10::Dict<c10::IValue, c10::IValue>& dict, const std::string& key) {
  ParamVector out;
  for (const auto& item : dict.at(key).toList()) out.push_back(item.get().toTensor());
  return out;
}

}  // namespace

TEST_CASE("TorchScript HVPs agree with Python torch.autograd over five successive calls",
          "[script]") {
  for (std::string dtype : {"float32", "float64"}) {
    TempDir dir;
    run_python("make_script_fixture.py", {dir.path(), dtype});
    auto ref = load_pickled_dict(dir.file("reference.pt"));
    ProbeSet probe = load_script_fixture_probe(dir.path());
    const double tol = dtype == "float64" ? kTolFloat64 : 1e-5;
    for (std::string file : {"model_loss.pt", "model_logits.pt"}) {
      auto model = load_script_objective(dir.file(file));
      std::vector<std::string> names;
      for (const auto& n : ref.at("names").toList()) names.push_back(n.get().toStringRef());
      CHECK(model->space().names() == names);
      CurvatureEngine engine(*model, probe);
      CHECK(engine.loss() == Approx(ref.at("loss").toTensor().item<double>()).epsilon(tol));
      for (int k = 0; k < 5; ++k) {
        ParamVector hv = engine.hvp(tensor_list(ref, "v" + std::to_string(k)));
        const double err = relative_error(hv, tensor_list(ref, "hv" + std::to_string(k)));
        INFO(dtype << " " << file << " call " << k << ": relative error " << err);
        CHECK(err <= tol);
      }
    }
  }
}

TEST_CASE("bad TorchScript files are clear errors", "[script]") {
  TempDir dir;
  CURV_CHECK_THROWS(load_script_objective(dir.file("missing.pt")), FormatError,
                    Catch::Matchers::Contains("missing.pt"));
  std::ofstream(dir.file("junk.pt")) << "this is not a zip archive";
  CURV_CHECK_THROWS(
      load_script_objective(dir.file("junk.pt")), FormatError,
      Catch::Matchers::Contains("junk.pt") && Catch::Matchers::Contains("TorchScript"));
}

TEST_CASE("a batch of the wrong shape for a TorchScript model is a ModelError", "[script]") {
  TempDir dir;
  run_python("make_script_fixture.py", {dir.path(), "float64"});
  auto model = load_script_objective(dir.file("model_loss.pt"));
  CurvatureEngine engine(
      *model, ProbeSet::split(at::randn({4, 9}, at::kDouble), at::zeros({4}, at::kLong), 4));
  CURV_CHECK_THROWS(engine.loss(), ModelError, Catch::Matchers::Contains("[4, 9]"));
}
