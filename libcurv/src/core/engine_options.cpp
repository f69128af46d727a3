// The engine's options, checked; its counters' summary; the HVP methods' names.
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "curv/core/engine.h"
#include "curv/core/error.h"

namespace curv {

HvpMethod parse_hvp_method(const std::string& text) {
  if (text == "exact") return HvpMethod::kExact;
  if (text == "fd") return HvpMethod::kFiniteDifference;
  throw InvalidOption("{0}: expected exact or fd",
                      {{"EngineOptions.hvp_method", InvalidOption::literal(text)}});
}

std::string hvp_method_name(HvpMethod method) {
  return method == HvpMethod::kExact ? "exact" : "fd";
}

void EngineOptions::validate() const {
  if (max_kept_graphs < 0) {
    throw InvalidOption("{0} must be >= 0",
                        {{"EngineOptions.max_kept_graphs", fmt::format("{}", max_kept_graphs)}});
  }
  if (micro_batch < 0) {
    throw InvalidOption("{0} must be >= 0 (0 = whole batches)",
                        {{"EngineOptions.micro_batch", fmt::format("{}", micro_batch)}});
  }
  if (max_memory < 0) {
    throw InvalidOption("{0} must be >= 0 (0 = no bound)",
                        {{"EngineOptions.max_memory", fmt::format("{}", max_memory)}});
  }
  if (!(fd_step >= 0.0) || !std::isfinite(fd_step)) {
    throw InvalidOption("{0} must be finite and >= 0",
                        {{"EngineOptions.fd_step", fmt::format("{}", fd_step)}});
  }
}

std::string EngineCounters::brief() const {
  return fmt::format(
      "{} forwards, {} backwards, {} second backwards, {} gradients, {} HVPs, {:.3f} s{}", forwards,
      backwards, second_backwards, gradients, hvps, seconds,
      graphs_over_budget > 0
          ? fmt::format(", {} graphs not kept (memory budget)", graphs_over_budget)
          : std::string());
}

}  // namespace curv
