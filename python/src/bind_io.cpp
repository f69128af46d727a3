#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "curv/analysis/report.h"
#include "curv/analysis/result_tables.h"
#include "curv/analysis/taylor.h"
#include "curv/analysis/token_buckets.h"
#include "curv/analysis/within.h"
#include "curv/core/checkpoint_meta.h"
#include "curv/io/checkpoint.h"
#include "curv/optim/optimizer_directions.h"

namespace curv::python {

py::dict columns_of(const Table& table) {
  py::dict out;
  for (const auto& name : table.names()) {
    std::visit([&](const auto& values) { out[py::str(name)] = py::cast(values); },
               table.column(name));
  }
  return out;
}

namespace {

template <class... Args>
auto as_columns(Table (*make)(Args...)) {
  return [make](Args... args) { return columns_of(make(args...)); };
}

}  // namespace

void bind_tables(py::module_& m) {
  m.def("taylor_rows", as_columns(&taylor_rows), py::arg("run"), py::arg("step"),
        py::arg("direction"), py::arg("taylor"));
  m.def("blocks_table", as_columns(&blocks_table));
  m.def("batches_table", as_columns(&batches_table));
  m.def("multipliers_table", as_columns(&multipliers_table));
  m.def("modes_table", as_columns(&modes_table));
  m.def("groups_table", as_columns(&groups_table));
  m.def("token_bucket_rows", as_columns(&token_bucket_rows));
  m.def("eigen_table", as_columns(&eigen_table));
  m.def("trace_table", as_columns(&trace_table));
}

void bind_report(py::module_& m) {
  py::class_<Provenance>(m, "Provenance")
      .def(py::init([](const std::string& tool, const std::string& command_line,
                       const std::string& dtype, uint64_t seed, int threads) {
             return make_provenance(tool, command_line, dtype, seed, threads);
           }),
           py::arg("tool"), py::arg("command_line"), py::arg("dtype"), py::arg("seed") = 0,
           py::arg("threads") = 0)
      .def_readwrite("model", &Provenance::model)
      .def_readwrite("dtype", &Provenance::dtype)
      .def_readwrite("probe_examples", &Provenance::probe_examples)
      .def_readwrite("probe_batches", &Provenance::probe_batches)
      .def_readwrite("probe_hash", &Provenance::probe_hash)
      .def_readwrite("blocks", &Provenance::blocks)
      .def_readwrite("hvp_method", &Provenance::hvp_method)
      .def_readwrite("extra", &Provenance::extra)
      .def_readwrite("world_size", &Provenance::world_size);

  // Every call writes or reads the file: none runs Python, so each releases the GIL.
  using R = ProbeReport;
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  py::class_<R, std::unique_ptr<R>>(m, "Report")
      .def(py::init<std::string, Provenance, bool>(), py::arg("path"), py::arg("provenance"),
           py::arg("resume"), no_gil)
      .def_property_readonly("path", &R::path)
      .def("done", &R::done, no_gil)
      .def("add_checkpoint", &R::add_checkpoint, py::arg("run"), py::arg("step"), py::arg("loss"),
           py::arg("grad_norm"), py::arg("digest") = "", no_gil)
      .def("set_run_attribute", &R::set_run_attribute, no_gil)
      .def("add_taylor", &R::add_taylor, no_gil)
      .def("add_within", &R::add_within, no_gil)
      .def("add_token_buckets", &R::add_token_buckets, no_gil)
      .def(
          "add_eigen",
          [](R& r, const std::string& run, int64_t step, const EigenResult& e,
             const EigenOptions& options) {
            // The checkpoint's spectrum/eigen group, as ndsprobe's --spectrum writes it.
            write_eigen_group(r.checkpoint_group(run, step).child("spectrum"), eigen_table(e),
                              options, {"total: " + e.message});
          },
          no_gil)
      .def("commit", &R::commit, no_gil)
      .def("commit_if_due", &R::commit_if_due, no_gil);
}

void bind_optimizers(py::module_& m) {
  // The step a live optimizer takes next from θ with gradient g: its record (meta.json's
  // "optimizer" object as curv_export writes it) and its state tensors by "<param>.<key>", held
  // as a native checkpoint in memory, so the rule is found and applied as ndsprobe applies it to
  // a saved one, with no file written.
  m.def(
      "rebuild_update",
      [](const std::string& meta_json, NamedTensors state, const std::vector<std::string>& names,
         const ParamVector& theta, const ParamVector& grad) {
        py::gil_scoped_release release;
        Checkpoint ckpt;
        ckpt.step = 1;
        ckpt.path = ckpt.meta_file = ckpt.optimizer_file = "the live optimizer";
        ckpt.meta = parse_checkpoint_meta(meta_json, ckpt.meta_file);
        ckpt.optimizer = std::move(state);
        const ParamSpace space(names, theta);
        const SavedOptimizer saved = saved_optimizer(ckpt);
        RebuiltStep step = rebuild_saved_step(saved, space, theta, grad);
        return std::make_tuple(std::move(step.u), step.rule, step.note);
      },
      py::arg("meta_json"), py::arg("state"), py::arg("names"), py::arg("theta"), py::arg("grad"));
}

}  // namespace curv::python
