// The unit analyses that break a direction down: the Taylor audit itself (with the Gauss-Newton
// split), its token-frequency buckets and the within-block breakdown.
#include "analysis/builtin_analyses.h"

#include <fmt/format.h>

#include "analysis/output_tables.h"
#include "curv/analysis/report.h"
#include "curv/analysis/taylor.h"
#include "curv/analysis/token_buckets.h"
#include "curv/analysis/within.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"

namespace curv {

namespace {

class TaylorAnalysis : public UnitAnalysis {
 public:
  explicit TaylorAnalysis(TaylorOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "taylor"; }

  void begin_run(CurvatureEngine& engine, ProbeReport&) override {
    if (!options_.ggn) return;
    // Before any unit: an objective without logits cannot give the split.
    try {
      engine.objective().logits(engine.probe()[0]);
    } catch (const Error& e) {
      throw InvalidOption("{0}: " + InvalidOption::literal(e.what()), {{"TaylorOptions.ggn", ""}});
    }
  }

  void unit(UnitContext& c) override {
    result_ = taylor_audit(c.engine, c.u, c.blocks, options_, c.landing);
    c.report.add_taylor(c.run, c.step, c.direction, result_);
    c.taylor = &result_;
  }

 private:
  TaylorOptions options_;
  TaylorResult result_;  // the current unit's, read by the analyses after this one
};

class TokenBucketAnalysis : public UnitAnalysis {
 public:
  TokenBucketAnalysis(TokenBucketOptions options, TaylorOptions taylor)
      : options_(std::move(options)), taylor_(std::move(taylor)) {}
  std::string name() const override { return "token_buckets"; }

  void begin_run(CurvatureEngine& engine, ProbeReport& report) override {
    buckets_ = make_token_buckets(options_, engine.probe());
    const ReportGroup root = report.root();
    root.attribute("token_buckets", options_.describe());
    root.attribute("token_bucket_names", buckets_.names);
    root.attribute("token_bucket_source", buckets_.source);
    root.attribute("token_bucket_count_share", buckets_.count_share);
    const at::Tensor of = buckets_.bucket_of_id.contiguous();
    root.dataset("token_bucket_of_id",
                 std::vector<int64_t>(of.data_ptr<int64_t>(), of.data_ptr<int64_t>() + of.numel()));
  }

  CheckpointWork begin_checkpoint(CheckpointContext&) override {
    // The audit's engines hold graphs at the previous checkpoint's parameters.
    audit_.reset();
    return CheckpointWork::kNone;
  }

  void unit(UnitContext& c) override {
    if (!c.nonzero()) return;
    // Built at the first unit that needs it, after θ is set: its engines share the objective.
    if (!audit_) {
      audit_ = std::make_unique<TokenBucketAudit>(c.engine.objective(), c.engine.probe(), buckets_,
                                                  c.engine.options());
    }
    c.report.add_token_buckets(c.run, c.step, c.direction,
                               audit_->audit(c.u, c.blocks, taylor_, c.landing));
  }

 private:
  TokenBucketOptions options_;
  TaylorOptions taylor_;
  TokenBuckets buckets_;
  std::unique_ptr<TokenBucketAudit> audit_;
};

class WithinAnalysis : public UnitAnalysis {
 public:
  WithinAnalysis(WithinOptions options, bool heads_from_model)
      : options_(std::move(options)), heads_from_model_(heads_from_model) {}
  std::string name() const override { return "within"; }

  void begin_run(CurvatureEngine& engine, ProbeReport&) override {
    if (heads_from_model_) options_.n_head = engine.objective().structure().n_head;
  }

  void unit(UnitContext& c) override {
    if (!c.nonzero()) return;
    c.report.add_within(c.run, c.step, c.direction, within_block(c.engine, c.u, options_));
  }

 private:
  WithinOptions options_;
  bool heads_from_model_;
};

}  // namespace

std::unique_ptr<UnitAnalysis> make_taylor_analysis(const ProbeRunOptions& options) {
  return std::make_unique<TaylorAnalysis>(options.taylor);
}

std::unique_ptr<UnitAnalysis> make_token_bucket_analysis(const ProbeRunOptions& options) {
  if (!options.token_buckets.enabled()) return nullptr;
  return std::make_unique<TokenBucketAnalysis>(options.token_buckets, options.taylor);
}

std::unique_ptr<UnitAnalysis> make_within_analysis(const ProbeRunOptions& options) {
  if (!options.within) return nullptr;
  return std::make_unique<WithinAnalysis>(options.within_options, options.within_heads_from_model);
}

}  // namespace curv
