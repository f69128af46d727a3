// HVPs the eigen-solvers need on the reference GPT, and what PyHessian-style power iteration and
// Hutchinson return there. The reference eigenvalues come from a long Lanczos run (residual
// ≤ 1e-10·|λ|); every other run is judged against them. Prints a Markdown report on stdout.
//
//   spectrum_bench [--threads 1] [--dtype float64] [--seeds 3] [--reference-hvps 200]
//                  [--device cpu]   (cuda: the model, the probe batches and every solver vector
//                  on the GPU)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "curv/analysis/spectrum.h"
#include "curv/core/engine.h"
#include "curv/core/linear_operator.h"
#include "curv/core/runtime.h"
#include "reference_model.h"

namespace {

// First HVP count from which every later value stays within `tol` relative of `exact`; -1 if the
// last value is outside.
int64_t hvps_to(const std::vector<double>& history, double exact, double tol) {
  int64_t first = -1;
  for (size_t i = 0; i < history.size(); ++i) {
    const bool inside = std::abs(history[i] - exact) <= tol * std::abs(exact);
    if (inside && first < 0) first = static_cast<int64_t>(i) + 1;
    if (!inside) first = -1;
  }
  return first;
}

// The larger relative error of a result's largest and smallest eigenvalue against the reference.
double ends_error(const curv::EigenResult& r, double lmax, double lmin) {
  return std::max(std::abs(r.largest[0].value - lmax) / std::abs(lmax),
                  std::abs(r.smallest[0].value - lmin) / std::abs(lmin));
}

std::string count(int64_t n) { return n < 0 ? "not reached" : std::to_string(n); }

// The eigenvalue rows of one seed: Lanczos with each stopping rule, Spectra, power iteration
// with PyHessian's defaults and run long; errors against the reference ends.
void eigen_rows(curv::HessianOperator& h, int seed, double lmax, double lmin, double dominant) {
  // Lanczos for both ends at once, with each stopping rule.
  curv::EigenOptions lo;
  lo.top = 1;
  lo.bottom = 1;
  lo.tol = 1e-6;
  lo.max_hvps = 300;
  lo.seed = seed;
  for (auto bound : {curv::ErrorBound::kGap, curv::ErrorBound::kResidual}) {
    lo.bound = bound;
    const curv::EigenResult l = curv::extreme_eigenpairs(h, lo);
    const double l_err = ends_error(l, lmax, lmin);
    std::printf(
        "| %d | lanczos (both ends, tol 1e-6, %s bound) | %s | %s | %lld (+%lld residual "
        "checks) | %.10g, %.10g | %.2e | %.1f |\n",
        seed, curv::to_string(bound).c_str(), count(hvps_to(l.largest_history, lmax, 1e-6)).c_str(),
        count(hvps_to(l.smallest_history, lmin, 1e-6)).c_str(), static_cast<long long>(l.hvps),
        static_cast<long long>(l.residual_hvps), l.largest[0].value, l.smallest[0].value, l_err,
        l.seconds);
    std::fflush(stdout);
  }

  // The same without a basis: two vectors, no reorthogonalisation, the Ritz vectors (for the
  // measured residuals) from the recurrence run again.
  lo.bound = curv::ErrorBound::kGap;
  lo.basis = curv::KrylovBasis::kNone;
  const curv::EigenResult n = curv::extreme_eigenpairs(h, lo);
  std::printf(
      "| %d | lanczos without a basis (both ends, tol 1e-6, gap bound) | %s | %s | %lld (%lld "
      "steps, then the vectors; +%lld residual checks) | %.10g, %.10g | %.2e | %.1f |\n",
      seed, count(hvps_to(n.largest_history, lmax, 1e-6)).c_str(),
      count(hvps_to(n.smallest_history, lmin, 1e-6)).c_str(), static_cast<long long>(n.hvps),
      static_cast<long long>(n.iterations), static_cast<long long>(n.residual_hvps),
      n.largest[0].value, n.smallest[0].value, ends_error(n, lmax, lmin), n.seconds);
  std::fflush(stdout);
  lo.basis = curv::KrylovBasis::kDevice;

  // ARPACK-style restarted Lanczos (Spectra), one solve per end.
  curv::EigenOptions so = lo;
  so.method = curv::EigenMethod::kSpectra;
  so.check_residuals = false;
  const curv::EigenResult s = curv::extreme_eigenpairs(h, so);
  const double s_err = ends_error(s, lmax, lmin);
  std::printf(
      "| %d | spectra (restarted, ncv 20, tol 1e-6) | — | — | %lld (%s) | %.10g, %.10g | "
      "%.2e | %.1f |\n",
      seed, static_cast<long long>(s.hvps), s.converged() ? "converged" : "not converged",
      s.largest[0].value, s.smallest[0].value, s_err, s.seconds);

  // PyHessian's defaults: tol 1e-3 on the relative change, at most 100 iterations.
  curv::EigenOptions po;
  po.method = curv::EigenMethod::kPower;
  po.tol = 1e-3;
  po.max_hvps = 100;
  po.seed = seed;
  po.check_residuals = false;
  const curv::EigenResult p = curv::extreme_eigenpairs(h, po);
  std::printf(
      "| %d | power (PyHessian defaults: tol 1e-3, ≤ 100) | %s | — | %lld | %.10g | "
      "%.2e vs dominant %.6g | %.1f |\n",
      seed, count(hvps_to(p.largest_history, lmax, 1e-6)).c_str(), static_cast<long long>(p.hvps),
      p.dominant[0].value, std::abs(p.dominant[0].value - dominant) / std::abs(dominant), dominant,
      p.seconds);

  // Power iteration run long, to see how many HVPs 1e-6 takes at all.
  po.tol = 1e-12;
  po.max_hvps = 300;
  const curv::EigenResult pl = curv::extreme_eigenpairs(h, po);
  std::printf(
      "| %d | power (tol 1e-12, ≤ 300) | %s to the dominant %.6g | — | %lld | %.10g | "
      "%.2e vs dominant | %.1f |\n",
      seed, count(hvps_to(pl.largest_history, dominant, 1e-6)).c_str(), dominant,
      static_cast<long long>(pl.hvps), pl.dominant[0].value,
      std::abs(pl.dominant[0].value - dominant) / std::abs(dominant), pl.seconds);
  std::fflush(stdout);
}

// Hutchinson and Hutch++ at 99 HVPs, per seed.
void trace_table(curv::HessianOperator& h, int seeds) {
  std::printf(
      "\n| seed | trace method | matvecs | estimate | standard error | SE / |estimate| |\n"
      "|---|---|---|---|---|---|\n");
  for (int seed = 0; seed < seeds; ++seed) {
    for (auto method : {curv::TraceMethod::kHutchinson, curv::TraceMethod::kHutchPlusPlus}) {
      curv::TraceOptions to;
      to.method = method;
      to.matvecs = 99;
      to.seed = seed;
      const curv::TraceResult t = curv::estimate_trace(h, to);
      std::printf("| %d | %s | %lld | %.6g | %.3g | %.3g |\n", seed,
                  curv::to_string(method).c_str(), static_cast<long long>(t.matvecs), t.estimate,
                  t.standard_error, t.standard_error / std::abs(t.estimate));
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  curv::reexec_for_blas_kernels(argv);  // the kernels the tools run
  int threads = 1, seeds = 3;
  int64_t reference_hvps = 200;
  std::string dtype_name = "float64", device = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seeds"))
      seeds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dtype"))
      dtype_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--device"))
      device = argv[i + 1];
    else if (!std::strcmp(argv[i], "--reference-hvps"))
      reference_hvps = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  curv::init_runtime(curv::RuntimeOptions{threads});
  const auto dtype = dtype_name == "float64" ? at::kDouble : at::kFloat;
  const auto config = curv_bench::reference_config();
  auto model = curv::make_model(config, curv::ModelInit{0, dtype, device});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  curv::CurvatureEngine engine(
      *model, curv_bench::reference_probe(config, gen).to(dtype, c10::Device(device)));
  curv::HessianOperator h(engine);
  std::printf("%s; %s on %s, %lld parameters, %d thread(s)\n\n", curv::runtime_summary().c_str(),
              dtype_name.c_str(), device.c_str(), static_cast<long long>(h.rows()), threads);

  // Reference: both ends from one long Lanczos run.
  curv::EigenOptions ref_options;
  ref_options.top = 1;
  ref_options.bottom = 1;
  ref_options.tol = 1e-10;
  ref_options.bound = curv::ErrorBound::kResidual;  // the rigorous rule for the reference
  ref_options.max_hvps = reference_hvps;
  ref_options.seed = 1000;
  const curv::EigenResult ref = curv::extreme_eigenpairs(h, ref_options);
  const double lmax = ref.largest[0].value, lmin = ref.smallest[0].value;
  std::printf(
      "reference (Lanczos, residual bound, tol 1e-10, %lld HVPs, %s): λ_max = %.12g (residual "
      "%.2e), "
      "λ_min = %.12g (residual %.2e)\n\n",
      static_cast<long long>(ref.hvps), ref.converged() ? "converged" : "NOT converged", lmax,
      ref.largest[0].residual, lmin, ref.smallest[0].residual);
  std::fflush(stdout);
  const double dominant = std::abs(lmin) > std::abs(lmax) ? lmin : lmax;

  std::printf(
      "| seed | method | HVPs to λ_max ±1e-6 | HVPs to λ_min ±1e-6 | stopped after (HVPs) | "
      "returned | rel. error of returned vs its target | seconds "
      "|\n|---|---|---|---|---|---|---|---|\n");
  for (int seed = 0; seed < seeds; ++seed) eigen_rows(h, seed, lmax, lmin, dominant);
  trace_table(h, seeds);
  std::printf("\nengine: %s\n", engine.counters().brief().c_str());
  return 0;
}
