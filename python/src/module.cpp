// curv._curv: libcurv's engine, analyses, report and optimizer rules for the Python package
// (python/curv). Options are typed (enums and option classes, not strings); results are the
// library's own structs, which curv/results.py turns into dataclasses and DataFrames.
#include <fmt/format.h>
#include <pybind11/eigen.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <string>

#include "bindings.h"
#include "curv/core/error.h"
#include "curv/core/param_space.h"
#include "curv/core/runtime.h"
#include "curv/core/structure.h"
#include "session.h"

namespace curv::python {

namespace {

// The package's keyword for a library option a message names: the field's own name
// (TaylorOptions.coupling_samples -> coupling_samples), or the keyword the package gives it.
std::string keyword(const NamedOption& named) {
  static const std::map<std::string, std::string> renamed = {
      {"ParamOrderSpec", "param_order"},   {"TokenBucketOptions", "token_buckets"},
      {"EngineOptions.hvp_method", "hvp"}, {"BlockOptions.rule", "blocks"},
      {"ProbeJob.resume", "resume"},       {"TokenBucketOptions.head_mass", "head_mass"},
  };
  std::string name;
  const auto it = renamed.find(named.option);
  if (it != renamed.end()) {
    name = it->second;
  } else {
    const auto dot = named.option.find('.');
    if (dot == std::string::npos) return Error::library_name(named);
    name = named.option.substr(dot + 1);
  }
  return named.value.empty() ? name : name + "=" + named.value;
}

// A curv::Error raised as `type`, the options it names written as the package's keywords.
void raise_as(const py::object& type, const Error& e) {
  PyErr_SetString(type.ptr(), e.render(keyword).c_str());
}

}  // namespace

void bind_errors(py::module_& m) {
  // Base first: pybind11 tries translators in reverse order of registration.
  static py::exception<Error> base(m, "CurvError", PyExc_RuntimeError);
  static py::exception<InvalidArgument> invalid(m, "InvalidArgument", PyExc_ValueError);
  static py::exception<FormatError> format(m, "FormatError", base.ptr());
  static py::exception<ModelError> model(m, "ModelError", base.ptr());
  static py::exception<NumericalError> numerical(m, "NumericalError", base.ptr());
  static py::exception<OutOfMemory> memory(m, "OutOfMemory", base.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      raise_as(invalid, e);
    } catch (const FormatError& e) {
      raise_as(format, e);
    } catch (const ModelError& e) {
      raise_as(model, e);
    } catch (const NumericalError& e) {
      raise_as(numerical, e);
    } catch (const OutOfMemory& e) {
      raise_as(memory, e);
    } catch (const Error& e) {
      raise_as(base, e);
    } catch (const c10::Error& e) {
      // LibTorch's own errors (an operator without a double backward, a shape mismatch) as
      // torch raises them in Python: a RuntimeError, without the C++ backtrace.
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
}

void bind_session(py::module_& m) {
  py::class_<SessionOptions>(m, "SessionOptions")
      .def(py::init<>())
      .def_property(
          "reuse_graph", [](const SessionOptions& o) { return o.engine.reuse_graph; },
          [](SessionOptions& o, bool v) { o.engine.reuse_graph = v; })
      .def_property(
          "max_kept_graphs", [](const SessionOptions& o) { return o.engine.max_kept_graphs; },
          [](SessionOptions& o, int64_t v) { o.engine.max_kept_graphs = v; })
      .def_property(
          "max_memory", [](const SessionOptions& o) { return o.engine.max_memory; },
          [](SessionOptions& o, int64_t v) { o.engine.max_memory = v; })
      .def_property(
          "micro_batch", [](const SessionOptions& o) { return o.engine.micro_batch; },
          [](SessionOptions& o, int64_t v) { o.engine.micro_batch = v; })
      .def_property(
          "hvp", [](const SessionOptions& o) { return o.engine.hvp_method; },
          [](SessionOptions& o, HvpMethod v) { o.engine.hvp_method = v; })
      .def_property(
          "fd_step", [](const SessionOptions& o) { return o.engine.fd_step; },
          [](SessionOptions& o, double v) { o.engine.fd_step = v; })
      .def_property(
          "vector_dtype",
          [](const SessionOptions& o) {
            return o.engine.vector_dtype == at::ScalarType::Undefined
                       ? std::string("auto")
                       : dtype_name(o.engine.vector_dtype);
          },
          [](SessionOptions& o, const std::string& v) {
            o.engine.vector_dtype = v == "auto"
                                        ? at::ScalarType::Undefined
                                        : parse_vector_dtype(v, at::kDouble, "vector_dtype");
          })
      .def_property(
          "host_copies", [](const SessionOptions& o) { return o.engine.host_copies; },
          [](SessionOptions& o, bool v) { o.engine.host_copies = v; })
      .def_property(
          "recompute_layers", [](const SessionOptions& o) { return o.engine.recompute_layers; },
          [](SessionOptions& o, bool v) { o.engine.recompute_layers = v; })
      .def_property(
          "check_finite", [](const SessionOptions& o) { return o.engine.check_finite; },
          [](SessionOptions& o, bool v) { o.engine.check_finite = v; })
      .def_readwrite("block_rule", &SessionOptions::block_rule)
      .def_readwrite("block_groups", &SessionOptions::block_groups);

  py::class_<Session>(m, "Session")
      .def(py::init<py::object, const std::vector<std::string>&, ParamVector,
                    const std::vector<at::Tensor>&, bool, std::string, const std::string&,
                    SessionOptions>(),
           py::arg("evaluator"), py::arg("names"), py::arg("params"), py::arg("targets"),
           py::arg("has_logits"), py::arg("description"), py::arg("structure_json"),
           py::arg("options"))
      .def("loss", &Session::loss)
      .def("gradient", &Session::gradient)
      .def("hvp", &Session::hvp)
      .def("audit", &Session::audit)
      .def("within", &Session::within)
      .def("token_buckets", &Session::token_buckets)
      .def("eigenvalues", &Session::eigenvalues)
      .def("trace", &Session::trace)
      .def("density", &Session::density)
      .def("describe", &Session::describe)
      .def("probe_hash", [](const Session& s) { return s.probe().hash(); })
      .def("probe_examples", [](const Session& s) { return s.probe().num_examples(); })
      .def("probe_batches", [](const Session& s) { return s.probe().size(); })
      .def("names", [](const Session& s) { return s.space().names(); })
      .def("block_names", [](const Session& s) { return s.blocks().names(); })
      .def("block_of", [](const Session& s) { return s.blocks().block_of(); })
      .def("roles",
           [](const Session& s) {
             std::vector<std::pair<std::string, int64_t>> out;
             for (const auto& p : s.structure().params)
               out.emplace_back(role_name(p.role), p.layer);
             return out;
           })
      .def("counters", [](const Session& s) {
        const EngineCounters c = s.counters();
        return py::dict(py::arg("forwards") = c.forwards, py::arg("backwards") = c.backwards,
                        py::arg("second_backwards") = c.second_backwards, py::arg("hvps") = c.hvps,
                        py::arg("gradients") = c.gradients);
      });
}

}  // namespace curv::python

PYBIND11_MODULE(_curv, m) {
  namespace cp = curv::python;
  m.doc() = "libcurv: curvature of a loss along update directions (docs/python.md)";
  m.attr("__version__") = curv::library_version();
  m.def("runtime_summary", &curv::runtime_summary);
  m.def(
      "init_runtime",
      [](int threads, bool tune_allocator) {
        curv::init_runtime(curv::RuntimeOptions{threads, tune_allocator});
      },
      py::arg("threads"), py::arg("tune_allocator"));
  m.def("role_names", &curv::role_names);
  cp::bind_errors(m);
  cp::bind_options(m);
  cp::bind_results(m);
  cp::bind_session(m);
  cp::bind_report(m);
  cp::bind_tables(m);
  cp::bind_optimizers(m);
  cp::bind_job(m);
}
