// The process's resident memory from /proc, for benchmarks that report the most memory a step
// held: reset the peak, run the step, read the peak.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace curv_bench {

// A field of /proc/self/status in bytes (VmRSS, VmHWM); -1 when absent.
inline int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

// Resets VmHWM to the current resident set (/proc/self/clear_refs, 5).
inline void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace curv_bench
