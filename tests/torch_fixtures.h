// The PyTorch files of tests/python/make_torch_fixtures.py, written once per test run by Debian's
// torch into a temporary directory shared by the torch_file and torch_checkpoint tests.
#pragma once

#include <string>

namespace curv_test {

// The fixture directory (created on first use); see make_torch_fixtures.py for its contents.
const std::string& torch_fixtures();

}  // namespace curv_test
