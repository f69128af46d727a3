// Table: the named, equally long columns that H5Writer::table stores and H5Reader::table reads.
#include <variant>

#include "curv/core/error.h"
#include "curv/io/h5_file.h"

namespace curv {

void Table::add_column(const std::string& name, Column values) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    throw InvalidArgument("Table: invalid column name '" + name + "'");
  }
  if (has_column(name)) throw InvalidArgument("Table: duplicate column '" + name + "'");
  size_t rows = std::visit([](const auto& v) { return v.size(); }, values);
  if (!names_.empty() && rows != num_rows_) {
    throw InvalidArgument("Table: column '" + name + "' has " + std::to_string(rows) +
                          " rows, the table has " + std::to_string(num_rows_));
  }
  names_.push_back(name);
  columns_.push_back(std::move(values));
  num_rows_ = rows;
}

void Table::append_rows(const Table& other) {
  if (names_.empty()) {
    *this = other;
    return;
  }
  if (other.names_ != names_) {
    throw InvalidArgument("Table::append_rows: the column names differ");
  }
  for (size_t i = 0; i < columns_.size(); ++i) {
    if (columns_[i].index() != other.columns_[i].index()) {
      throw InvalidArgument("Table::append_rows: column '" + names_[i] + "' has another type");
    }
  }
  for (size_t i = 0; i < columns_.size(); ++i) {
    std::visit(
        [&](auto& mine) {
          const auto& theirs = std::get<std::decay_t<decltype(mine)>>(other.columns_[i]);
          mine.insert(mine.end(), theirs.begin(), theirs.end());
        },
        columns_[i]);
  }
  num_rows_ += other.num_rows_;
}

bool Table::has_column(const std::string& name) const {
  for (const auto& n : names_) {
    if (n == name) return true;
  }
  return false;
}

size_t Table::index_of(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return i;
  }
  throw InvalidArgument("Table: no column '" + name + "'");
}

const Table::Column& Table::column(const std::string& name) const {
  return columns_[index_of(name)];
}

namespace {
template <typename T>
const std::vector<T>& typed_column(const Table::Column& column, const std::string& name,
                                   const char* type) {
  if (const auto* values = std::get_if<std::vector<T>>(&column)) return *values;
  throw InvalidArgument("Table: column '" + name + "' does not hold " + type);
}
}  // namespace

const std::vector<double>& Table::doubles(const std::string& name) const {
  return typed_column<double>(column(name), name, "doubles");
}
const std::vector<int64_t>& Table::int64s(const std::string& name) const {
  return typed_column<int64_t>(column(name), name, "int64s");
}
const std::vector<std::string>& Table::strings(const std::string& name) const {
  return typed_column<std::string>(column(name), name, "strings");
}

}  // namespace curv
