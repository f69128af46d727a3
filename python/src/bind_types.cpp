#include <pybind11/eigen.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "curv/analysis/spectrum.h"
#include "curv/analysis/taylor.h"
#include "curv/analysis/token_buckets.h"
#include "curv/analysis/within.h"
#include "curv/core/blocks.h"
#include "curv/core/engine.h"

namespace curv::python {

void bind_options(py::module_& m) {
  py::enum_<CouplingMode>(m, "Coupling")
      .value("FULL", CouplingMode::kFull)
      .value("RANDOMIZED", CouplingMode::kRandomized)
      .value("NONE", CouplingMode::kNone);
  py::enum_<HvpMethod>(m, "HvpMethod")
      .value("EXACT", HvpMethod::kExact)
      .value("FINITE_DIFFERENCE", HvpMethod::kFiniteDifference);
  py::enum_<BlockRule>(m, "BlockRule")
      .value("LAYER", BlockRule::kLayer)
      .value("COMPONENT", BlockRule::kComponent)
      .value("TENSOR", BlockRule::kTensor)
      .value("WHOLE", BlockRule::kWhole);
  py::enum_<EigenMethod>(m, "EigenMethod")
      .value("LANCZOS", EigenMethod::kLanczos)
      .value("SPECTRA", EigenMethod::kSpectra)
      .value("POWER", EigenMethod::kPower);
  py::enum_<ErrorBound>(m, "ErrorBound")
      .value("RESIDUAL", ErrorBound::kResidual)
      .value("GAP", ErrorBound::kGap);
  py::enum_<TraceMethod>(m, "TraceMethod")
      .value("HUTCHINSON", TraceMethod::kHutchinson)
      .value("HUTCHPP", TraceMethod::kHutchPlusPlus);
  py::enum_<TokenBucketOptions::Mode>(m, "BucketMode")
      .value("HEAD_TAIL", TokenBucketOptions::Mode::kHeadTail)
      .value("QUANTILES", TokenBucketOptions::Mode::kQuantiles);

  py::class_<TaylorOptions>(m, "TaylorOptions")
      .def(py::init<>())
      .def_readwrite("coupling", &TaylorOptions::coupling)
      .def_readwrite("coupling_samples", &TaylorOptions::coupling_samples)
      .def_readwrite("seed", &TaylorOptions::seed)
      .def_readwrite("realized", &TaylorOptions::realized)
      .def_readwrite("step_multipliers", &TaylorOptions::step_multipliers)
      .def_readwrite("ggn", &TaylorOptions::ggn)
      .def_readwrite("ggn_blocks", &TaylorOptions::ggn_blocks)
      .def("validate", &TaylorOptions::validate);
  py::class_<WithinOptions>(m, "WithinOptions")
      .def(py::init<>())
      .def_readwrite("param_regex", &WithinOptions::param_regex)
      .def_readwrite("modes", &WithinOptions::modes)
      .def_readwrite("n_head", &WithinOptions::n_head)
      .def_readwrite("n_kv_head", &WithinOptions::n_kv_head)
      .def_readwrite("row_chunks", &WithinOptions::row_chunks)
      .def_readwrite("max_hvps", &WithinOptions::max_hvps)
      .def_readwrite("top_k_energy", &WithinOptions::top_k_energy);
  py::class_<EigenOptions>(m, "EigenOptions")
      .def(py::init<>())
      .def_readwrite("top", &EigenOptions::top)
      .def_readwrite("bottom", &EigenOptions::bottom)
      .def_readwrite("tol", &EigenOptions::tol)
      .def_readwrite("bound", &EigenOptions::bound)
      .def_readwrite("max_hvps", &EigenOptions::max_hvps)
      .def_readwrite("method", &EigenOptions::method)
      .def_readwrite("seed", &EigenOptions::seed)
      .def_readwrite("check_residuals", &EigenOptions::check_residuals)
      .def_readwrite("keep_vectors", &EigenOptions::keep_vectors);
  py::class_<TraceOptions>(m, "TraceOptions")
      .def(py::init<>())
      .def_readwrite("method", &TraceOptions::method)
      .def_readwrite("matvecs", &TraceOptions::matvecs)
      .def_readwrite("seed", &TraceOptions::seed);
  py::class_<DensityOptions>(m, "DensityOptions")
      .def(py::init<>())
      .def_readwrite("runs", &DensityOptions::runs)
      .def_readwrite("steps", &DensityOptions::steps)
      .def_readwrite("sigma", &DensityOptions::sigma)
      .def_readwrite("grid", &DensityOptions::grid)
      .def_readwrite("seed", &DensityOptions::seed);
  py::class_<TokenBucketOptions>(m, "TokenBucketOptions")
      .def(py::init<>())
      .def_readwrite("mode", &TokenBucketOptions::mode)
      .def_readwrite("head_mass", &TokenBucketOptions::head_mass)
      .def_readwrite("quantiles", &TokenBucketOptions::quantiles)
      .def_readwrite("counts_path", &TokenBucketOptions::counts_path);
}

namespace {

void bind_taylor(py::module_& m) {
  py::class_<BlockTerms>(m, "BlockTerms")
      .def_readonly("name", &BlockTerms::name)
      .def_readonly("sq_norm", &BlockTerms::sq_norm)
      .def_readonly("first_order", &BlockTerms::first_order)
      .def_readonly("curvature", &BlockTerms::curvature)
      .def_readonly("row_sum", &BlockTerms::row_sum)
      .def_readonly("nds", &BlockTerms::nds)
      .def_readonly("first_order_stderr", &BlockTerms::first_order_stderr)
      .def_readonly("curvature_stderr", &BlockTerms::curvature_stderr)
      .def_readonly("row_sum_stderr", &BlockTerms::row_sum_stderr)
      .def_readonly("predicted_stderr", &BlockTerms::predicted_stderr)
      .def_readonly("nds_stderr", &BlockTerms::nds_stderr)
      .def_readonly("curvature_sign_stderr", &BlockTerms::curvature_sign_stderr)
      .def_readonly("ggn_curvature", &BlockTerms::ggn_curvature)
      .def_readonly("ggn_nds", &BlockTerms::ggn_nds)
      .def_readonly("residual_curvature", &BlockTerms::residual_curvature);
  py::class_<MultiplierTerms>(m, "MultiplierTerms")
      .def_readonly("eta", &MultiplierTerms::eta)
      .def_readonly("predicted", &MultiplierTerms::predicted)
      .def_readonly("realized", &MultiplierTerms::realized)
      .def_readonly("predicted_stderr", &MultiplierTerms::predicted_stderr)
      .def_readonly("realized_stderr", &MultiplierTerms::realized_stderr);
  py::class_<TaylorBatches>(m, "TaylorBatches")
      .def_readonly("weight", &TaylorBatches::weight)
      .def_readonly("loss", &TaylorBatches::loss)
      .def_readonly("first_order", &TaylorBatches::first_order)
      .def_readonly("curvature", &TaylorBatches::curvature)
      .def_readonly("realized", &TaylorBatches::realized)
      .def_readonly("within", &TaylorBatches::within);
  py::class_<TaylorResult> r(m, "TaylorResult");
  r.def_property_readonly("status", [](const TaylorResult& t) { return to_string(t.status); });
#define CURV_FIELD(f) r.def_readonly(#f, &TaylorResult::f)
  CURV_FIELD(loss);
  CURV_FIELD(first_order);
  CURV_FIELD(curvature);
  CURV_FIELD(predicted);
  CURV_FIELD(realized);
  CURV_FIELD(loss_after);
  CURV_FIELD(nds);
  CURV_FIELD(eta_star);
  CURV_FIELD(update_norm);
  CURV_FIELD(blocks);
  CURV_FIELD(coupling);
  CURV_FIELD(s_within);
  CURV_FIELD(s_cross);
  CURV_FIELD(rho_within);
  CURV_FIELD(multipliers);
  CURV_FIELD(coupling_mode);
  CURV_FIELD(hvps);
  CURV_FIELD(seconds);
  CURV_FIELD(loss_stderr);
  CURV_FIELD(first_order_stderr);
  CURV_FIELD(curvature_stderr);
  CURV_FIELD(predicted_stderr);
  CURV_FIELD(realized_stderr);
  CURV_FIELD(nds_stderr);
  CURV_FIELD(s_within_stderr);
  CURV_FIELD(s_cross_stderr);
  CURV_FIELD(rho_within_stderr);
  CURV_FIELD(eta_star_stderr);
  CURV_FIELD(ggn_curvature);
  CURV_FIELD(ggn_nds);
  CURV_FIELD(residual_curvature);
  CURV_FIELD(residual_nds);
  CURV_FIELD(ggn_nds_stderr);
  CURV_FIELD(residual_nds_stderr);
  CURV_FIELD(batches);
#undef CURV_FIELD
  r.def("brief", &TaylorResult::brief);
  py::class_<BucketResult>(m, "BucketResult")
      .def_readonly("name", &BucketResult::name)
      .def_readonly("share", &BucketResult::share)
      .def_readonly("taylor", &BucketResult::taylor);
}

void bind_within(py::module_& m) {
  py::class_<ModeTerms>(m, "ModeTerms")
      .def_readonly("index", &ModeTerms::index)
      .def_readonly("sigma", &ModeTerms::sigma)
      .def_readonly("energy_share", &ModeTerms::energy_share)
      .def_readonly("curvature", &ModeTerms::curvature);
  py::class_<GroupTerms>(m, "GroupTerms")
      .def_readonly("name", &GroupTerms::name)
      .def_readonly("sq_norm", &GroupTerms::sq_norm)
      .def_readonly("curvature", &GroupTerms::curvature)
      .def_readonly("nds", &GroupTerms::nds);
  py::class_<WithinParam>(m, "WithinParam")
      .def_readonly("name", &WithinParam::name)
      .def_readonly("shape", &WithinParam::shape)
      .def_readonly("sq_norm", &WithinParam::sq_norm)
      .def_readonly("singular_values", &WithinParam::singular_values)
      .def_readonly("svd_entropy", &WithinParam::svd_entropy)
      .def_readonly("effective_rank", &WithinParam::effective_rank)
      .def_readonly("top_k_energy", &WithinParam::top_k_energy)
      .def_readonly("modes", &WithinParam::modes)
      .def_readonly("groups", &WithinParam::groups);
  py::class_<WithinReport>(m, "WithinReport")
      .def_readonly("params", &WithinReport::params)
      .def_readonly("skipped", &WithinReport::skipped)
      .def_readonly("hvps", &WithinReport::hvps);
}

void bind_spectrum(py::module_& m) {
  py::class_<RitzPair>(m, "RitzPair")
      .def_readonly("value", &RitzPair::value)
      .def_readonly("residual", &RitzPair::residual)
      .def_readonly("error_bound", &RitzPair::error_bound)
      .def_readonly("vector", &RitzPair::vector);
  py::class_<EigenResult>(m, "EigenResult")
      .def_readonly("method", &EigenResult::method)
      .def_property_readonly("status", [](const EigenResult& e) { return to_string(e.status); })
      .def_readonly("message", &EigenResult::message)
      .def_readonly("largest", &EigenResult::largest)
      .def_readonly("smallest", &EigenResult::smallest)
      .def_readonly("dominant", &EigenResult::dominant)
      .def_readonly("residuals_measured", &EigenResult::residuals_measured)
      .def_readonly("hvps", &EigenResult::hvps)
      .def_readonly("iterations", &EigenResult::iterations)
      .def_readonly("seconds", &EigenResult::seconds)
      .def("brief", &EigenResult::brief);
  py::class_<TraceResult>(m, "TraceResult")
      .def_readonly("method", &TraceResult::method)
      .def_readonly("estimate", &TraceResult::estimate)
      .def_readonly("standard_error", &TraceResult::standard_error)
      .def_readonly("matvecs", &TraceResult::matvecs)
      .def_readonly("samples", &TraceResult::samples)
      .def_readonly("sketch_rank", &TraceResult::sketch_rank)
      .def_readonly("seconds", &TraceResult::seconds);
  py::class_<DensityResult>(m, "DensityResult")
      .def_readonly("runs", &DensityResult::runs)
      .def_readonly("steps", &DensityResult::steps)
      .def_readonly("sigma", &DensityResult::sigma)
      .def_readonly("grid", &DensityResult::grid)
      .def_readonly("density", &DensityResult::density)
      .def_readonly("nodes", &DensityResult::nodes)
      .def_readonly("weights", &DensityResult::weights)
      .def_readonly("trace", &DensityResult::trace)
      .def_readonly("trace_standard_error", &DensityResult::trace_standard_error)
      .def_readonly("hvps", &DensityResult::hvps)
      .def_readonly("seconds", &DensityResult::seconds);
}

}  // namespace

void bind_results(py::module_& m) {
  bind_taylor(m);
  bind_within(m);
  bind_spectrum(m);
}

}  // namespace curv::python
