#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "curv/core/error.h"

namespace curv::fuzz {

template <typename F>
int run_expecting_clean_errors(F&& body) {
  try {
    body();
  } catch (const curv::Error&) {
    // Bad input rejected with a message: the expected outcome.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "CRASH: exception other than curv::Error: %s\n", e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "CRASH: unknown exception\n");
    std::abort();
  }
  clear_scratch();
  return 0;
}

}  // namespace curv::fuzz
