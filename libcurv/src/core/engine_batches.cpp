// The engine's loop over its share of the probe batches, and what a failure in one becomes: an
// OutOfMemory naming the pass, the batch and the options that lower what a pass holds, or a
// ModelError naming the pass; with several ranks, the same error on every rank.
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <exception>
#include <string>

#include "core/engine_internal.h"
#include "core/strings.h"
#include "curv/core/distributed.h"
#include "curv/core/error.h"
#include "curv/core/runtime.h"

namespace curv {

using namespace engine_detail;

const char* CurvatureEngine::pass_name(Pass pass) {
  switch (pass) {
    case Pass::kFirstOrder:
      return "loss and gradient";
    case Pass::kLoss:
      return "loss";
    case Pass::kHvp:
      return "Hessian-vector product";
    case Pass::kGradientAtOffset:
      return "gradient at a displaced θ";
    case Pass::kLossAt:
      return "loss at θ + u";
    case Pass::kGaussNewton:
      return "Gauss-Newton product";
  }
  return "probe pass";
}

OutOfMemory CurvatureEngine::out_of_memory(Pass pass, size_t batch, const std::exception& e) {
  // What the allocator held when it failed, before anything is released.
  const DeviceMemory m = device_memory(device_);
  release_graphs();
  release_free_memory(device_);
  std::string held = fmt::format("{} in use", format_bytes(m.in_use));
  if (m.reserved >= 0) held += fmt::format(", {} reserved", format_bytes(m.reserved));
  if (m.peak >= 0) held += fmt::format(", peak {}", format_bytes(m.peak));
  std::vector<NamedOption> options = {{"EngineOptions.micro_batch", ""},
                                      {"EngineOptions.max_memory", ""},
                                      {"EngineOptions.max_kept_graphs", ""},
                                      {"TaylorOptions.coupling", "none"},
                                      {"ProbeDataOptions.batch_size", ""}};
  if (options_.max_memory > 0) {
    held += "; {5}";
    options.push_back({"EngineOptions.max_memory", format_bytes(options_.max_memory)});
  }
  return OutOfMemory(
      Error::literal(fmt::format("{} ran out of {} memory in the {} of probe batch {} (",
                                 objective_.describe(), device_.str(), pass_name(pass), batch)) +
          held +
          "): lower what a pass holds with {0} (smaller slices of each batch), {1} or {2} "
          "(fewer kept graphs), {3} (one HVP per direction) or a smaller {4}. " +
          Error::literal(brief_what(e)),
      options);
}

void CurvatureEngine::for_each_batch(Pass pass, const std::function<void(size_t, double)>& body) {
  std::exception_ptr failure;
  for (size_t b = first_batch_; b < last_batch_ && !failure; ++b) {
    try {
      body(b, probe_.weight(b));
    } catch (const Error&) {
      failure = std::current_exception();
    } catch (const c10::OutOfMemoryError& e) {
      failure = std::make_exception_ptr(out_of_memory(pass, b, e));
    } catch (const std::exception& e) {
      // LibTorch 1.13's CPU allocator reports exhaustion as a plain c10::Error.
      if (std::string(e.what()).find("not enough memory") != std::string::npos) {
        failure = std::make_exception_ptr(out_of_memory(pass, b, e));
        continue;
      }
      // Only the HVP needs a second derivative: the hint would mislead for the other passes.
      failure = std::make_exception_ptr(ModelError(fmt::format(
          "{}: {} failed on probe batch {}{}: {}", objective_.describe(), pass_name(pass), b,
          pass == Pass::kHvp || pass == Pass::kGaussNewton
              ? fmt::format(" ({})", kTwiceDifferentiableHint)
              : std::string(),
          brief_what(e))));
    }
  }
  // With several ranks, a failure on one stops all of them with the same error.
  raise_if_any_rank_failed(*communicator_, failure);
}

}  // namespace curv
