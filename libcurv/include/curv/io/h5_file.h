// HDF5 file layer: H5Writer collects groups, datasets and attributes in memory and rewrites the
// whole file atomically on commit(); H5Reader reads such a file (or any HDF5 file) back.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace curv {

namespace detail {
struct H5Node;  // H5Writer's in-memory description of one group or dataset
}

// Named, equally long columns of doubles, int64s or strings: a long-format results table that
// H5Writer::table stores as one 1-D dataset per column, so pandas users can load it column by
// column. Column order is kept.
class Table {
 public:
  using Column = std::variant<std::vector<double>, std::vector<int64_t>, std::vector<std::string>>;

  // InvalidArgument if the name is empty, contains '/', is "." or "..", is taken, or the length
  // differs from the existing columns.
  void add_column(const std::string& name, Column values);
  // The column of one field of each item, e.g.
  //   add_column("nds", blocks, [](const BlockTerms& b) { return b.nds; });
  // the field is a double, an int64_t or a std::string.
  template <typename Item, typename Field>
  void add_column(const std::string& name, const std::vector<Item>& items, Field field) {
    std::vector<std::decay_t<std::invoke_result_t<Field, const Item&>>> values;
    values.reserve(items.size());
    for (const auto& item : items) values.push_back(field(item));
    add_column(name, Column(std::move(values)));
  }
  // Appends the rows of `other`, which must have the same column names and types in the same
  // order (InvalidArgument otherwise). An empty table takes over the columns of `other`.
  void append_rows(const Table& other);

  size_t num_rows() const { return num_rows_; }
  size_t num_columns() const { return names_.size(); }
  const std::vector<std::string>& names() const { return names_; }
  bool has_column(const std::string& name) const;
  // InvalidArgument naming the column if it is missing or holds another type.
  const Column& column(const std::string& name) const;
  const std::vector<double>& doubles(const std::string& name) const;
  const std::vector<int64_t>& int64s(const std::string& name) const;
  const std::vector<std::string>& strings(const std::string& name) const;

 private:
  size_t index_of(const std::string& name) const;

  std::vector<std::string> names_;
  std::vector<Column> columns_;
  size_t num_rows_ = 0;
};

// Builds an HDF5 file as an in-memory description and writes it atomically, so that a killed
// run or an unwritable path never leaves a half-written file behind. Object paths look like
// "/runs/adamw/step_100/blocks/nds"; missing intermediate groups are created as needed. Calling
// dataset/attribute/table again on the same path replaces the earlier value. Misuse (a dataset
// below a dataset, dims that do not match the data) throws InvalidArgument at the call.
// Like HDF5 itself, use one reader/writer from one thread at a time.
class H5Writer {
 public:
  explicit H5Writer(std::string path);  // nothing is touched on disk until commit()
  // Loads every group, dataset and attribute of the existing file at `path` into a writer for
  // the same path, so that a resumed run can add to it and commit again; load(p).commit()
  // rewrites an equivalent file. Datasets of integer types become int64, float types double,
  // string types strings, all keeping their shape (a scalar dataset stays scalar). Scalar
  // attributes become int64 (integer types), double or string; 1-D attributes become
  // vector<double> (integer or float types) or vector<string>. Throws FormatError naming the
  // path for a missing or non-HDF5 file, and naming the file and object path for anything
  // H5Writer cannot write: other type classes (compound, enum, ...), null dataspaces,
  // attributes of rank over 1, soft or external links, named datatypes.
  static H5Writer load(const std::string& path);
  ~H5Writer();
  H5Writer(H5Writer&&) noexcept;
  H5Writer& operator=(H5Writer&&) noexcept;
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;

  const std::string& path() const { return path_; }

  void group(const std::string& path);
  // Whether the description holds a group or dataset at `path`; "/" always exists.
  bool exists(const std::string& path) const;
  // Drops the group (with everything below it and its attributes) or dataset at `path` from the
  // description; nothing happens if there is none. remove("/") empties the whole description.
  // Removing one column of a table leaves its "columns" attribute as it was.
  void remove(const std::string& path);
  // `dims` empty means 1-D; otherwise the product of dims must equal data.size() (row-major).
  // Datasets over 4096 elements are stored chunked with gzip level 4, smaller ones contiguous.
  void dataset(const std::string& path, std::vector<double> data, std::vector<uint64_t> dims = {});
  void dataset(const std::string& path, std::vector<int64_t> data, std::vector<uint64_t> dims = {});
  // 1-D variable-length UTF-8 strings (h5py reads them as bytes; use .asstr() for str).
  // A string ends at its first NUL byte, as everywhere in HDF5.
  void dataset(const std::string& path, std::vector<std::string> data);

