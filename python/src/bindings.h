// The parts of curv._curv, one function per area (module.cpp calls them in order).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace curv {
class Table;
}  // namespace curv

namespace curv::python {

namespace py = pybind11;

// A table as {column: list}, in column order (pandas.DataFrame takes it as it is).
py::dict columns_of(const Table& table);

void bind_errors(py::module_& m);
void bind_options(py::module_& m);     // enums and option classes (bind_types.cpp)
void bind_results(py::module_& m);     // the analyses' result structs (bind_types.cpp)
void bind_session(py::module_& m);     // Session (module.cpp)
void bind_report(py::module_& m);      // ProbeReport: the HDF5 file (bind_io.cpp)
void bind_tables(py::module_& m);      // results as the file's tables (bind_io.cpp)
void bind_optimizers(py::module_& m);  // rebuilt optimizer steps (bind_io.cpp)
void bind_job(py::module_& m);         // ndsprobe's job on checkpoint folders (bind_job.cpp)

}  // namespace curv::python
