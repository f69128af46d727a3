#include "core/strings.h"

#include <algorithm>
#include <numeric>

namespace curv {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates,
                         size_t max_suggestions) {
  if (candidates.empty()) return "";
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& c : candidates) scored.emplace_back(edit_distance(name, c), c);
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::string out = " (did you mean ";
  for (size_t i = 0; i < std::min(max_suggestions, scored.size()); ++i) {
    if (i) out += ", ";
    out += "'" + scored[i].second + "'";
  }
  return out + "?)";
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += separator;
    out += parts[i];
  }
  return out;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::vector<std::string> parts;
  for (auto d : shape) parts.push_back(std::to_string(d));
  return "[" + join(parts, ", ") + "]";
}

}  // namespace curv

#include <c10/util/Exception.h>

#include "curv/core/error.h"

namespace curv {

std::vector<std::pair<std::string, std::string>> parse_key_values(const std::string& text,
                                                                  const std::string& what) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      throw InvalidArgument(what + ": '" + item + "' is not key=value");
    }
    out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    start = end + 1;
  }
  return out;
}

std::string brief_what(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

}  // namespace curv
