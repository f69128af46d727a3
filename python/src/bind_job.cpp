// ndsprobe's job from Python: checkpoint directories of any layout, a built-in or exported model,
// the probe data file, every analysis, the same HDF5 output, and every table of it returned in
// memory (ProbeJobResult::tables). The package's probe_checkpoints (curv/checkpoints.py) fills
// the ProbeJob; the engine is the one ndsprobe runs.
#include <Python.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <utility>

#include "bindings.h"
#include "curv/analysis/probe_run.h"
#include "curv/analysis/report.h"
#include "curv/io/checkpoint_layout.h"
#include "curv/io/param_order.h"
#include "session.h"

namespace curv::python {
namespace {

py::dict summary_of(const ProbeRunSummary& s) {
  const EngineCounters& c = s.counters;
  return py::dict(
      py::arg("units") = s.units, py::arg("skipped") = s.skipped,
      py::arg("zero_directions") = s.zero_directions, py::arg("peak_memory") = s.peak_memory,
      py::arg("checkpoints_read_ahead") = s.checkpoints_read_ahead,
      py::arg("engine_seconds") = c.seconds, py::arg("hvps") = c.hvps,
      py::arg("gradients") = c.gradients, py::arg("forwards") = c.forwards,
      py::arg("backwards") = c.backwards, py::arg("second_backwards") = c.second_backwards);
}

// Runs the job without the GIL; `progress` (done, total, label), when given, is called with it
// after each committed unit, and a pending KeyboardInterrupt stops the job there: every unit
// finished before is in the file, and resume=True continues it.
py::tuple run_job(const ProbeJob& job, const py::object& progress) {
  ProbeJobResult result;
  {
    py::gil_scoped_release release;
    result = run_probe_job(job, [&](size_t done, size_t total, const std::string& label) {
      py::gil_scoped_acquire acquire;
      if (!progress.is_none()) progress(done, total, label);
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    });
  }
  py::dict tables;
  for (const auto& [path, table] : result.tables) tables[py::str(path)] = columns_of(table);
  return py::make_tuple(summary_of(result.summary), result.output, tables);
}

template <class T>
auto field(T ProbeRunOptions::*member) {
  return py::cpp_function([member](ProbeJob& j, T v) { j.run.*member = std::move(v); });
}

void bind_run_options(py::class_<ProbeJob>& c) {
  c.def_property(
       "runs", [](const ProbeJob& j) { return j.run.runs; }, field(&ProbeRunOptions::runs))
      .def_property(
          "directions", [](const ProbeJob& j) { return j.run.directions; },
          field(&ProbeRunOptions::directions))
      .def_property(
          "optimizer", [](const ProbeJob& j) { return j.run.optimizer; },
          field(&ProbeRunOptions::optimizer))
      .def_property(
          "whatif_fallback", [](const ProbeJob& j) { return j.run.whatif_fallback; },
          field(&ProbeRunOptions::whatif_fallback))
      .def_property(
          "allow_extra", [](const ProbeJob& j) { return j.run.allow_extra; },
          field(&ProbeRunOptions::allow_extra))
      .def_property(
          "taylor", [](const ProbeJob& j) { return j.run.taylor; }, field(&ProbeRunOptions::taylor))
      .def_property(
          "within", [](const ProbeJob& j) { return j.run.within; }, field(&ProbeRunOptions::within))
      .def_property(
          "within_options", [](const ProbeJob& j) { return j.run.within_options; },
          field(&ProbeRunOptions::within_options))
      .def_property(
          "token_buckets", [](const ProbeJob& j) { return j.run.token_buckets; },
          field(&ProbeRunOptions::token_buckets))
      .def_property(
          "seed", [](const ProbeJob& j) { return j.run.seed; }, field(&ProbeRunOptions::seed))
      .def_property(
          "prefetch", [](const ProbeJob& j) { return j.run.prefetch; },
          field(&ProbeRunOptions::prefetch))
      .def("set_steps", [](ProbeJob& j, const std::string& range,
                           int64_t stride) { j.run.steps = StepSelection::parse(range, stride); })
      .def("set_layout",
           [](ProbeJob& j, const std::string& name) {
             j.run.layout = parse_checkpoint_layout(name);
           })
      .def("set_param_order",
           [](ProbeJob& j, ParamOrder order, const std::string& path) {
             j.run.param_order = ParamOrderSpec{order, path};
           })
      .def("add_comparison",
           [](ProbeJob& j, const std::string& pair) {
             j.run.comparisons.push_back(NdsPairSpec::parse(pair));
           })
      .def("set_spectrum",
           [](ProbeJob& j, bool eigenvalues, bool per_block, bool trace, bool density,
              bool precond_sharpness, bool overlap, const EigenOptions& eigen,
              const TraceOptions& trace_options, const DensityOptions& density_options) {
             CheckpointSpectrumOptions& s = j.run.spectrum;
             s.eigenvalues = eigenvalues;
             s.per_block = per_block;
             s.trace = trace;
             s.density = density;
             s.precond_sharpness = precond_sharpness;
             s.overlap = overlap;
             s.eigen = eigen;
             s.trace_options = trace_options;
             s.density_options = density_options;
           });
}

void bind_sources(py::class_<ProbeJob>& c) {
  c.def("set_model",
        [](ProbeJob& j, const std::string& path, const std::string& dtype,
           const std::string& device, uint64_t seed) {
          j.model.path = path;
          j.model.init.dtype = parse_dtype(dtype);
          j.model.init.device = device;
          j.model.init.seed = seed;
        })
      .def("set_data",
           [](ProbeJob& j, const std::string& path, int64_t batch_size, int64_t examples,
              int64_t block_size, uint64_t seed) {
             j.data.path = path;
             j.data.options.batch_size = batch_size;
             j.data.options.max_examples = examples;
             j.data.block_size = block_size;
             j.data.seed = seed;
           })
      .def(
          "set_blocks",
          [](ProbeJob& j, BlockRule rule, std::vector<std::pair<std::string, std::string>> groups) {
            j.blocks.rule = rule;
            j.blocks.groups = std::move(groups);
          })
      .def("set_engine",
           [](ProbeJob& j, const SessionOptions& o) {
             auto communicator = j.engine.communicator;
             j.engine = o.engine;
             j.engine.communicator = communicator;
           })
      .def("set_output",
           [](ProbeJob& j, const std::string& path, bool resume, const std::string& command_line,
              const std::string& dtype, uint64_t seed, int threads) {
             j.output = path;
             j.resume = resume;
             j.provenance =
                 make_provenance("curv.probe_checkpoints", command_line, dtype, seed, threads);
           });
}

}  // namespace

void bind_job(py::module_& m) {
  py::enum_<ParamOrder>(m, "ParamOrder")
      .value("AUTO", ParamOrder::kAuto)
      .value("MODEL", ParamOrder::kModel)
      .value("NDIM", ParamOrder::kNdim)
      .value("HIDDEN", ParamOrder::kHidden)
      .value("MODDED", ParamOrder::kModded)
      .value("TRAINER", ParamOrder::kTrainer)
      .value("FILE", ParamOrder::kFile);
  py::class_<ProbeJob> c(m, "ProbeJob");
  c.def(py::init<>());
  bind_run_options(c);
  bind_sources(c);
  m.def("run_probe_job", &run_job, py::arg("job"), py::arg("progress") = py::none());
}

}  // namespace curv::python
