#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "curv/core/runtime.h"

int main(int argc, char* argv[]) {
  // The same BLAS kernels as the tools, whose results the tests compare with their own.
  curv::reexec_for_blas_kernels(argv);
  curv::init_runtime();
  return Catch::Session().run(argc, argv);
}
