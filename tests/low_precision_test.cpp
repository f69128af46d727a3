// Models in bfloat16 and float16: the engine's vectors in their declared dtype, every sum in
// float64, and the audit's numbers against float64 arithmetic on the same (16-bit) weights.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <string>

#include "curv/analysis/spectrum.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/linear_operator.h"
#include "curv/core/runtime.h"
#include "curv/models/model_loader.h"
#include "fixtures.h"

using namespace curv;
using namespace curv_test;

namespace {

ModelConfig small_config(const std::string& arch) {
  if (arch == "gpt") {
    return ModelConfig::from_json(
        R"({"arch": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 32,
            "block_size": 16})");
  }
  return ModelConfig::from_json(
      R"({"arch": "llama", "vocab_size": 32, "hidden_size": 32, "intermediate_size": 64,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 16})");
}

struct Audit {
  double loss = 0.0, gu = 0.0, uhu = 0.0, nds = 0.0;
};

Audit audit(CurvatureEngine& engine, const ParamVector& u) {
  const ParamVector& g = engine.gradient();
  const ParamVector hu = engine.hvp(u);
  const double uu = dot(u, u);
  return {engine.loss(), dot(g, u), dot(u, hu), dot(u, hu) / uu};
}

double relative(double value, double reference) {
  return std::abs(value - reference) / std::abs(reference);
}

}  // namespace

TEST_CASE("parameter-space vectors take the declared dtype; 16-bit models default to float32",
          "[low_precision]") {
  CHECK(default_vector_dtype(at::kDouble) == at::kDouble);
  CHECK(default_vector_dtype(at::kFloat) == at::kFloat);
  CHECK(default_vector_dtype(at::kBFloat16) == at::kFloat);
  CHECK(default_vector_dtype(at::kHalf) == at::kFloat);
  CHECK(parse_vector_dtype("auto", at::kBFloat16, "--vector-dtype") == at::kFloat);
  CHECK(parse_vector_dtype("bfloat16", at::kBFloat16, "--vector-dtype") == at::kBFloat16);
  CHECK_THROWS_WITH(parse_vector_dtype("fp8", at::kFloat, "--vector-dtype"),
                    Catch::Matchers::Contains("--vector-dtype 'fp8'"));
  CHECK(parse_dtype("bfloat16") == at::kBFloat16);
  CHECK(parse_dtype("float16") == at::kHalf);
  CHECK_THROWS_WITH(parse_dtype("half"), Catch::Matchers::Contains("dtype 'half'"));
  // a − b of two bfloat16 tensors in float32 is exact where bfloat16's own difference rounds.
  const at::Tensor a = at::full({1}, 1.0, at::kBFloat16),
                   b = at::full({1}, 1.0 / 512, at::kBFloat16);
  CHECK(sub({a}, {b}, at::kFloat)[0].item<double>() == 1.0 - 1.0 / 512);
  CHECK(sub({a}, {b})[0].item<double>() == 1.0);
}

TEST_CASE("a 16-bit model's audit: float32 vectors, float64 sums, within its rounding of float64",
          "[low_precision]") {
  const bool half_runs = cpu_matrix_products(at::kHalf);
  for (const std::string arch : {"gpt", "llama"}) {
    for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
      INFO(arch << " " << dtype_name(dtype));
      const ModelConfig config = small_config(arch);
      auto low = make_model(config, ModelInit{5, dtype});
      // The reference: the same 16-bit weights, every operation in float64.
      auto wide = make_model(config, ModelInit{5, at::kDouble});
      load_parameters(*wide, converted(snapshot_parameters(*low), at::kDouble));
      const ProbeSet probe = gpt_probe(3, 8, 4, 32, 16);
      // Entries of 1e-3, an optimizer step's size: float16's tangents of such a direction fall
      // below its normal range unless the engine scales them (tangent_scale).
      const ParamVector u = scaled(random_direction(*wide, 11), 1e-3);
      if (dtype == at::kHalf && !half_runs) {
        CurvatureEngine engine(*low, probe);
        CHECK_THROWS_AS(engine.gradient(), ModelError);
        continue;
      }
      CurvatureEngine reference(*wide, probe);
      const Audit want = audit(reference, u);

      CurvatureEngine engine(*low, probe);
      CHECK(engine.parameter_dtype() == dtype);
      CHECK(engine.vector_dtype() == at::kFloat);
      CHECK(engine.gradient().front().scalar_type() == at::kFloat);
      CHECK(engine.hvp(u).front().scalar_type() == at::kFloat);
      const Audit got = audit(engine, u);
      CHECK(relative(got.loss, want.loss) < 1e-2);
      CHECK(relative(got.gu, want.gu) < 5e-2);
      CHECK(relative(got.nds, want.nds) < 5e-2);

      EngineOptions fd;
      fd.hvp_method = HvpMethod::kFiniteDifference;
      CurvatureEngine differences(*low, probe, fd);
      const Audit by_fd = audit(differences, u);
      CHECK(relative(by_fd.nds, want.nds) < 2e-1);

      // λ_max through float32 solver vectors, against float64's.
      HessianOperator h(engine), h64(reference);
      CHECK(h.dtype() == at::kFloat);
      CHECK(h64.dtype() == at::kDouble);
      EigenOptions eig;
      eig.tol = 1e-5;
      eig.max_hvps = 60;
      const double lmax = extreme_eigenpairs(h, eig).largest.at(0).value;
      const double lmax64 = extreme_eigenpairs(h64, eig).largest.at(0).value;
      CHECK(relative(lmax, lmax64) < 2e-2);
      // Hutch++ through 16-bit solver vectors (its QR in float32), on the same probes as float64.
      HessianOperator h16(engine, {}, dtype);
      TraceOptions trace;
      trace.matvecs = 12;
      const double t16 = estimate_trace(h16, trace).estimate;
      const double t64 = estimate_trace(h64, trace).estimate;
      CHECK(relative(t16, t64) < 5e-2);

      // Vectors kept in the model's own dtype when a program asks for it.
      EngineOptions own;
      own.vector_dtype = dtype;
      CurvatureEngine narrow(*low, probe, own);
      CHECK(narrow.hvp(u).front().scalar_type() == dtype);
      CHECK(relative(audit(narrow, u).nds, want.nds) < 5e-2);
    }
  }
}
