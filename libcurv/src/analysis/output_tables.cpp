// Every built-in output table, declared once: the writers build their tables from these layouts,
// the resume reader checks loaded tables against them and docs_test checks that
// docs/hdf5-schema.md lists exactly these columns.
#include "analysis/output_tables.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "curv/core/error.h"
#include "curv/core/statistics.h"

namespace curv {

std::string to_string(ColumnType type) {
  switch (type) {
    case ColumnType::kFloat64:
      return "float64";
    case ColumnType::kInt64:
      return "int64";
    case ColumnType::kString:
      return "string";
  }
  return "?";
}

std::vector<std::string> TableSpec::column_names() const {
  std::vector<std::string> out;
  for (const auto& c : columns) out.push_back(c.name);
  return out;
}

Table TableSpec::empty() const {
  Table t;
  for (const auto& c : columns) {
    switch (c.type) {
      case ColumnType::kFloat64:
        t.add_column(c.name, std::vector<double>{});
        break;
      case ColumnType::kInt64:
        t.add_column(c.name, std::vector<int64_t>{});
        break;
      case ColumnType::kString:
        t.add_column(c.name, std::vector<std::string>{});
        break;
    }
  }
  return t;
}

void TableSpec::check(const Table& table, const std::string& what) const {
  std::vector<std::string> found;
  bool same = table.names() == column_names();
  for (const auto& name : table.names()) {
    const auto& column = table.column(name);
    const ColumnType type =
        std::holds_alternative<std::vector<double>>(column)    ? ColumnType::kFloat64
        : std::holds_alternative<std::vector<int64_t>>(column) ? ColumnType::kInt64
                                                               : ColumnType::kString;
    found.push_back(name + ":" + to_string(type));
  }
  std::vector<std::string> expected;
  for (const auto& c : columns) expected.push_back(c.name + ":" + to_string(c.type));
  same = same && found == expected;
  if (!same) {
    throw FormatError(fmt::format("{}: columns {} where {} are expected", what,
                                  fmt::join(found, ","), fmt::join(expected, ",")));
  }
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Units: the loss's own unit (nats for cross-entropy); u is a displacement in parameter units.
const char* const kLoss = "loss";
const char* const kNds = "loss/parameter²";
const char* const kNorm = "parameter";
const char* const kSqNorm = "parameter²";
const char* const kOne = "1";
const char* const kKey = "";

double ratio_or_nan(double num, double den) { return den > 0.0 ? num / den : kNaN; }

// SE of block l's cross term (u_lᵀ(Hu)_l − C_ll) / ‖u‖² over batches.
double block_cross_stderr(const TaylorBatches& t, size_t l, double u_sq) {
  const auto j = static_cast<Eigen::Index>(l);
  std::vector<double> cross(t.size());
  for (size_t b = 0; b < t.size(); ++b) {
    const auto i = static_cast<Eigen::Index>(b);
    cross[b] = t.block_row_sum(i, j) - t.block_curvature(i, j);
  }
  return batch_stderr(cross, t.weight) / u_sq;
}

double u_sq(const TaylorRow& x) { return x.taylor->update_norm * x.taylor->update_norm; }

// A /taylor column: its value in the whole-model row and in a block row.
template <typename Total, typename Block>
void taylor_column(TableLayout<TaylorRow>& t, const char* name, const char* unit,
                   const char* description, Total total, Block block) {
  t.column(name, unit, description, [total, block](const TaylorRow& x) -> double {
    return x.block ? block(x, *x.block) : total(*x.taylor);
  });
}

void add_taylor_values(TableLayout<TaylorRow>& t) {
  using R = const TaylorResult&;
  using X = const TaylorRow&;
  using B = const BlockTerms&;
  auto nan = [](X, B) { return kNaN; };
  taylor_column(
      t, "loss", kLoss, "L(θ), in block rows too", [](R r) { return r.loss; },
      [](X x, B) { return x.taylor->loss; });
  taylor_column(
      t, "first_order", kLoss, "g·u; block: g_l·u_l", [](R r) { return r.first_order; },
      [](X, B b) { return b.first_order; });
  taylor_column(
      t, "curvature", kLoss, "uᵀHu; block: C_ll", [](R r) { return r.curvature; },
      [](X, B b) { return b.curvature; });
  taylor_column(
      t, "predicted", kLoss, "g·u + ½ uᵀHu; block: its share g_l·u_l + ½ u_lᵀ(Hu)_l",
      [](R r) { return r.predicted; }, [](X, B b) { return b.first_order + 0.5 * b.row_sum; });
  taylor_column(
      t, "realized", kLoss, "L(θ+u) − L(θ); NaN in block rows", [](R r) { return r.realized; },
      nan);
  taylor_column(
      t, "nds", kNds, "uᵀHu / ‖u‖²; block: C_ll / ‖u_l‖²", [](R r) { return r.nds; },
      [](X, B b) { return b.nds; });
  taylor_column(
      t, "update_norm", kNorm, "‖u‖; block: ‖u_l‖", [](R r) { return r.update_norm; },
      [](X, B b) { return std::sqrt(b.sq_norm); });
  taylor_column(
      t, "sq_norm", kSqNorm, "‖u‖²; block: ‖u_l‖²",
      [](R r) { return r.update_norm * r.update_norm; }, [](X, B b) { return b.sq_norm; });
  taylor_column(
      t, "row_sum", kLoss, "uᵀHu; block: u_lᵀ(Hu)_l", [](R r) { return r.curvature; },
      [](X, B b) { return b.row_sum; });
  taylor_column(
      t, "within", kNds, "S_within; block: C_ll / ‖u‖²", [](R r) { return r.s_within; },
      [](X x, B b) { return b.curvature / u_sq(x); });
  taylor_column(
      t, "cross", kNds, "S_cross; block: (u_lᵀ(Hu)_l − C_ll) / ‖u‖²", [](R r) { return r.s_cross; },
      [](X x, B b) { return (b.row_sum - b.curvature) / u_sq(x); });
  taylor_column(
      t, "rho_within", kOne, "S_within / NDS; NaN in block rows", [](R r) { return r.rho_within; },
      nan);
  taylor_column(
      t, "eta_star", kOne, "−g·u / uᵀHu when uᵀHu > 0; NaN in block rows",
      [](R r) { return r.eta_star; }, nan);
  taylor_column(
      t, "loss_stderr", kLoss, "SE of loss", [](R r) { return r.loss_stderr; },
      [](X x, B) { return x.taylor->loss_stderr; });
  taylor_column(
      t, "first_order_stderr", kLoss, "SE of first_order", [](R r) { return r.first_order_stderr; },
      [](X, B b) { return b.first_order_stderr; });
  taylor_column(
      t, "curvature_stderr", kLoss, "SE of curvature", [](R r) { return r.curvature_stderr; },
      [](X, B b) { return b.curvature_stderr; });
  taylor_column(
      t, "predicted_stderr", kLoss, "SE of predicted", [](R r) { return r.predicted_stderr; },
      [](X, B b) { return b.predicted_stderr; });
  taylor_column(
      t, "realized_stderr", kLoss, "SE of realized; NaN in block rows",
      [](R r) { return r.realized_stderr; }, nan);
  taylor_column(
      t, "nds_stderr", kNds, "SE of nds", [](R r) { return r.nds_stderr; },
      [](X, B b) { return b.nds_stderr; });
  taylor_column(
      t, "row_sum_stderr", kLoss, "SE of row_sum", [](R r) { return r.curvature_stderr; },
      [](X, B b) { return b.row_sum_stderr; });
  taylor_column(
      t, "within_stderr", kNds, "SE of within", [](R r) { return r.s_within_stderr; },
      [](X x, B b) { return b.curvature_stderr / u_sq(x); });
  taylor_column(
      t, "cross_stderr", kNds, "SE of cross", [](R r) { return r.s_cross_stderr; },
      [](X x, B) { return block_cross_stderr(x.taylor->batches, x.index, u_sq(x)); });
  taylor_column(
      t, "rho_within_stderr", kOne, "SE of rho_within; NaN in block rows",
      [](R r) { return r.rho_within_stderr; }, nan);
  taylor_column(
      t, "eta_star_stderr", kOne, "SE of eta_star; NaN in block rows",
      [](R r) { return r.eta_star_stderr; }, nan);
  taylor_column(
      t, "ggn_curvature", kLoss, "the Gauss-Newton split: uᵀGu; block (the blocks' split): G_ll",
      [](R r) { return r.ggn_curvature; }, [](X, B b) { return b.ggn_curvature; });
  taylor_column(
      t, "ggn_nds", kNds, "the Gauss-Newton split: uᵀGu / ‖u‖²; block: G_ll / ‖u_l‖²",
      [](R r) { return r.ggn_nds; }, [](X, B b) { return b.ggn_nds; });
  taylor_column(
      t, "residual_nds", kNds,
      "the Gauss-Newton split: (uᵀHu − uᵀGu) / ‖u‖²; block: (C_ll − G_ll) / ‖u_l‖²",
      [](R r) { return r.residual_nds; },
      [](X, B b) { return ratio_or_nan(b.residual_curvature, b.sq_norm); });
  taylor_column(
      t, "ggn_nds_stderr", kNds, "SE of ggn_nds", [](R r) { return r.ggn_nds_stderr; },
      [](X, B b) { return ratio_or_nan(b.ggn_curvature_stderr, b.sq_norm); });
  taylor_column(
      t, "residual_nds_stderr", kNds, "SE of residual_nds",
      [](R r) { return r.residual_nds_stderr; },
      [](X, B b) { return ratio_or_nan(b.residual_curvature_stderr, b.sq_norm); });
}

template <typename Row>
void add_unit_keys(TableLayout<Row>& t) {
  t.column("run", kKey, "run name", [](const Row& x) { return x.key->run; })
      .column("step", kKey, "checkpoint step", [](const Row& x) { return x.key->step; })
      .column("direction", kKey, "direction name", [](const Row& x) { return x.key->direction; });
}

}  // namespace

const TableLayout<TaylorRow>& taylor_layout() {
  static const TableLayout<TaylorRow> layout = [] {
    TableLayout<TaylorRow> t("/taylor", "## `/taylor` (long table)");
    add_unit_keys(t);
    t.column("block", kKey, "\"total\" or the block's name",
             [](const TaylorRow& x) { return x.block ? x.block->name : std::string("total"); });
    add_taylor_values(t);
    return t;
  }();
  return layout;
}

const TableLayout<StatusRow>& status_layout() {
  static const TableLayout<StatusRow> layout = [] {
    TableLayout<StatusRow> t("/status", "## `/status` (long table)");
    t.column("run", kKey, "run name", [](const StatusRow& x) { return x.key.run; })
        .column("step", kKey, "checkpoint step", [](const StatusRow& x) { return x.key.step; })
        .column("direction", kKey, "direction name",
                [](const StatusRow& x) { return x.key.direction; })
        .column("status", kKey, "unavailable, zero_direction, failed",
                [](const StatusRow& x) { return x.status; })
        .column("message", kKey, "the reason", [](const StatusRow& x) { return x.message; });
    return t;
  }();
  return layout;
}

const TableLayout<BucketRow>& unit_token_buckets_layout() {
  static const TableLayout<BucketRow> layout = [] {
    using X = const BucketRow&;
    TableLayout<BucketRow> t("token_buckets", "### `token_buckets` (table, ");
    t.column("bucket", kKey, "bucket name", [](X x) { return x.bucket->name; })
        .column("share", kOne, "share of the target positions in the bucket",
                [](X x) { return x.bucket->share; })
        .column("loss", kLoss, "L_k", [](X x) { return x.bucket->taylor.loss; })
        .column("first_order", kLoss, "g_k·u", [](X x) { return x.bucket->taylor.first_order; })
        .column("curvature", kLoss, "uᵀH_k u", [](X x) { return x.bucket->taylor.curvature; })
        .column("predicted", kLoss, "g_k·u + ½ uᵀH_k u",
                [](X x) { return x.bucket->taylor.predicted; })
        .column("realized", kLoss, "L_k(θ+u) − L_k(θ)",
                [](X x) { return x.bucket->taylor.realized; })
        .column("nds", kNds, "uᵀH_k u / ‖u‖²", [](X x) { return x.bucket->taylor.nds; })
        .column("loss_mean", kLoss, "loss / share",
                [](X x) { return ratio_or_nan(x.bucket->taylor.loss, x.bucket->share); })
        .column("nds_mean", kNds, "nds / share",
                [](X x) { return ratio_or_nan(x.bucket->taylor.nds, x.bucket->share); })
        .column("loss_stderr", kLoss, "SE of loss",
                [](X x) { return x.bucket->taylor.loss_stderr; })
        .column("first_order_stderr", kLoss, "SE of first_order",
                [](X x) { return x.bucket->taylor.first_order_stderr; })
        .column("curvature_stderr", kLoss, "SE of curvature",
                [](X x) { return x.bucket->taylor.curvature_stderr; })
        .column("predicted_stderr", kLoss, "SE of predicted",
                [](X x) { return x.bucket->taylor.predicted_stderr; })
        .column("realized_stderr", kLoss, "SE of realized",
                [](X x) { return x.bucket->taylor.realized_stderr; })
        .column("nds_stderr", kNds, "SE of nds", [](X x) { return x.bucket->taylor.nds_stderr; });
    return t;
  }();
  return layout;
}

const TableLayout<BucketRow>& token_buckets_layout() {
  static const TableLayout<BucketRow> layout = [] {
    TableLayout<BucketRow> t("/token_buckets", "## `/token_buckets` (long table, ");
    add_unit_keys(t);
    t.columns_of(unit_token_buckets_layout(), [](const BucketRow& x) { return x; });
    return t;
  }();
  return layout;
}

const TableLayout<ComparisonRow>& comparisons_layout() {
  static const TableLayout<ComparisonRow> layout = [] {
    using X = const ComparisonRow&;
    TableLayout<ComparisonRow> t("/comparisons", "## `/comparisons` (long table, ");
    t.column("pair", kKey, "the pair as given, A:B", [](X x) { return x.pair; })
        .column("run_a", kKey, "run of side A", [](X x) { return x.run_a; })
        .column("direction_a", kKey, "direction of side A", [](X x) { return x.direction_a; })
        .column("run_b", kKey, "run of side B", [](X x) { return x.run_b; })
        .column("direction_b", kKey, "direction of side B", [](X x) { return x.direction_b; })
        .column("step", kKey, "checkpoint step", [](X x) { return x.step; })
        .column("nds_a", kNds, "NDS of A", [](X x) { return x.nds.nds_a; })
        .column("nds_b", kNds, "NDS of B", [](X x) { return x.nds.nds_b; })
        .column("difference", kNds, "NDS_a − NDS_b", [](X x) { return x.nds.difference; })
        .column("difference_stderr", kNds, "SE of the per-batch differences",
                [](X x) { return x.nds.difference_stderr; })
        .column("ratio", kOne, "NDS_a / NDS_b", [](X x) { return x.nds.ratio; })
        .column("ratio_stderr", kOne, "delta-method SE of the ratio",
                [](X x) { return x.nds.ratio_stderr; });
    return t;
  }();
  return layout;
}

const TableLayout<BlockTerms>& blocks_layout() {
  static const TableLayout<BlockTerms> layout = [] {
    using B = const BlockTerms&;
    TableLayout<BlockTerms> t("blocks", "### `blocks` (table)");
    t.column("name", kKey, "block name", [](B b) { return b.name; })
        .column("sq_norm", kSqNorm, "‖u_l‖²", [](B b) { return b.sq_norm; })
        .column("first_order", kLoss, "g_l·u_l", [](B b) { return b.first_order; })
        .column("curvature", kLoss, "C_ll = u_lᵀ H_ll u_l", [](B b) { return b.curvature; })
        .column("row_sum", kLoss, "u_lᵀ(Hu)_l", [](B b) { return b.row_sum; })
        .column("nds", kNds, "C_ll / ‖u_l‖²", [](B b) { return b.nds; })
        .column("first_order_stderr", kLoss, "SE of first_order",
                [](B b) { return b.first_order_stderr; })
        .column("curvature_stderr", kLoss, "SE of curvature",
                [](B b) { return b.curvature_stderr; })
        .column("row_sum_stderr", kLoss, "SE of row_sum", [](B b) { return b.row_sum_stderr; })
        .column("predicted_stderr", kLoss, "SE of g_l·u_l + ½ u_lᵀ(Hu)_l",
                [](B b) { return b.predicted_stderr; })
        .column("nds_stderr", kNds, "SE of nds", [](B b) { return b.nds_stderr; })
        .column("curvature_sign_stderr", kLoss, "random coupling: Monte Carlo SE of C_ll",
                [](B b) { return b.curvature_sign_stderr; })
        .column("ggn_curvature", kLoss, "the blocks' Gauss-Newton split: G_ll",
                [](B b) { return b.ggn_curvature; })
        .column("ggn_nds", kNds, "the blocks' Gauss-Newton split: G_ll / ‖u_l‖²",
                [](B b) { return b.ggn_nds; })
        .column("residual_curvature", kLoss, "the blocks' Gauss-Newton split: C_ll − G_ll",
                [](B b) { return b.residual_curvature; })
        .column("ggn_curvature_stderr", kLoss, "SE of ggn_curvature",
                [](B b) { return b.ggn_curvature_stderr; })
        .column("residual_curvature_stderr", kLoss, "SE of residual_curvature",
                [](B b) { return b.residual_curvature_stderr; });
    return t;
  }();
  return layout;
}

const TableLayout<BatchRow>& batches_layout() {
  static const TableLayout<BatchRow> layout = [] {
    using X = const BatchRow&;
    TableLayout<BatchRow> t("batches", "### `batches` (table and datasets)");
    t.column("weight", kOne, "w_b = N_b / N", [](X x) { return x.batches->weight[x.index]; })
        .column("loss", kLoss, "L_b(θ)", [](X x) { return x.batches->loss[x.index]; })
        .column("first_order", kLoss, "g_b·u", [](X x) { return x.batches->first_order[x.index]; })
        .column("curvature", kLoss, "uᵀ H_b u", [](X x) { return x.batches->curvature[x.index]; })
        .column("realized", kLoss, "L_b(θ+u) − L_b(θ)",
                [](X x) { return x.batches->realized[x.index]; })
        .column("within", kLoss, "Σ_l u_lᵀ H_b,ll u_l",
                [](X x) { return x.batches->within[x.index]; })
        .column("ggn", kLoss, "uᵀ G_b u", [](X x) { return x.batches->ggn[x.index]; });
    return t;
  }();
  return layout;
}

const TableLayout<MultiplierTerms>& multipliers_layout() {
  static const TableLayout<MultiplierTerms> layout = [] {
    using M = const MultiplierTerms&;
    TableLayout<MultiplierTerms> t("multipliers", "### `multipliers` (table, ");
    t.column("eta", kOne, "η", [](M m) { return m.eta; })
        .column("predicted", kLoss, "η g·u + ½ η² uᵀHu", [](M m) { return m.predicted; })
        .column("realized", kLoss, "L(θ + η u) − L(θ)", [](M m) { return m.realized; })
        .column("predicted_stderr", kLoss, "SE of predicted",
                [](M m) { return m.predicted_stderr; })
        .column("realized_stderr", kLoss, "SE of realized", [](M m) { return m.realized_stderr; });
    return t;
  }();
  return layout;
}

const TableLayout<ModeTerms>& modes_layout() {
  static const TableLayout<ModeTerms> layout = [] {
    using M = const ModeTerms&;
    TableLayout<ModeTerms> t("modes", "`modes` (table)");
    t.column("index", kKey, "i (0 = largest singular value)", [](M m) { return m.index; })
        .column("sigma", kNorm, "σ_i", [](M m) { return m.sigma; })
        .column("energy_share", kOne, "σ_i² / Σ_j σ_j²", [](M m) { return m.energy_share; })
        .column("curvature", kNds, "κ_i along the unit-norm mode a_i b_iᵀ",
                [](M m) { return m.curvature; });
    return t;
  }();
  return layout;
}

const TableLayout<GroupTerms>& groups_layout() {
  static const TableLayout<GroupTerms> layout = [] {
    using G = const GroupTerms&;
    TableLayout<GroupTerms> t("groups", "`groups` (table)");
    t.column("name", kKey, "group name", [](G g) { return g.name; })
        .column("sq_norm", kSqNorm, "‖U_g‖²", [](G g) { return g.sq_norm; })
        .column("curvature", kLoss, "U_gᵀ H U_g", [](G g) { return g.curvature; })
        .column("nds", kNds, "U_gᵀ H U_g / ‖U_g‖²", [](G g) { return g.nds; });
    return t;
  }();
  return layout;
}

void append_eigen_rows(std::vector<EigenRow>& rows, const std::string& block,
                       const EigenResult& result) {
  for (const auto& [which, pairs] :
       {std::pair{"largest", &result.largest}, std::pair{"smallest", &result.smallest},
        std::pair{"dominant", &result.dominant}}) {
    for (size_t i = 0; i < pairs->size(); ++i) {
      rows.push_back({block, which, static_cast<int64_t>(i), &(*pairs)[i], &result});
    }
  }
}

const TableLayout<EigenRow>& eigen_layout() {
  static const TableLayout<EigenRow> layout = [] {
    using E = const EigenRow&;
    TableLayout<EigenRow> t("eigen", "### `eigen` (table, ");
    t.column("block", kKey, "\"total\" or the block's name", [](E e) { return e.block; })
        .column("which", kKey, "largest, smallest or dominant", [](E e) { return e.which; })
        .column("rank", kKey, "0 for the extreme eigenvalue", [](E e) { return e.rank; })
        .column("eigenvalue", kNds, "the Ritz value", [](E e) { return e.pair->value; })
        .column("residual", kNds, "‖Hv − θv‖", [](E e) { return e.pair->residual; })
        .column("error_bound", kNds, "lanczos: the bound on |θ − λ| used",
                [](E e) { return e.pair->error_bound; })
        .column("hvps", "HVPs", "HVPs of this block's solve", [](E e) { return e.result->hvps; })
        .column("converged", kOne, "1 when every requested pair converged",
                [](E e) { return static_cast<int64_t>(e.result->converged() ? 1 : 0); });
    return t;
  }();
  return layout;
}

const TableLayout<TraceRow>& trace_layout() {
  static const TableLayout<TraceRow> layout = [] {
    using T = const TraceRow&;
    TableLayout<TraceRow> t("trace", "### `trace` (table, ");
    t.column("block", kKey, "\"total\" or the block's name", [](T x) { return x.block; })
        .column("estimate", kNds, "estimate of tr(H)", [](T x) { return x.trace->estimate; })
        .column("standard_error", kNds, "SE of the estimate",
                [](T x) { return x.trace->standard_error; })
        .column("matvecs", "HVPs", "HVPs spent", [](T x) { return x.trace->matvecs; })
        .column("samples", kOne, "Rademacher samples of the stochastic part",
                [](T x) { return x.trace->samples; });
    return t;
  }();
  return layout;
}

const TableLayout<TaylorResult>& unit_attributes_layout() {
  static const TableLayout<TaylorResult> layout = [] {
    using R = const TaylorResult&;
    TableLayout<TaylorResult> t("<unit>",
                                "## `/runs/<run>/step_<N>/<direction>` (a unit with results)");
    t.column("loss", kLoss, "L(θ)", [](R r) { return r.loss; })
        .column("first_order", kLoss, "g·u", [](R r) { return r.first_order; })
        .column("curvature", kLoss, "uᵀHu", [](R r) { return r.curvature; })
        .column("predicted", kLoss, "g·u + ½ uᵀHu", [](R r) { return r.predicted; })
        .column("realized", kLoss, "L(θ+u) − L(θ)", [](R r) { return r.realized; })
        .column("routing_changed", kOne,
                "a mixture of experts: the share of routing choices (token × routed layer) whose "
                "experts differ between θ and θ+u, where the quadratic model holds the routing "
                "fixed; NaN for other models or without the realized change",
                [](R r) { return r.routing_changed; })
        .column("nds", kNds, "uᵀHu / ‖u‖²", [](R r) { return r.nds; })
        .column("eta_star", kOne, "η*", [](R r) { return r.eta_star; })
        .column("update_norm", kNorm, "‖u‖", [](R r) { return r.update_norm; })
        .column("s_within", kNds, "S_within", [](R r) { return r.s_within; })
        .column("s_cross", kNds, "S_cross", [](R r) { return r.s_cross; })
        .column("rho_within", kOne, "ρ_within", [](R r) { return r.rho_within; })
        .column("seconds", "s", "wall time of the audit", [](R r) { return r.seconds; })
        .column("loss_stderr", kLoss, "SE of loss", [](R r) { return r.loss_stderr; })
        .column("first_order_stderr", kLoss, "SE of first_order",
                [](R r) { return r.first_order_stderr; })
        .column("curvature_stderr", kLoss, "SE of curvature",
                [](R r) { return r.curvature_stderr; })
        .column("predicted_stderr", kLoss, "SE of predicted",
                [](R r) { return r.predicted_stderr; })
        .column("realized_stderr", kLoss, "SE of realized", [](R r) { return r.realized_stderr; })
        .column("nds_stderr", kNds, "SE of nds", [](R r) { return r.nds_stderr; })
        .column("eta_star_stderr", kOne, "SE of eta_star", [](R r) { return r.eta_star_stderr; })
        .column("s_within_stderr", kNds, "SE of s_within", [](R r) { return r.s_within_stderr; })
        .column("s_cross_stderr", kNds, "SE of s_cross", [](R r) { return r.s_cross_stderr; })
        .column("rho_within_stderr", kOne, "SE of rho_within",
                [](R r) { return r.rho_within_stderr; })
        .column("ggn_curvature", kLoss, "uᵀGu", [](R r) { return r.ggn_curvature; })
        .column("ggn_nds", kNds, "uᵀGu / ‖u‖²", [](R r) { return r.ggn_nds; })
        .column("residual_curvature", kLoss, "uᵀHu − uᵀGu",
                [](R r) { return r.residual_curvature; })
        .column("residual_nds", kNds, "(uᵀHu − uᵀGu) / ‖u‖²", [](R r) { return r.residual_nds; })
        .column("ggn_nds_stderr", kNds, "SE of ggn_nds", [](R r) { return r.ggn_nds_stderr; })
        .column("residual_nds_stderr", kNds, "SE of residual_nds",
                [](R r) { return r.residual_nds_stderr; })
        .column("hvps", "HVPs", "HVPs of the audit", [](R r) { return r.hvps; })
        .column("coupling_mode", kKey, "full, random or none",
                [](R r) { return to_string(r.coupling_mode); });
    return t;
  }();
  return layout;
}

std::vector<TableSpec> output_table_specs() {
  return {blocks_layout().spec(),      batches_layout().spec(),
          multipliers_layout().spec(), unit_token_buckets_layout().spec(),
          modes_layout().spec(),       groups_layout().spec(),
          eigen_layout().spec(),       trace_layout().spec(),
          taylor_layout().spec(),      token_buckets_layout().spec(),
          comparisons_layout().spec(), status_layout().spec()};
}

}  // namespace curv
