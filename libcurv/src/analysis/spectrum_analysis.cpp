// The spectrum options as a unit analysis: once per checkpoint the eigenpairs, trace, density
// and preconditioned sharpness of H (step_<N>/spectrum), and per unit the overlap of the
// direction with the top eigenspace.
#include <fmt/format.h>

#include <cmath>
#include <deque>

#include "analysis/builtin_analyses.h"
#include "analysis/output_tables.h"
#include "curv/analysis/report.h"
#include "curv/analysis/result_tables.h"
#include "curv/analysis/spectrum.h"
#include "curv/core/checkpoint_meta.h"
#include "curv/core/engine.h"
#include "curv/core/linear_operator.h"

namespace curv {

namespace {

void write_eigen(const ReportGroup& spectrum, CurvatureEngine& engine, const BlockPartition& blocks,
                 const CheckpointSpectrumOptions& o, const EigenOptions& options,
                 const EigenResult& global) {
  std::vector<EigenRow> rows;
  append_eigen_rows(rows, "total", global);
  std::vector<std::string> messages = {"total: " + global.message};
  std::deque<EigenResult> per_block;  // the rows point into it
  if (o.per_block) {
    for (const Block& b : blocks.blocks()) {
      HessianOperator hb(engine, b.params);
      EigenOptions bo = o.eigen;
      bo.keep_vectors = false;
      per_block.push_back(extreme_eigenpairs(hb, bo));
      append_eigen_rows(rows, b.name, per_block.back());
      messages.push_back(b.name + ": " + per_block.back().message);
    }
  }
  write_eigen_group(spectrum, eigen_layout().table(rows), options, messages);
}

void write_trace(const ReportGroup& spectrum, CurvatureEngine& engine, const BlockPartition& blocks,
                 const CheckpointSpectrumOptions& o) {
  std::deque<TraceResult> results;
  std::vector<TraceRow> rows;
  HessianOperator h(engine);
  results.push_back(estimate_trace(h, o.trace_options));
  rows.push_back({"total", &results.back()});
  if (o.per_block) {
    for (const Block& b : blocks.blocks()) {
      HessianOperator hb(engine, b.params);
      results.push_back(estimate_trace(hb, o.trace_options));
      rows.push_back({b.name, &results.back()});
    }
  }
  spectrum.table(trace_layout(), rows);
  const ReportGroup trace = spectrum.child(trace_layout().spec().name);
  trace.attribute("method", to_string(o.trace_options.method));
  trace.attribute("matvecs", o.trace_options.matvecs);
  trace.attribute("krylov_basis", to_string(o.trace_options.basis));
}

void write_density(const ReportGroup& spectrum, CurvatureEngine& engine,
                   const CheckpointSpectrumOptions& o) {
  HessianOperator h(engine);
  DensityResult d = spectral_density(h, o.density_options);
  const ReportGroup density = spectrum.child("density");
  const auto runs = static_cast<uint64_t>(d.runs), steps = static_cast<uint64_t>(d.steps);
  density.dataset("nodes", d.nodes, {runs, steps});
  density.dataset("weights", d.weights, {runs, steps});
  density.dataset("grid", d.grid);
  density.dataset("density", d.density);
  density.attribute("sigma", d.sigma);
  density.attribute("runs", d.runs);
  density.attribute("steps", d.steps);
  density.attribute("trace", d.trace);
  density.attribute("trace_standard_error", d.trace_standard_error);
  density.attribute("hvps", d.hvps);
  density.attribute("krylov_basis", to_string(o.density_options.basis));
}

void write_precond(const ReportGroup& spectrum, CurvatureEngine& engine,
                   const SavedOptimizer& saved, const CheckpointSpectrumOptions& o) {
  const ReportGroup precond = spectrum.child("precond");
  precond.clear();
  AdamPreconditioner p;
  const std::string why = adam_preconditioner(saved, engine.space(), &p);
  if (!why.empty()) {
    precond.attribute("status", to_string(PrecondStatus::kUnavailable));
    precond.attribute("message", why);
    return;
  }
  HessianOperator h(engine);
  ScaledOperator scaled(h, p.inverse_sqrt);
  EigenOptions options = o.eigen;
  options.top = 1;
  options.bottom = 0;
  options.keep_vectors = false;
  EigenResult r = extreme_eigenpairs(scaled, options);
  const auto& pair = options.method == EigenMethod::kPower ? r.dominant : r.largest;
  precond.attribute("status", to_string(r.converged() ? PrecondStatus::kConverged
                                                      : PrecondStatus::kNotConverged));
  precond.attribute("message", r.message);
  precond.attribute("sharpness", pair.empty() ? std::nan("") : pair[0].value);
  precond.attribute("residual", pair.empty() ? std::nan("") : pair[0].residual);
  precond.attribute("hvps", r.hvps + r.residual_hvps);
  precond.attribute("edge_of_stability", p.edge_of_stability());
  precond.attribute("lr", p.lr);
  precond.attribute("beta1", p.beta1);
  precond.attribute("beta2", p.beta2);
  precond.attribute("eps", p.eps);
  precond.attribute("step_count", p.step_count);
}

class SpectrumAnalysis : public UnitAnalysis {
 public:
  explicit SpectrumAnalysis(CheckpointSpectrumOptions options) : o_(std::move(options)) {}
  std::string name() const override { return "spectrum"; }
  bool reads_saved_state() const override { return o_.precond_sharpness; }
  bool per_checkpoint() const override { return true; }

