// H5Reader: read-only access to an HDF5 file's groups, datasets and attributes.
#include <algorithm>
#include <string>

#include "curv/core/error.h"
#include "io/h5_detail.h"

namespace curv {

using namespace h5;

struct H5Reader::File {
  Handle id{-1, H5Fclose};
};

H5Reader::H5Reader(const std::string& path) : path_(path), file_(std::make_unique<File>()) {
  quiet_hdf5();
  file_->id = open_for_reading(path);
}

H5Reader::~H5Reader() = default;
H5Reader::H5Reader(H5Reader&&) noexcept = default;
H5Reader& H5Reader::operator=(H5Reader&&) noexcept = default;

namespace {

// The HDF5 object type at `path`, or H5I_BADID when there is none. H5Lexists needs every
// intermediate link to exist, so each prefix is checked in turn.
H5I_type_t object_type(hid_t file, const std::string& path) {
  auto parts = split_path(path, "H5Reader");
  for (size_t i = 1; i <= parts.size(); ++i) {
    if (H5Lexists(file, join_path(parts, i).c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return H5I_BADID;
    }
  }
  Handle object(H5Oopen(file, join_path(parts, parts.size()).c_str(), H5P_DEFAULT), H5Oclose);
  if (!object.valid()) {  // e.g. a dangling soft link
    H5Eclear2(H5E_DEFAULT);
    return H5I_BADID;
  }
  return H5Iget_type(object.get());
}

Source open_dataset(hid_t file, const std::string& file_path, const std::string& path) {
  const std::string norm = normalize(path, "H5Reader for '" + file_path + "'");
  const std::string where = reader_where(file_path, "dataset " + norm);
  H5I_type_t type = object_type(file, norm);
  if (type == H5I_BADID) throw FormatError(where + ": no such dataset");
  if (type != H5I_DATASET) throw FormatError(where + ": is a group, not a dataset");
  Source src{Handle(H5Dopen2(file, norm.c_str(), H5P_DEFAULT), H5Dclose), false, where};
  if (!src.handle.valid()) src.fail("cannot open dataset");
  return src;
}

Source open_attribute(hid_t file, const std::string& file_path, const std::string& object_path,
                      const std::string& name) {
  const std::string norm = normalize(object_path, "H5Reader for '" + file_path + "'");
  const std::string where = reader_where(file_path, norm + " attribute '" + name + "'");
  if (object_type(file, norm) == H5I_BADID) throw FormatError(where + ": no such object");
  if (H5Aexists_by_name(file, norm.c_str(), name.c_str(), H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw FormatError(where + ": no such attribute");
  }
  Source src{
      Handle(H5Aopen_by_name(file, norm.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose),
      true, where};
  if (!src.handle.valid()) src.fail("cannot open attribute");
  return src;
}

}  // namespace

bool H5Reader::exists(const std::string& path) const {
  quiet_hdf5();
  return object_type(file_->id.get(), path) != H5I_BADID;
}

bool H5Reader::is_group(const std::string& path) const {
  quiet_hdf5();
  return object_type(file_->id.get(), path) == H5I_GROUP;
}

bool H5Reader::is_dataset(const std::string& path) const {
  quiet_hdf5();
  return object_type(file_->id.get(), path) == H5I_DATASET;
}

std::vector<std::string> H5Reader::children(const std::string& group) const {
  quiet_hdf5();
  const std::string norm = normalize(group, "H5Reader for '" + path_ + "'");
  const std::string where = reader_where(path_, "group " + norm);
  H5I_type_t type = object_type(file_->id.get(), norm);
  if (type == H5I_BADID) throw FormatError(where + ": no such group");
  if (type != H5I_GROUP) throw FormatError(where + ": is a dataset, not a group");
  Handle g(H5Gopen2(file_->id.get(), norm.c_str(), H5P_DEFAULT), H5Gclose);
  H5G_info_t info;
  if (!g.valid() || H5Gget_info(g.get(), &info) < 0) {
    throw FormatError(where + ": cannot open group" + hdf5_detail());
  }
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t len =
        H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) throw FormatError(where + ": cannot list members" + hdf5_detail());
    std::string name(static_cast<size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(),
                       H5P_DEFAULT);
    name.resize(static_cast<size_t>(len));
    names.push_back(std::move(name));
  }
  // The name index is already ordered; sorting again pins the order to plain byte order.
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<double> H5Reader::doubles(const std::string& path, std::vector<uint64_t>* dims) const {
  quiet_hdf5();
  return read_numbers<double>(open_dataset(file_->id.get(), path_, path), H5T_NATIVE_DOUBLE, true,
                              dims);
}

std::vector<int64_t> H5Reader::int64s(const std::string& path, std::vector<uint64_t>* dims) const {
  quiet_hdf5();
  return read_numbers<int64_t>(open_dataset(file_->id.get(), path_, path), H5T_NATIVE_INT64, false,
                               dims);
}

std::vector<std::string> H5Reader::strings(const std::string& path) const {
  quiet_hdf5();
  return read_strings(open_dataset(file_->id.get(), path_, path), nullptr);
}

std::vector<std::string> H5Reader::attribute_names(const std::string& object_path) const {
  quiet_hdf5();
  const std::string norm = normalize(object_path, "H5Reader for '" + path_ + "'");
  const std::string where = reader_where(path_, norm);
  if (object_type(file_->id.get(), norm) == H5I_BADID) {
    throw FormatError(where + ": no such object");
  }
  Handle object(H5Oopen(file_->id.get(), norm.c_str(), H5P_DEFAULT), H5Oclose);
  if (!object.valid()) throw FormatError(where + ": cannot open object" + hdf5_detail());
  return attribute_names_of(object.get(), where);
}

bool H5Reader::has_attribute(const std::string& object_path, const std::string& name) const {
  quiet_hdf5();
  const std::string norm = normalize(object_path, "H5Reader for '" + path_ + "'");
  if (object_type(file_->id.get(), norm) == H5I_BADID) return false;
  htri_t found = H5Aexists_by_name(file_->id.get(), norm.c_str(), name.c_str(), H5P_DEFAULT);
  if (found < 0) H5Eclear2(H5E_DEFAULT);
  return found > 0;
}

double H5Reader::attribute_double(const std::string& object_path, const std::string& name) const {
  quiet_hdf5();
  Source src = open_attribute(file_->id.get(), path_, object_path, name);
  return single(read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, nullptr), src);
}

int64_t H5Reader::attribute_int(const std::string& object_path, const std::string& name) const {
  quiet_hdf5();
  Source src = open_attribute(file_->id.get(), path_, object_path, name);
  return single(read_numbers<int64_t>(src, H5T_NATIVE_INT64, false, nullptr), src);
}

std::string H5Reader::attribute_string(const std::string& object_path,
                                       const std::string& name) const {
  quiet_hdf5();
  Source src = open_attribute(file_->id.get(), path_, object_path, name);
  return single(read_strings(src, nullptr), src);
}

std::vector<double> H5Reader::attribute_doubles(const std::string& object_path,
                                                const std::string& name) const {
  quiet_hdf5();
  Source src = open_attribute(file_->id.get(), path_, object_path, name);
  return read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, nullptr);
}

std::vector<std::string> H5Reader::attribute_strings(const std::string& object_path,
                                                     const std::string& name) const {
  quiet_hdf5();
  Source src = open_attribute(file_->id.get(), path_, object_path, name);
  return read_strings(src, nullptr);
}

Table H5Reader::table(const std::string& group_path) const {
  quiet_hdf5();
  const std::string norm = normalize(group_path, "H5Reader for '" + path_ + "'");
  Table table;
  for (const auto& name : attribute_strings(norm, "columns")) {
    const std::string column_path = (norm == "/" ? "" : norm) + "/" + name;
    Source src = open_dataset(file_->id.get(), path_, column_path);
    Handle type = src.type();
    H5T_class_t c = H5Tget_class(type.get());
    Table::Column column;
    if (c == H5T_INTEGER) {
      column = read_numbers<int64_t>(src, H5T_NATIVE_INT64, false, nullptr);
    } else if (c == H5T_FLOAT) {
      column = read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, nullptr);
    } else if (c == H5T_STRING) {
      column = read_strings(src, nullptr);
    } else {
      src.fail(std::string("table column holds ") + class_name(c));
    }
    try {
      table.add_column(name, std::move(column));
    } catch (const InvalidArgument& e) {
      throw FormatError(reader_where(path_, "table " + norm) + ": " + e.what());
    }
  }
  return table;
}

}  // namespace curv
