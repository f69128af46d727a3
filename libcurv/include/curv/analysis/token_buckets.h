// Token-frequency buckets, the tail-end papers' lens on imbalanced data: the probe loss split by
// the frequency of each position's target token (head and tail, or K quantile buckets), and the
// Taylor audit of each bucket's share of the loss. The shares add up to the whole loss, so the
// buckets' g·u, uᵀHu and NDS add up to the totals exactly.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "curv/analysis/taylor.h"
#include "curv/core/blocks.h"
#include "curv/core/engine.h"
#include "curv/core/objective.h"
#include "curv/core/probe_set.h"

namespace curv {

struct TokenBucketOptions {
  enum class Mode { kOff, kHeadTail, kQuantiles };
  Mode mode = Mode::kOff;
  // kHeadTail: the most frequent token ids holding this share of the target occurrences.
  double head_mass = 0.5;
  // kQuantiles: K buckets by frequency rank, each holding about 1/K of the occurrences.
  int64_t quantiles = 4;
  // Token counts from this file (a JSON array of non-negative numbers indexed by token id, or an
  // object with such an array under "counts"); empty: the probe set's own target counts.
  std::string counts_path;

  // "head" | "head:MASS" | "quantiles:K"; InvalidArgument naming the text.
  static TokenBucketOptions parse(const std::string& spec);
  bool enabled() const { return mode != Mode::kOff; }
  std::string describe() const;  // "head:0.5", "quantiles:4", with the counts file if any
  void validate() const;
};

struct TokenBuckets {
  at::Tensor bucket_of_id;          // int64 [V]: the bucket of each token id
  std::vector<std::string> names;   // "head", "tail" or "q1" … "qK" (q1 most frequent)
  std::vector<int64_t> ids;         // token ids per bucket
  std::vector<double> count_share;  // share of the counts (probe set or file) per bucket
  std::string source;               // "probe set" or the counts file
};

// The buckets of `options` from the probe set's targets or the counts file. InvalidArgument or
// FormatError naming the file for unreadable counts, negative or non-finite values, or a probe
// target id outside the counts' range.
TokenBuckets make_token_buckets(const TokenBucketOptions& options, const ProbeSet& probe);

struct BucketResult {
  std::string name;
  // Share of the probe set's target positions in the bucket: L_k / share is the bucket's mean
  // per-token loss, and NDS_k / share the NDS of that mean.
  double share = 0;
  TaylorResult taylor;  // of L_k = (1/n) Σ_{i: bucket(y_i) = k} ℓ_i, n all target positions
};

// One engine per bucket over the engine's probe batches, at the objective's current parameters:
// build it after the parameters are set, and audit any number of directions there. Each bucket
// costs, per batch and direction, a forward, a first backward with graph and one second backward
// (plus a forward for the realized change); its graphs are released after its audit, so at most
// one bucket's graphs are held beside the main engine's. Needs Objective::token_losses.
class TokenBucketAudit {
 public:
  TokenBucketAudit(Objective& objective, const ProbeSet& probe, const TokenBuckets& buckets,
                   const EngineOptions& options);
  ~TokenBucketAudit();
  TokenBucketAudit(const TokenBucketAudit&) = delete;
  TokenBucketAudit& operator=(const TokenBucketAudit&) = delete;

  // Taylor audits of u per bucket: totals, block row sums and standard errors (options.coupling
  // is forced to kNone, one HVP per bucket; step multipliers and the Gauss-Newton split are not
  // evaluated per bucket). `landing`: θ + u as a point, as for taylor_audit.
  std::vector<BucketResult> audit(const ParamVector& u, const BlockPartition& blocks,
                                  TaylorOptions options, const ParamVector* landing = nullptr);

 private:
  struct Bucket;
  std::vector<std::unique_ptr<Bucket>> buckets_;
};

}  // namespace curv
