#include "curv/analysis/token_buckets.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "curv/core/error.h"
#include "curv/core/frequency_buckets.h"

namespace curv {

namespace {

// The objective's loss restricted to the target positions of one bucket, divided by all target
// positions of the batch, so that the buckets' losses sum to the objective's mean loss.
class BucketLossObjective : public Objective {
 public:
  BucketLossObjective(Objective& base, at::Tensor bucket_of_id, int64_t bucket)
      : base_(base), bucket_of_id_(std::move(bucket_of_id)), bucket_(bucket) {}

  const ParamSpace& space() const override { return base_.space(); }
  ParamVector parameters() override { return base_.parameters(); }
  ModelStructure structure() const override { return base_.structure(); }
  std::string describe() const override {
    return fmt::format("{} [token bucket {}]", base_.describe(), bucket_);
  }

  at::Tensor loss(const Batch& batch) override {
    at::Tensor losses = base_.token_losses(batch);
    const at::Tensor valid = batch.targets != kIgnoreIndex;
    const at::Tensor positions = valid.sum().clamp_min(1).to(losses.scalar_type());
    return (losses * mask(batch).to(losses.scalar_type())).sum() / positions;
  }

  at::Tensor token_losses(const Batch& batch) override {
    at::Tensor losses = base_.token_losses(batch);
    return losses * mask(batch).to(losses.scalar_type());
  }

 private:
  at::Tensor mask(const Batch& batch) const {
    const at::Tensor valid = batch.targets != kIgnoreIndex;
    const at::Tensor ids = batch.targets.clamp_min(0).reshape({-1}).to(bucket_of_id_.device());
    return (bucket_of_id_.index({ids}).reshape(batch.targets.sizes()).to(batch.targets.device()) ==
            bucket_) &
           valid;
  }

  Objective& base_;
  at::Tensor bucket_of_id_;
  int64_t bucket_;
};

std::vector<double> read_counts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument(fmt::format("token counts '{}': cannot open the file", path));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw FormatError(fmt::format("token counts '{}': not JSON ({})", path, e.what()));
  }
  if (j.is_object() && j.contains("counts")) j = j["counts"];
  if (!j.is_array() || j.empty()) {
    throw FormatError(fmt::format(
        "token counts '{}': expected a non-empty JSON array of counts indexed by token id, or "
        "an object with one under \"counts\"",
        path));
  }
  std::vector<double> counts;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number() || !std::isfinite(j[i].get<double>()) || j[i].get<double>() < 0) {
      throw FormatError(fmt::format("token counts '{}': entry {} is {}, expected a count >= 0",
                                    path, i, j[i].dump()));
    }
    counts.push_back(j[i].get<double>());
  }
  return counts;
}

}  // namespace

TokenBucketOptions TokenBucketOptions::parse(const std::string& spec) {
  TokenBucketOptions o;
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string value = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const auto invalid = [&](const std::string& why) {
    return InvalidOption("{0}: " + InvalidOption::literal(why),
                         {{"TokenBucketOptions", "'" + InvalidOption::literal(spec) + "'"}});
  };
  auto number = [&](auto& out) {
    try {
      size_t used = 0;
      if constexpr (std::is_same_v<std::decay_t<decltype(out)>, double>) {
        out = std::stod(value, &used);
      } else {
        out = std::stoll(value, &used);
      }
      if (used != value.size()) throw std::invalid_argument("trailing characters");
    } catch (const std::exception&) {
      throw invalid(fmt::format("'{}' is not a number", value));
    }
  };
  if (kind == "head") {
    o.mode = Mode::kHeadTail;
    if (!value.empty()) number(o.head_mass);
  } else if (kind == "quantiles") {
    o.mode = Mode::kQuantiles;
    if (value.empty()) {
      throw invalid("give K, as in quantiles:4");
    }
    number(o.quantiles);
  } else {
    throw invalid("expected head, head:MASS (e.g. head:0.5) or quantiles:K");
  }
  o.validate();
  return o;
}

void TokenBucketOptions::validate() const {
  if (mode == Mode::kHeadTail && !(head_mass > 0 && head_mass < 1)) {
    throw InvalidArgument(fmt::format(
        "token buckets: head mass {} must be in (0, 1) so that both buckets can hold tokens",
        head_mass));
  }
  if (mode == Mode::kQuantiles && (quantiles < 2 || quantiles > 1000)) {
    throw InvalidArgument(
        fmt::format("token buckets: {} quantile buckets; expected 2 to 1000", quantiles));
  }
}

std::string TokenBucketOptions::describe() const {
  std::string s;
  switch (mode) {
    case Mode::kOff:
      return "";
    case Mode::kHeadTail:
      s = fmt::format("head:{}", head_mass);
      break;
    case Mode::kQuantiles:
      s = fmt::format("quantiles:{}", quantiles);
      break;
  }
  return counts_path.empty() ? s : s + " counts=" + counts_path;
}

