// SplitMix64: a tiny, fully specified generator. libcurv's data generators use it rather than
// std:: distributions, whose outputs differ between standard libraries: the same seed must give
// the same data everywhere.
#pragma once

#include <cstdint>

namespace curv {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace curv
