#include "curv/analysis/direction_registry.h"

#include <fmt/format.h>

#include <map>
#include <mutex>

#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/optim/optimizer_directions.h"

namespace curv {

namespace {

struct Entry {
  DirectionFactory factory;
  std::string help;
};

std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> entries = {
      {"delta",
       {[](const std::string&) { return make_delta_direction(); },
        "θ_{t+1} − θ_t between consecutive checkpoints"}},
      {"gradient",
       {[](const std::string&) { return make_gradient_direction(); },
        "−g, the negative probe-set gradient"}},
      {"random",
       {[](const std::string&) { return make_random_direction({}); },
        "seeded Gaussian, per-block norms matched to the delta (or −g)"}},
  };
  static const bool with_optimizers = [] {
    for (auto& [name, factory, help] : optimizer_direction_families()) {
      entries[name] = Entry{std::move(factory), std::move(help)};
    }
    return true;
  }();
  (void)with_optimizers;
  return entries;
}

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

void register_direction(const std::string& name, DirectionFactory factory,
                        const std::string& help) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[name] = Entry{std::move(factory), help};
}

std::unique_ptr<Direction> make_direction(const std::string& spec) {
  const std::string family = spec.substr(0, spec.find_first_of(":."));
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(family);
  if (it == registry().end()) {
    std::vector<std::string> names;
    for (const auto& e : registry()) names.push_back(e.first);
    throw InvalidArgument(fmt::format("unknown direction '{}'{}; known: {}", spec,
                                      did_you_mean(family, names), join(names, ", ")));
  }
  return it->second.factory(spec);
}

std::vector<std::pair<std::string, std::string>> known_directions() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : registry()) out.emplace_back(e.first, e.second.help);
  return out;
}

}  // namespace curv
