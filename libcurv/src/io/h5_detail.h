// Shared by the HDF5 writer and reader (not public API): owned handles, object paths, H5Writer's
// in-memory description, and reading a dataset or attribute once it is open.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "curv/core/error.h"
#include "curv/io/h5_file.h"

namespace curv {

namespace h5 {
using AttributeValue =
    std::variant<double, int64_t, std::string, std::vector<double>, std::vector<std::string>>;
}  // namespace h5

namespace detail {
struct H5Node {
  bool is_dataset = false;
  std::map<std::string, std::unique_ptr<H5Node>> children;  // groups only
  std::map<std::string, h5::AttributeValue> attributes;
  Table::Column data;          // datasets only
  std::vector<uint64_t> dims;  // datasets only
};
}  // namespace detail

namespace h5 {

using Node = detail::H5Node;

// Owns an hid_t and closes it with the matching H5?close.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, -1)), close_(other.close_) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      close();
      id_ = std::exchange(other.id_, -1);
      close_ = other.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now and reports whether closing succeeded (for files, where close writes data).
  bool close() {
    hid_t id = std::exchange(id_, -1);
    return id < 0 || close_(id) >= 0;
  }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its error stack to stderr by default; our exceptions carry the message instead.
// In a thread-safe HDF5 build the setting is per thread, so every entry point calls this.
void quiet_hdf5();
// The innermost HDF5 error message (e.g. the errno text of a failed open), then clears the
// stack; empty when HDF5 recorded nothing.
std::string hdf5_detail();
// Splits "/a//b/" into {"a", "b"}; rejects "." and ".." which HDF5 would resolve specially.
std::vector<std::string> split_path(const std::string& path, const std::string& context);
std::string join_path(const std::vector<std::string>& parts, size_t count);
std::string normalize(const std::string& path, const std::string& context);
Handle utf8_string_type();
std::string dims_text(const std::vector<uint64_t>& dims);
Handle file_access_plist();
std::string writer_context(const std::string& file);
std::string reader_where(const std::string& file, const std::string& object);

// A dataset or an attribute: both are read the same way once opened.
struct Source {
  Handle handle;
  bool is_attribute;
  std::string where;  // "HDF5 file 'f.h5': /a/b" or "... /a/b attribute 'x'"

  Handle type() const {
    return Handle(is_attribute ? H5Aget_type(handle.get()) : H5Dget_type(handle.get()), H5Tclose);
  }
  Handle space() const {
    return Handle(is_attribute ? H5Aget_space(handle.get()) : H5Dget_space(handle.get()), H5Sclose);
  }
  bool read(hid_t mem_type, void* buffer) const {
    return (is_attribute
                ? H5Aread(handle.get(), mem_type, buffer)
                : H5Dread(handle.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer)) >= 0;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError(where + ": " + what + hdf5_detail());
  }
};

const char* class_name(H5T_class_t c);
// Shape and element count; a scalar dataspace has rank 0 and one element.
size_t extent(const Source& src, std::vector<uint64_t>* dims);
std::vector<std::string> read_strings(const Source& src, std::vector<uint64_t>* dims);
// Opens an existing HDF5 file read-only; FormatError naming the path if that is not possible.
Handle open_for_reading(const std::string& path);
// The attribute names of an open object, sorted; `where` names it in errors.
std::vector<std::string> attribute_names_of(hid_t object, const std::string& where);

template <typename T>
std::vector<T> read_numbers(const Source& src, hid_t mem_type, bool allow_float,
                            std::vector<uint64_t>* dims) {
  Handle type = src.type();
  H5T_class_t c = H5Tget_class(type.get());
  if (!(c == H5T_INTEGER || (allow_float && c == H5T_FLOAT))) {
    src.fail(std::string("holds ") + class_name(c) + ", expected " +
             (allow_float ? "numbers" : "integers"));
  }
  std::vector<T> out(extent(src, dims));
  if (!out.empty() && !src.read(mem_type, out.data())) src.fail("cannot read values");
  return out;
}

template <typename T>
T single(std::vector<T> values, const Source& src) {
  if (values.size() != 1) {
    src.fail("has " + std::to_string(values.size()) + " elements, expected one");
  }
  return std::move(values[0]);
}

}  // namespace h5
}  // namespace curv