TokenBuckets make_token_buckets(const TokenBucketOptions& options, const ProbeSet& probe) {
  options.validate();
  if (!options.enabled()) throw InvalidArgument("make_token_buckets: token buckets are off");
  int64_t max_id = -1;
  for (size_t b = 0; b < probe.size(); ++b) {
    const at::Tensor t = probe[b].targets;
    if (at::isFloatingType(t.scalar_type())) {
      throw InvalidArgument(
          "token buckets need integer targets (token or class ids); the probe set's targets are "
          "floating point");
    }
    const at::Tensor valid = t.masked_select(t != kIgnoreIndex);
    if (valid.numel() > 0) max_id = std::max(max_id, valid.max().item<int64_t>());
    if (valid.numel() > 0 && valid.min().item<int64_t>() < 0) {
      throw InvalidArgument(
          fmt::format("token buckets: probe batch {} has a negative target id", b));
    }
  }
  if (max_id < 0) throw InvalidArgument("token buckets: the probe set has no target positions");
  TokenBuckets out;
  std::vector<double> counts;
  if (options.counts_path.empty()) {
    counts.assign(static_cast<size_t>(max_id + 1), 0.0);
    for (size_t b = 0; b < probe.size(); ++b) {
      const at::Tensor t = probe[b].targets.to(at::kCPU, at::kLong).reshape({-1}).contiguous();
      const int64_t* p = t.data_ptr<int64_t>();
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (p[i] != kIgnoreIndex) counts[static_cast<size_t>(p[i])] += 1;
      }
    }
    out.source = "probe set";
  } else {
    counts = read_counts(options.counts_path);
    if (max_id >= static_cast<int64_t>(counts.size())) {
      throw InvalidArgument(
          fmt::format("token counts '{}' cover ids 0 to {}, but the probe set has target id {}",
                      options.counts_path, counts.size() - 1, max_id));
    }
    out.source = options.counts_path;
  }
  if (options.mode == TokenBucketOptions::Mode::kHeadTail) {
    out.bucket_of_id = head_tail_buckets(counts, options.head_mass, "token buckets");
    out.names = {"head", "tail"};
  } else {
    out.bucket_of_id = quantile_buckets(counts, options.quantiles, "token buckets");
    for (int64_t k = 1; k <= options.quantiles; ++k) out.names.push_back(fmt::format("q{}", k));
  }
  const size_t K = out.names.size();
  out.ids.assign(K, 0);
  out.count_share.assign(K, 0.0);
  double total = 0;
  const int64_t* bucket = out.bucket_of_id.data_ptr<int64_t>();
  for (size_t id = 0; id < counts.size(); ++id) {
    ++out.ids[static_cast<size_t>(bucket[id])];
    out.count_share[static_cast<size_t>(bucket[id])] += counts[id];
    total += counts[id];
  }
  for (auto& s : out.count_share) s /= total;
  return out;
}

struct TokenBucketAudit::Bucket {
  std::string name;
  double share = 0;
  std::unique_ptr<BucketLossObjective> objective;
  std::unique_ptr<CurvatureEngine> engine;
};

TokenBucketAudit::TokenBucketAudit(Objective& objective, const ProbeSet& probe,
                                   const TokenBuckets& buckets, const EngineOptions& options) {
  // Share of the probe set's target positions per bucket, weighted as the loss weighs batches.
  std::vector<double> shares(buckets.names.size(), 0.0);
  for (size_t b = 0; b < probe.size(); ++b) {
    const at::Tensor t = probe[b].targets.to(at::kCPU, at::kLong);
    const at::Tensor valid = t != kIgnoreIndex;
    const double n = std::max<double>(1.0, static_cast<double>(valid.sum().item<int64_t>()));
    const at::Tensor ids = t.masked_select(valid);
    const at::Tensor of = buckets.bucket_of_id.index({ids});
    for (size_t k = 0; k < shares.size(); ++k) {
      shares[k] += probe.weight(b) *
                   static_cast<double>((of == static_cast<int64_t>(k)).sum().item<int64_t>()) / n;
    }
  }
  for (size_t k = 0; k < buckets.names.size(); ++k) {
    auto bucket = std::make_unique<Bucket>();
    bucket->name = buckets.names[k];
    bucket->share = shares[k];
    bucket->objective = std::make_unique<BucketLossObjective>(objective, buckets.bucket_of_id,
                                                              static_cast<int64_t>(k));
    bucket->engine = std::make_unique<CurvatureEngine>(*bucket->objective, probe, options);
    buckets_.push_back(std::move(bucket));
  }
}

TokenBucketAudit::~TokenBucketAudit() = default;

std::vector<BucketResult> TokenBucketAudit::audit(const ParamVector& u,
                                                  const BlockPartition& blocks,
                                                  TaylorOptions options,
                                                  const ParamVector* landing) {
  options.coupling = CouplingMode::kNone;
  options.step_multipliers.clear();
  options.ggn = false;  // the bucket losses have no logits of their own
  options.ggn_blocks = false;
  std::vector<BucketResult> out;
  for (auto& bucket : buckets_) {
    BucketResult r;
    r.name = bucket->name;
    r.share = bucket->share;
    r.taylor = taylor_audit(*bucket->engine, u, blocks, options, landing);
    bucket->engine->release_graphs();
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace curv
