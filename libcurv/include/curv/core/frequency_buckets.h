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

// K buckets of ids by frequency rank: with the ids sorted by probability (ties broken by id), an
// id goes to bucket floor(K · m) where m is the cumulative share of the mass at the middle of its
// own mass. Bucket 0 holds the most probable ids, each bucket about 1/K of the mass (an id is never
// split, so a heavy id can leave a neighbouring bucket empty). Zero-probability ids go to the last
// bucket. InvalidArgument naming `what` unless 2 <= K and the total mass is positive.
at::Tensor quantile_buckets(const std::vector<double>& probabilities, int64_t buckets,
                            const std::string& what);

}  // namespace curv