  // Attributes on a group or dataset; an object path not declared yet becomes a group.
  // Scalars are stored with a scalar dataspace, vectors 1-D.
  void attribute(const std::string& object_path, const std::string& name, double value);
  void attribute(const std::string& object_path, const std::string& name, std::string value);
  void attribute(const std::string& object_path, const std::string& name, const char* value) {
    attribute(object_path, name, std::string(value));
  }
  // Every integer type (and bool) is stored as int64; the template keeps `attribute(p, n, 5)`
  // from being ambiguous between the double and the int64 overload.
  template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  void attribute(const std::string& object_path, const std::string& name, T value) {
    attribute_int64(object_path, name, static_cast<int64_t>(value));
  }
  void attribute(const std::string& object_path, const std::string& name,
                 std::vector<double> value);
  void attribute(const std::string& object_path, const std::string& name,
                 std::vector<std::string> value);

  // Replaces whatever was below `group_path` by one 1-D dataset per column and sets the group
  // attribute "columns" to the column names in order. Other attributes of the group are kept.
  void table(const std::string& group_path, const Table& table);

  // Every table of the description by its group path ("/taylor", "/runs/a/step_10/delta/
  // blocks"): each group whose "columns" attribute names its datasets, as table() was given it
  // or load() read it, columns in that order.
  std::map<std::string, Table> tables() const;

  // Writes PATH.tmp in the same directory, flushes, closes and fsyncs it, renames it over PATH
  // and fsyncs the directory. On failure throws curv::Error naming the path, removes the tmp
  // file and leaves an existing PATH untouched. May be called again after more changes: every
  // call rewrites the whole file from the current description.
  void commit();

 private:
  void attribute_int64(const std::string& object_path, const std::string& name, int64_t value);

  std::string path_;
  std::unique_ptr<detail::H5Node> root_;
};

// Read-only view of an HDF5 file. Opening a missing or non-HDF5 file throws FormatError naming
// the path; reading a missing object or attribute, or one of an unsuitable type, throws
// FormatError naming the file and the object path (and attribute name).
class H5Reader {
 public:
  explicit H5Reader(const std::string& path);
  ~H5Reader();
  H5Reader(H5Reader&&) noexcept;
  H5Reader& operator=(H5Reader&&) noexcept;
  H5Reader(const H5Reader&) = delete;
  H5Reader& operator=(const H5Reader&) = delete;

  const std::string& path() const { return path_; }

  bool exists(const std::string& path) const;  // group or dataset; "/" always exists
  bool is_group(const std::string& path) const;
  bool is_dataset(const std::string& path) const;
  std::vector<std::string> children(const std::string& group) const;  // names, sorted

  // `dims` receives the shape (empty for a scalar dataset). doubles() converts any integer or
  // float type; int64s() accepts integer types only; strings() reads variable- or fixed-length
  // strings of a 1-D or scalar dataset.
  std::vector<double> doubles(const std::string& path, std::vector<uint64_t>* dims = nullptr) const;
  std::vector<int64_t> int64s(const std::string& path, std::vector<uint64_t>* dims = nullptr) const;
  std::vector<std::string> strings(const std::string& path) const;

  // Names of the attributes of a group or dataset, sorted; FormatError if the object is missing.
  std::vector<std::string> attribute_names(const std::string& object_path) const;
  // False when the object itself is missing.
  bool has_attribute(const std::string& object_path, const std::string& name) const;
  // The scalar getters accept a scalar or a one-element attribute.
  double attribute_double(const std::string& object_path, const std::string& name) const;
  int64_t attribute_int(const std::string& object_path, const std::string& name) const;
  std::string attribute_string(const std::string& object_path, const std::string& name) const;
  std::vector<double> attribute_doubles(const std::string& object_path,
                                        const std::string& name) const;
  std::vector<std::string> attribute_strings(const std::string& object_path,
                                             const std::string& name) const;

  // Reads a group written by H5Writer::table: the "columns" attribute gives names and order;
  // integer datasets become int64 columns, float ones double, string ones string columns.
  Table table(const std::string& group_path) const;

 private:
  struct File;
  std::string path_;
  std::unique_ptr<File> file_;
};

}  // namespace curv