  bool checkpoint_done(ProbeReport& report, const std::string& run, int64_t step) const override {
    return report.checkpoint_group(run, step).child("spectrum").exists();
  }

  // With the spectrum in the report already (a resumed run), only the eigenvectors that the
  // pending units' overlap needs are recomputed.
  CheckpointWork begin_checkpoint(CheckpointContext& c) override {
    top_vectors_.clear();
    const bool write = !checkpoint_done(c.report, c.run, c.step);
    if (!write && !(o_.overlap && c.units_pending)) return CheckpointWork::kNone;
    const ReportGroup g = c.report.checkpoint_group(c.run, c.step).child("spectrum");
    const int64_t hvps_before = c.engine.counters().hvps;
    if (write) {
      g.clear();
      g.attribute("seed", static_cast<int64_t>(o_.eigen.seed));
    }
    // Layer-wise products form their own gradients: the spectrum runs without the cached one (a
    // parameter-sized tensor less at its peak), and the units compute it again.
    if (c.engine.options().recompute_layers) c.engine.release_first_order();
    if (o_.eigenvalues || o_.overlap) {
      HessianOperator h(c.engine);
      EigenOptions options = o_.eigen;
      // Overlap alone, or a resumed run whose eigenvalues are in the file, needs the top only;
      // the eigenvectors are kept (a vector each through the units) for overlap alone.
      if (!write || !o_.eigenvalues) options.bottom = 0;
      options.keep_vectors = o_.overlap;
      EigenResult global = extreme_eigenpairs(h, options);
      const auto& top = options.method == EigenMethod::kPower ? global.dominant : global.largest;
      for (const auto& p : top) top_vectors_.push_back(p.vector);
      if (write && o_.eigenvalues) write_eigen(g, c.engine, c.blocks, o_, options, global);
    }
    if (!write) return CheckpointWork::kComputed;
    if (o_.trace) write_trace(g, c.engine, c.blocks, o_);
    if (o_.density) write_density(g, c.engine, o_);
    if (o_.precond_sharpness) write_precond(g, c.engine, c.saved, o_);
    g.attribute("hvps", c.engine.counters().hvps - hvps_before);
    return CheckpointWork::kWritten;
  }

  void unit(UnitContext& c) override {
    if (!o_.overlap || !c.nonzero()) return;
    const Overlap o = direction_overlap(c.u, top_vectors_, c.engine.gradient());
    const ReportGroup og = c.report.unit_group(c.run, c.step, c.direction).child("overlap");
    og.dataset("per_vector", o.per_vector);
    og.attribute("eigenspace_share", o.eigenspace_share);
    og.attribute("gradient_cosine", o.gradient_cosine);
    og.attribute("k", static_cast<int64_t>(o.per_vector.size()));
  }

 private:
  CheckpointSpectrumOptions o_;
  std::vector<at::Tensor> top_vectors_;  // of the current checkpoint, for overlap
};

}  // namespace

std::unique_ptr<UnitAnalysis> make_spectrum_analysis(const ProbeRunOptions& options) {
  if (!options.spectrum.any()) return nullptr;
  return std::make_unique<SpectrumAnalysis>(options.spectrum);
}

}  // namespace curv
