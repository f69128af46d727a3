// ndsprobe: curvature along optimizer update directions on directories of training checkpoints.
// For every checkpoint and direction it writes a second-order Taylor audit, NDS, the per-block and
// coupling breakdown and (optionally) within-block modes and the Hessian spectrum to one HDF5
// file; see docs/cli.md. The work is curv::run_probe_job; this file is its command line.
#include <cstdio>

#include "cli_common.h"
#include "curv/analysis/direction_registry.h"
#include "curv/analysis/memory_plan.h"
#include "curv/analysis/probe_run.h"
#include "curv/analysis/summary.h"
#include "curv/core/runtime.h"
#include "curv/io/h5_file.h"
#include "probe_args.h"

using namespace curv;

namespace {

struct Args {
  tools::CheckpointArgs checkpoints;
  tools::ModelArgs model;
  tools::ProbeDataArgs data;
  tools::DirectionArgs directions;
  tools::AuditArgs audit;
  tools::SpectrumArgs spectrum;
  tools::EngineArgs engine;
  tools::RuntimeArgs runtime;
  std::string output = "ndsprobe.h5";
  bool resume = false;
  bool plan = false;
  std::string memory_budget = "0";  // ProbeJob::memory_budget, with a K, M, G or T suffix
};

ProbeJob to_job(const Args& a, int argc, char** argv) {
  ProbeJob job;
  a.checkpoints.to_options(job.run);
  a.directions.to_options(job.run);
  a.audit.to_options(job.run, a.runtime.seed);
  job.run.spectrum = a.spectrum.to_options(a.runtime.seed);
  job.run.whatif_fallback = a.directions.whatif_fallback;
  job.run.seed = a.runtime.seed;
  job.model = a.model.to_source(a.runtime);
  job.data = a.data.to_source(a.runtime.seed);
  job.blocks = a.audit.block_options();
  job.engine = a.engine.to_options();
  job.run.matmul_precision = parse_matmul_precision(a.engine.matmul_precision);
  job.engine.communicator = a.runtime.communicator();
  job.output = a.output;
  job.resume = a.resume;
  job.memory_budget = tools::parse_bytes(a.memory_budget, "--memory-budget");
  job.provenance = a.runtime.provenance("ndsprobe", argc, argv);
  return job;
}

int run(int argc, char** argv) {
  Args a;
  CLI::App app{
      "ndsprobe: curvature along optimizer update directions, per layer and within "
      "layers, on directories of training checkpoints. Writes HDF5 "
      "(docs/hdf5-schema.md)."};
  a.checkpoints.add_to(app);
  a.model.add_to(app);
  a.data.add_to(app);
  a.directions.add_to(app);
  a.audit.add_to(app);
  app.add_option("-o,--output", a.output, "Output HDF5 file")->capture_default_str();
  app.add_flag("--resume", a.resume,
               "Keep the results already in --output and skip finished units");
  a.engine.add_to(app);
  app.add_flag("--plan", a.plan,
               "Print the memory the run would hold on its device, part by part, estimated "
               "before anything is allocated, and exit (status 1 when it exceeds "
               "--memory-budget)");
  app.add_option("--memory-budget", a.memory_budget,
                 "Refuse to start a run whose planned memory (--plan) exceeds this many bytes "
                 "(suffix K, M, G, T: powers of 1024; 0 = no bound), naming its largest part")
      ->capture_default_str();
  a.spectrum.add_to(app);
  a.runtime.add_to(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (a.directions.list) {
    for (const auto& [name, help] : known_directions()) {
      std::printf("%-12s %s\n", name.c_str(), help.c_str());
    }
    return 0;
  }
  a.runtime.init();
  const ProbeJob job = to_job(a, argc, argv);
  // Checked before any checkpoint is read; run_tool names the options by their flags.
  job.run.validate();
  job.data.validate();
  if (a.plan) {
    const MemoryPlan plan = plan_probe_job(job);
    std::fputs(plan.describe().c_str(), stdout);
    check_memory_budget(plan, job.memory_budget);
    return 0;
  }

  // Under torchrun every rank runs this; rank 0 alone prints and writes.
  const bool prints = a.runtime.prints();
  tools::Progress progress(a.runtime.quiet || !prints);
  // Progress is reported after each unit's results are committed to the output: the safe point
  // at which a SIGINT or SIGTERM stops the run, so --resume continues from there.
  tools::install_stop_signals();
  const ProgressCallback report = progress.callback();
  const ProbeJobResult result =
      run_probe_job(job, [&](size_t done, size_t total, const std::string& label) {
        report(done, total, label);
        tools::stop_if_requested(*job.engine.communicator);
      });
  progress.finish();
  if (!prints) return 0;
  std::fputs(summarize_probe_file(result.output).c_str(), stdout);
  // On a GPU: the most memory any unit's tensors held, for sizing --max-memory.
  const std::string peak = result.summary.peak_memory < 0
                               ? std::string()
                               : ", peak device memory " + format_bytes(result.summary.peak_memory);
  std::fprintf(stderr, "ndsprobe: wrote %s (%s%s)\n", result.output.c_str(),
               result.summary.counters.brief().c_str(), peak.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  reexec_for_blas_kernels(argv);
  return tools::run_tool("ndsprobe", tools::probe_flag_names(), [&] { return run(argc, argv); });
}
