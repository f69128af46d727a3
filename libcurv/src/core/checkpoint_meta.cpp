#include "curv/core/checkpoint_meta.h"

#include <fmt/format.h>

#include "core/strings.h"
#include "curv/core/error.h"

namespace curv {

double OptimizerRecord::hyper_or(const std::string& key, double fallback,
                                 const std::string& origin) const {
  for (const auto& [k, v] : hyper) {
    if (k == key) return v;
  }
  for (const auto& [k, text] : non_numeric_hyper) {
    if (k == key) {
      throw FormatError(
          fmt::format("{}: \"optimizer.hyper.{}\" must be a number, got {}", origin, key, text));
    }
  }
  return fallback;
}

at::Tensor optimizer_state(const SavedOptimizer& saved, const std::string& param,
                           const std::string& key) {
  const std::string name = param + "." + key;
  if (!saved.state || saved.state->find(name) == nullptr) return {};
  return saved.state->read(name);
}

at::Tensor optimizer_state(const SavedOptimizer& saved, const ParamInfo& param,
                           const std::string& key, bool required) {
  const std::string& file = saved.file;
  auto t = optimizer_state(saved, param.name, key);
  if (!t.defined()) {
    if (!required) return t;
    if (!saved.has_state()) {
      throw InvalidArgument(
          fmt::format("{} is absent or empty, so there is no optimizer state "
                      "'{}' for parameter '{}'",
                      file, key, param.name));
    }
    std::vector<std::string> held;
    const std::string prefix = param.name + ".";
    for (const auto& entry : saved.state->entries()) {
      if (entry.name.rfind(prefix, 0) == 0) held.push_back(entry.name.substr(prefix.size()));
    }
    throw InvalidArgument(fmt::format(
        "{}: no optimizer state '{}.{}' (parameter '{}', state '{}'); states held for it: {}", file,
        param.name, key, param.name, key, held.empty() ? "none" : join(held, ", ")));
  }
  if (t.sizes().vec() != param.shape) {
    throw InvalidArgument(fmt::format(
        "{}: optimizer state '{}' of parameter '{}' has shape {}, the parameter has shape {}", file,
        key, param.name, shape_string(t.sizes().vec()), shape_string(param.shape)));
  }
  return t;
}

}  // namespace curv
