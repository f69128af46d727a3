// Objectives with known answers and tiny models shared by the test files.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <Eigen/Core>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "curv/core/objective.h"
#include "curv/core/probe_set.h"
#include "curv/io/h5_file.h"
#include "curv/models/models.h"

namespace curv_test {

// L(θ) = ½ θᵀAθ + bᵀθ over two parameter tensors (a 2x3 matrix and a vector of 4): the Hessian
// is exactly A whatever the batch, so every second-order quantity has a closed form.
class QuadraticObjective : public curv::Objective {
 public:
  explicit QuadraticObjective(uint64_t seed, at::ScalarType dtype = at::kDouble);
  const curv::ParamSpace& space() const override { return space_; }
  curv::ParamVector parameters() override { return params_; }
  at::Tensor loss(const curv::Batch& batch) override;
  std::string describe() const override { return "quadratic"; }
  const at::Tensor& hessian() const { return a_; }  // 10 x 10, symmetric, indefinite
  const at::Tensor& linear() const { return b_; }

 private:
  curv::ParamVector params_;
  curv::ParamSpace space_;
  at::Tensor a_, b_;
};

// A probe set of `n` dummy examples split into batches of `batch_size` (for objectives that
// ignore the data).
curv::ProbeSet dummy_probe(int64_t n, int64_t batch_size);

curv::ModelConfig tiny_mlp_config();  // 3-5-3 tanh, cross-entropy: 38 parameters
curv::ModelConfig tiny_gpt_config();  // 1 layer, 2 heads, width 4, vocab 5, block 4: untied head
curv::ProbeSet mlp_probe(uint64_t seed, int64_t n, int64_t batch_size);
curv::ProbeSet gpt_probe(uint64_t seed, int64_t n, int64_t batch_size, int64_t vocab = 5,
                         int64_t t = 4);
// A seeded random direction in the objective's parameter space, in float64.
curv::ParamVector random_direction(curv::Objective& objective, uint64_t seed);
double relative_error(const curv::ParamVector& a, const curv::ParamVector& b);
// x as one flat float64 vector of length n.
Eigen::VectorXd flat(const curv::ParamVector& x, int64_t n);
// A dict saved by Python's torch.save (plain tensors, lists, strings), as torch::pickle_load reads
// it.
c10::impl::GenericDict load_pickled_dict(const std::string& path);
// The probe batch (x, y) that tests/python/make_script_fixture.py wrote to DIR/reference.pt.
curv::ProbeSet load_script_fixture_probe(const std::string& dir);

// A JSON file written by a Python fixture.
nlohmann::json read_json(const std::string& path);

// Audits the delta and the rebuilt AdamW step of the run directory `run` in float64 on the probe
// file `probe` (ndsprobe --dtype float64 --directions delta,adamw, plus `extra` flags) into `out`;
// fails the test with ndsprobe's output unless it succeeds.
void audit_in_float64(const std::string& run, const std::string& probe, const std::string& out,
                      const std::string& extra = "");

// The /taylor row of (step, direction, block); fails the test when there is none.
size_t taylor_row(const curv::Table& taylor, int64_t step, const std::string& direction,
                  const std::string& block = "total");
// Checks a /taylor row against a Python reference's audit ({"loss", "first_order", "curvature",
// "sq_norm", "realized"}, as tests/python/transformers_reference.py's audit writes it) to 1e-10:
// loss, g·u, uᵀHu, NDS, ‖u‖ and the realized change.
void check_audit(const curv::Table& taylor, size_t row, const nlohmann::json& want);
// Token rows [[t, ...], ...] of a Python fixture's JSON as an int64 tensor [rows, columns].
at::Tensor tokens_of(const nlohmann::json& rows);

// A model whose allocations fail from its `fail_from`-th loss call on (counting from 0), the way
// a device out of memory makes them fail: c10::OutOfMemoryError from the allocator.
class ExhaustingObjective : public curv::Objective {
 public:
  ExhaustingObjective(curv::Objective& model, int64_t fail_from)
      : model_(model), fail_from_(fail_from) {}
  const curv::ParamSpace& space() const override { return model_.space(); }
  curv::ParamVector parameters() override { return model_.parameters(); }
  curv::ModelStructure structure() const override { return model_.structure(); }
  std::string describe() const override { return model_.describe(); }
  at::Tensor loss(const curv::Batch& batch) override;
  int64_t calls() const { return calls_; }

 private:
  curv::Objective& model_;
  int64_t fail_from_;
  int64_t calls_ = 0;
};

}  // namespace curv_test
