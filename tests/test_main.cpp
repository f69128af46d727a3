#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "curv/core/runtime.h"

int main(int argc, char* argv[]) {
  curv::init_runtime();
  return Catch::Session().run(argc, argv);
}
