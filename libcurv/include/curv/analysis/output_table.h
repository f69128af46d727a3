// Declared output tables: each table of the results file is one TableLayout, the list of its
// columns (name, type, unit, description, and how a row gives the value), from which the writer
// builds the table, the resume reader checks a loaded one, and a test checks docs/hdf5-schema.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "curv/io/h5_file.h"

namespace curv {

enum class ColumnType { kFloat64, kInt64, kString };
std::string to_string(ColumnType type);  // "float64" | "int64" | "string"

struct ColumnSpec {
  std::string name;
  ColumnType type = ColumnType::kFloat64;
  std::string unit;  // of the value ("loss", "1", "HVPs", ...); empty for names and keys
  std::string description;
};

// A table's declaration without the code that fills it: what the schema documents.
struct TableSpec {
  std::string name;  // the group's name, "/taylor" at the root or "blocks" within a unit
  // The line of docs/hdf5-schema.md after which the table's column list follows.
  std::string doc_anchor;
  std::vector<ColumnSpec> columns;

  std::vector<std::string> column_names() const;
  Table empty() const;  // every column, no rows
  // FormatError naming `what` (a file and group) unless `table` has exactly these columns, in
  // order and of these types: a file written by another layout is not resumed into.
  void check(const Table& table, const std::string& what) const;
};

// The columns of a table whose rows come from values of type Row, each declared once with the
// function that reads it from a row.
template <typename Row>
class TableLayout {
 public:
  using Value = std::variant<double, int64_t, std::string>;

  TableLayout(std::string name, std::string doc_anchor) {
    spec_.name = std::move(name);
    spec_.doc_anchor = std::move(doc_anchor);
  }

  // `get(row)` returns a double, an integer or a string; the type makes the column's.
  template <typename Get>
  TableLayout& column(std::string name, std::string unit, std::string description, Get get) {
    using R = std::decay_t<std::invoke_result_t<Get, const Row&>>;
    ColumnType type = ColumnType::kFloat64;
    if constexpr (std::is_same_v<R, std::string>) {
      type = ColumnType::kString;
    } else if constexpr (std::is_integral_v<R>) {
      type = ColumnType::kInt64;
    } else {
      static_assert(std::is_floating_point_v<R>, "a column holds numbers or strings");
    }
    spec_.columns.push_back({std::move(name), type, std::move(unit), std::move(description)});
    getters_.push_back([get](const Row& row) -> Value {
      if constexpr (std::is_integral_v<R>) {
        return static_cast<int64_t>(get(row));
      } else if constexpr (std::is_floating_point_v<R>) {
        return static_cast<double>(get(row));
      } else {
        return std::string(get(row));
      }
    });
    return *this;
  }
  // The columns of `other` (another row type, read through `part`) after these.
  template <typename Other, typename Part>
  TableLayout& columns_of(const TableLayout<Other>& other, Part part) {
    for (size_t i = 0; i < other.spec().columns.size(); ++i) {
      const ColumnSpec& c = other.spec().columns[i];
      spec_.columns.push_back(c);
      getters_.push_back([&other, part, i](const Row& row) { return other.value(part(row), i); });
    }
    return *this;
  }

  const TableSpec& spec() const { return spec_; }
  Value value(const Row& row, size_t column) const { return getters_[column](row); }

  Table table(const std::vector<Row>& rows) const {
    Table t;
    for (size_t i = 0; i < getters_.size(); ++i) {
      Table::Column values;
      switch (spec_.columns[i].type) {
        case ColumnType::kFloat64:
          values = collect<double>(rows, i);
          break;
        case ColumnType::kInt64:
          values = collect<int64_t>(rows, i);
          break;
        case ColumnType::kString:
          values = collect<std::string>(rows, i);
          break;
      }
      t.add_column(spec_.columns[i].name, std::move(values));
    }
    return t;
  }
  // One row as attributes of `group`, a column each (the unit's scalars).
  void write_attributes(H5Writer& w, const std::string& group, const Row& row) const {
    for (size_t i = 0; i < getters_.size(); ++i) {
      std::visit([&](auto&& v) { w.attribute(group, spec_.columns[i].name, v); }, getters_[i](row));
    }
  }

 private:
  template <typename T>
  std::vector<T> collect(const std::vector<Row>& rows, size_t column) const {
    std::vector<T> out;
    out.reserve(rows.size());
    for (const auto& row : rows) out.push_back(std::get<T>(getters_[column](row)));
    return out;
  }

  TableSpec spec_;
  std::vector<std::function<Value(const Row&)>> getters_;
};

// Every table the built-in analyses and ProbeReport write, in the order of
// docs/hdf5-schema.md.
std::vector<TableSpec> output_table_specs();

}  // namespace curv
