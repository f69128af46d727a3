// Head/tail buckets of ids by probability mass: the split behind the Zipf-PCFG token buckets and
// the associative memory's class buckets (the tail-end papers' lens on imbalanced data).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace curv {

constexpr int64_t kHeadBucket = 0;
constexpr int64_t kTailBucket = 1;

// Bucket per id: the most probable ids (ties broken by id) until they hold `head_mass` of the
// total probability are kHeadBucket, the rest (zero-probability ids included) kTailBucket.
// InvalidArgument naming `what` unless head_mass is in (0, 1].
at::Tensor head_tail_buckets(const std::vector<double>& probabilities, double head_mass,
                             const std::string& what);

}  // namespace curv
