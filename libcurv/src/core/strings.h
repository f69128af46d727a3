// Small string helpers shared by the library's sources (not part of the public API).
#pragma once

#include <string>
#include <vector>

namespace curv {

// " (did you mean 'a', 'b'?)" with the closest candidates by edit distance, or "".
std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates,
                         size_t max_suggestions = 3);
size_t edit_distance(const std::string& a, const std::string& b);
std::string join(const std::vector<std::string>& parts, const std::string& separator);
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace curv

#include <exception>

namespace curv {
// "a=1,b=x" -> {{"a","1"},{"b","x"}}; InvalidArgument names `what` and the item without '='.
std::vector<std::pair<std::string, std::string>> parse_key_values(const std::string& text,
                                                                  const std::string& what);
// The message of a caught exception without LibTorch's C++ backtrace.
std::string brief_what(const std::exception& e);
}  // namespace curv
