// H5Writer::load: an existing HDF5 file read back into a writer's description, so that a resumed
// run adds to its results file and rewrites it whole.
#include <string>

#include "curv/core/error.h"
#include "io/h5_detail.h"

namespace curv {

using namespace h5;

namespace {

// Fails unless the object has a scalar or simple dataspace of rank at most `max_rank`.
void check_space(const Source& src, int max_rank) {
  Handle space = src.space();
  if (!space.valid()) src.fail("cannot read dataspace");
  if (H5Sget_simple_extent_type(space.get()) == H5S_NULL) {
    src.fail("has a null dataspace, which H5Writer cannot write");
  }
  int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) src.fail("cannot read dataspace");
  if (rank > max_rank) {
    src.fail("has rank " + std::to_string(rank) + ", H5Writer writes attributes of rank 0 or 1");
  }
}

[[noreturn]] void unsupported_type(const Source& src, H5T_class_t c) {
  src.fail(std::string("holds ") + class_name(c) + ", which H5Writer cannot write");
}

AttributeValue load_attribute(hid_t object, const std::string& object_path, const std::string& name,
                              const std::string& file) {
  Source src{Handle(H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose), true,
             reader_where(file, object_path + " attribute '" + name + "'")};
  if (!src.handle.valid()) src.fail("cannot open attribute");
  check_space(src, 1);
  std::vector<uint64_t> dims;
  extent(src, &dims);
  const bool scalar = dims.empty();
  Handle type = src.type();
  H5T_class_t c = H5Tget_class(type.get());
  switch (c) {
    case H5T_INTEGER:
      if (scalar) return single(read_numbers<int64_t>(src, H5T_NATIVE_INT64, false, nullptr), src);
      return read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, nullptr);
    case H5T_FLOAT:
      if (scalar) return single(read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, nullptr), src);
      return read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, nullptr);
    case H5T_STRING:
      if (scalar) return single(read_strings(src, nullptr), src);
      return read_strings(src, nullptr);
    default:
      unsupported_type(src, c);
  }
}

void load_attributes(hid_t object, const std::string& object_path, Node& node,
                     const std::string& file) {
  for (const auto& name : attribute_names_of(object, reader_where(file, object_path))) {
    node.attributes[name] = load_attribute(object, object_path, name, file);
  }
}

void load_dataset(Handle dataset, const std::string& path, Node& node, const std::string& file) {
  Source src{std::move(dataset), false, reader_where(file, "dataset " + path)};
  check_space(src, H5S_MAX_RANK);
  Handle type = src.type();
  H5T_class_t c = H5Tget_class(type.get());
  node.is_dataset = true;
  if (c == H5T_INTEGER) {
    node.data = read_numbers<int64_t>(src, H5T_NATIVE_INT64, false, &node.dims);
  } else if (c == H5T_FLOAT) {
    node.data = read_numbers<double>(src, H5T_NATIVE_DOUBLE, true, &node.dims);
  } else if (c == H5T_STRING) {
    node.data = read_strings(src, &node.dims);
  } else {
    unsupported_type(src, c);
  }
  load_attributes(src.handle.get(), path, node, file);
}

struct Link {
  std::string name;
  H5L_type_t type;
};

herr_t collect_link(hid_t, const char* name, const H5L_info_t* info, void* data) {
  static_cast<std::vector<Link>*>(data)->push_back({name, info->type});
  return 0;
}

void load_group(hid_t group, const std::string& path, Node& node, const std::string& file) {
  load_attributes(group, path, node, file);
  std::vector<Link> links;
  hsize_t index = 0;
  if (H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, &index, collect_link, &links) < 0) {
    throw FormatError(reader_where(file, "group " + path) + ": cannot list members" +
                      hdf5_detail());
  }
  for (const auto& link : links) {
    const std::string child_path = (path == "/" ? "" : path) + "/" + link.name;
    const std::string where = reader_where(file, child_path);
    if (link.type != H5L_TYPE_HARD) {
      throw FormatError(where + ": is a soft or external link, which H5Writer cannot write");
    }
    Handle object(H5Oopen(group, link.name.c_str(), H5P_DEFAULT), H5Oclose);
    if (!object.valid()) throw FormatError(where + ": cannot open object" + hdf5_detail());
    auto& child = node.children[link.name];
    child = std::make_unique<Node>();
    switch (H5Iget_type(object.get())) {
      case H5I_GROUP:
        load_group(object.get(), child_path, *child, file);
        break;
      case H5I_DATASET:
        load_dataset(std::move(object), child_path, *child, file);
        break;
      default:
        throw FormatError(where + ": is a named datatype or another object H5Writer cannot write");
    }
  }
}

// The tables at and below `node` (at `path`) into `out`: a table's group may hold groups of its
// own, such as a unit's token_buckets table and its buckets' batches tables.
void collect_tables(const Node& node, const std::string& path, std::map<std::string, Table>& out) {
  const auto columns = node.attributes.find("columns");
  if (columns != node.attributes.end()) {
    const auto* names = std::get_if<std::vector<std::string>>(&columns->second);
    bool whole = names != nullptr;
    for (size_t k = 0; whole && k < names->size(); ++k) {
      const auto child = node.children.find((*names)[k]);
      whole = child != node.children.end() && child->second->is_dataset;
    }
    if (whole) {
      Table table;
      for (const auto& name : *names) table.add_column(name, node.children.at(name)->data);
      out.emplace(path, std::move(table));
    }
  }
  for (const auto& [name, child] : node.children) {
    if (!child->is_dataset) collect_tables(*child, (path == "/" ? "" : path) + "/" + name, out);
  }
}

}  // namespace

std::map<std::string, Table> H5Writer::tables() const {
  std::map<std::string, Table> out;
  collect_tables(*root_, "/", out);
  return out;
}

H5Writer H5Writer::load(const std::string& path) {
  quiet_hdf5();
  Handle file = open_for_reading(path);
  Handle root(H5Gopen2(file.get(), "/", H5P_DEFAULT), H5Gclose);
  if (!root.valid()) {
    throw FormatError(reader_where(path, "group /") + ": cannot open it" + hdf5_detail());
  }
  H5Writer writer(path);
  load_group(root.get(), "/", *writer.root_, path);
  return writer;
}

}  // namespace curv
