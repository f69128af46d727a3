#include "curv/models/registry.h"

#include <fmt/format.h>

#include <limits>
#include <mutex>

#include "core/strings.h"
#include "curv/core/error.h"
#include "models/architecture.h"

namespace curv {

// Declares each built-in's NAME_architecture() and lists them (libcurv/CMakeLists.txt's
// CURV_ARCHITECTURES).
#include "models/builtin_architectures.inc"

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<const Architecture>> entries;
};

// Built-ins are listed here rather than self-registered from static initialisers, which a
// static link would drop along with their otherwise unreferenced object files.
Registry& registry() {
  static Registry* r = [] {
    auto* out = new Registry;
    out->entries = builtin_architectures();
    return out;
  }();
  return *r;
}

}  // namespace

double Architecture::parameter_count(const std::any&, double) const {
  return std::numeric_limits<double>::quiet_NaN();
}

std::any Architecture::parse_hf(const std::string&, const std::string& origin) const {
  throw FormatError(
      fmt::format("{}: architecture '{}' does not read Hugging Face configs", origin, name()));
}

const Architecture& find_hf_architecture(const std::string& model_type, const std::string& origin) {
  Registry& r = registry();
  std::vector<std::string> supported;
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& e : r.entries) {
    for (const auto& type : e->hf_model_types()) {
      if (type == model_type) return *e;
      supported.push_back(type);
    }
  }
  throw FormatError(
      fmt::format("{}: Hugging Face model_type '{}' is not supported{}; supported: {}", origin,
                  model_type, did_you_mean(model_type, supported), join(supported, ", ")));
}

void register_architecture(std::shared_ptr<const Architecture> architecture) {
  if (!architecture) throw InvalidArgument("register_architecture: null architecture");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const std::string name = architecture->name();
  for (const auto& e : r.entries) {
    if (e->name() == name) {
      throw InvalidArgument(
          fmt::format("register_architecture: arch '{}' is already registered", name));
    }
  }
  r.entries.push_back(std::move(architecture));
}

const Architecture& find_architecture(const std::string& name) {
  Registry& r = registry();
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const auto& e : r.entries) {
      if (e->name() == name) return *e;
      names.push_back(e->name());
    }
  }
  throw InvalidArgument(fmt::format("model config: arch '{}' is not registered{}; registered: {}",
                                    name, did_you_mean(name, names), join(names, ", ")));
}

std::vector<std::string> architecture_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& e : r.entries) names.push_back(e->name());
  return names;
}

}  // namespace curv
