// Shared pieces of the libFuzzer harnesses: a per-process scratch folder in /dev/shm for APIs
// that read files, and the rule that a curv::Error is the expected answer to bad input while
// anything else (another exception, a sanitizer report, a signal) is a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace curv::fuzz {

// A folder private to this process (created once, emptied by clear()), removed at exit.
const std::string& scratch_dir();
// Removes everything inside scratch_dir().
void clear_scratch();
// Writes `size` bytes to scratch_dir()/name (sub-folders created) and returns the path.
std::string write_file(const std::string& name, const uint8_t* data, size_t size);
std::string write_file(const std::string& name, std::string_view bytes);
// Splits the input at each occurrence of `separator` into at most `parts` pieces (the last one
// keeps the rest), so one input can fill several files of a folder.
std::vector<std::string_view> split(const uint8_t* data, size_t size, std::string_view separator,
                                    size_t parts);

// Runs `body`; a curv::Error is swallowed (a clean rejection), anything else propagates and
// libFuzzer reports it as a crash ("uncaught exception" with its what()).
template <typename F>
int run_expecting_clean_errors(F&& body);

}  // namespace curv::fuzz

#include "fuzz_support_inl.h"
