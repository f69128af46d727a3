// The parts of curv._curv, one function per area (module.cpp calls them in order).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace curv::python {

namespace py = pybind11;

void bind_errors(py::module_& m);
void bind_options(py::module_& m);     // enums and option classes (bind_types.cpp)
void bind_results(py::module_& m);     // the analyses' result structs (bind_types.cpp)
void bind_session(py::module_& m);     // Session (module.cpp)
void bind_report(py::module_& m);      // ProbeReport: the HDF5 file (bind_io.cpp)
void bind_tables(py::module_& m);      // results as the file's tables (bind_io.cpp)
void bind_optimizers(py::module_& m);  // rebuilt optimizer steps (bind_io.cpp)

}  // namespace curv::python
