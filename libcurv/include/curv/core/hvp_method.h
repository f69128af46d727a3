// How the engine forms a Hessian-vector product: a light header, so that the options that choose
// it and the provenance that records it need not include the engine.
#pragma once

#include <string>

namespace curv {

enum class HvpMethod {
  kExact,             // double backward (Pearlmutter): exact to rounding
  kFiniteDifference,  // central difference of gradients: (g(θ+hv) - g(θ-hv)) / 2h
};
// "exact" | "fd"; InvalidOption naming EngineOptions.hvp_method otherwise.
HvpMethod parse_hvp_method(const std::string& text);
std::string hvp_method_name(HvpMethod method);  // "exact" | "fd", as the output records it

}  // namespace curv
