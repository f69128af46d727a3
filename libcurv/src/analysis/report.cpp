#include "curv/analysis/report.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <variant>

#include "curv/analysis/taylor.h"
#include "curv/analysis/token_buckets.h"
#include "curv/analysis/within.h"
#include "curv/core/distributed.h"
#include "curv/core/error.h"
#include "curv/core/runtime.h"
#include "curv/core/statistics.h"
#include "curv/io/h5_file.h"

namespace curv {

Provenance make_provenance(const std::string& tool, const std::string& command_line,
                           const std::string& dtype, uint64_t seed, int threads) {
  Provenance p;
  p.tool = tool;
  p.version = library_version();
  p.command_line = command_line;
  p.dtype = dtype;
  p.seed = static_cast<int64_t>(seed);
  p.threads = threads == 0 ? hardware_threads() : threads;
  p.runtime = runtime_summary();
  return p;
}

std::string join_command_line(int argc, const char* const* argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    if (i) out += ' ';
    out += argv[i];
  }
  return out;
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Columns of the long table /taylor, in order. Kept in one place: the writer, the resume check
// and docs/hdf5-schema.md follow it.
// clang-format off
const std::vector<std::string> kTaylorDoubles = {
    "loss", "first_order", "curvature", "predicted", "realized", "nds", "update_norm", "sq_norm",
    "row_sum", "within", "cross", "rho_within", "eta_star",
    "loss_stderr", "first_order_stderr", "curvature_stderr", "predicted_stderr",
    "realized_stderr", "nds_stderr", "row_sum_stderr", "within_stderr", "cross_stderr",
    "rho_within_stderr", "eta_star_stderr",
    "ggn_curvature", "ggn_nds", "residual_nds", "ggn_nds_stderr", "residual_nds_stderr"};
// clang-format on

// The results layout; a file of another schema is not resumed into.
const char* kSchema = "libcurv-probe/2";

Table empty_taylor_table() {
  Table t;
  t.add_column("run", std::vector<std::string>{});
  t.add_column("step", std::vector<int64_t>{});
  t.add_column("direction", std::vector<std::string>{});
  t.add_column("block", std::vector<std::string>{});
  for (const auto& c : kTaylorDoubles) t.add_column(c, std::vector<double>{});
  return t;
}

// Columns of /token_buckets and of each unit's token_buckets table after its keys.
const std::vector<std::string> kBucketDoubles = {"share",
                                                 "loss",
                                                 "first_order",
                                                 "curvature",
                                                 "predicted",
                                                 "realized",
                                                 "nds",
                                                 "loss_mean",
                                                 "nds_mean",
                                                 "loss_stderr",
                                                 "first_order_stderr",
                                                 "curvature_stderr",
                                                 "predicted_stderr",
                                                 "realized_stderr",
                                                 "nds_stderr"};

Table empty_bucket_table() {
  Table t;
  t.add_column("run", std::vector<std::string>{});
  t.add_column("step", std::vector<int64_t>{});
  t.add_column("direction", std::vector<std::string>{});
  t.add_column("bucket", std::vector<std::string>{});
  for (const auto& c : kBucketDoubles) t.add_column(c, std::vector<double>{});
  return t;
}

Table empty_status_table() {
  Table t;
  t.add_column("run", std::vector<std::string>{});
  t.add_column("step", std::vector<int64_t>{});
  t.add_column("direction", std::vector<std::string>{});
  t.add_column("status", std::vector<std::string>{});
  t.add_column("message", std::vector<std::string>{});
  return t;
}

std::string step_group(const std::string& run, int64_t step) {
  return fmt::format("/runs/{}/step_{}", run, step);
}

void check_name(const std::string& what, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    throw InvalidArgument(
        fmt::format("{} name '{}' cannot be an HDF5 group name (empty, '/', "
                    "'.' or '..')",
                    what, name));
  }
}

// Per batch: weight, loss, g_b·u, uᵀH_b u, realized change, within-block sum, and B x L matrices
// of the block terms, so that SEs and paired comparisons can be recomputed from the file.
void write_batches(H5Writer& w, const std::string& path, const TaylorBatches& t) {
  Table batches;
  batches.add_column("weight", t.weight);
  batches.add_column("loss", t.loss);
  batches.add_column("first_order", t.first_order);
  batches.add_column("curvature", t.curvature);
  batches.add_column("realized", t.realized);
  batches.add_column("within", t.within);
  batches.add_column("ggn", t.ggn);
  w.table(path, batches);
  auto matrix = [&](const char* name, const Eigen::MatrixXd& m) {
    const auto rows = static_cast<uint64_t>(m.rows()), cols = static_cast<uint64_t>(m.cols());
    std::vector<double> data(rows * cols);
    for (uint64_t i = 0; i < rows; ++i)
      for (uint64_t j = 0; j < cols; ++j) data[i * cols + j] = m(i, j);
    w.dataset(path + "/" + name, data, {rows, cols});
  };
  matrix("block_first_order", t.block_first_order);
  matrix("block_curvature", t.block_curvature);
  matrix("block_row_sum", t.block_row_sum);
  matrix("block_ggn", t.block_ggn);
}

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

}  // namespace

// The rows of `table` that are not of unit (run, step, direction).
Table without_unit(const Table& table, const std::string& run, int64_t step,
                   const std::string& direction) {
  const auto& runs = table.strings("run");
  const auto& steps = table.int64s("step");
  const auto& directions = table.strings("direction");
  std::vector<size_t> keep;
  for (size_t i = 0; i < table.num_rows(); ++i) {
    if (!(runs[i] == run && steps[i] == step && directions[i] == direction)) keep.push_back(i);
  }
  if (keep.size() == table.num_rows()) return table;
  Table out;
  for (const auto& name : table.names()) {
    std::visit(
        [&](const auto& values) {
          std::decay_t<decltype(values)> kept;
          for (size_t i : keep) kept.push_back(values[i]);
          out.add_column(name, std::move(kept));
        },
        table.column(name));
  }
  return out;
}

std::string unit_path(const std::string& run, int64_t step, const std::string& direction) {
  return step_group(run, step) + "/" + direction;
}

namespace {

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw FormatError(fmt::format("cannot read '{}'", path));
  return bytes;
}

void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) throw FormatError(fmt::format("cannot write '{}'", path));
}

std::string private_temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / fmt::format("curv-{}-{}", ::getpid(), name))
      .string();
}

}  // namespace

ProbeReport::ProbeReport(std::string path, Provenance p, bool resume,
                         std::shared_ptr<Communicator> comm)
    : path_(std::move(path)),
      comm_(comm ? std::move(comm) : single_process()),
      taylor_(std::make_unique<Table>(empty_taylor_table())),
      status_(std::make_unique<Table>(empty_status_table())),
      buckets_(std::make_unique<Table>(empty_bucket_table())) {
  const auto parent = std::filesystem::path(path_).parent_path();
  std::exception_ptr failure;
  // Rank 0's file: its bytes ("" when there is none), sent to the other ranks when resuming.
  std::string bytes;
  bool exists = false;
  if (comm_->is_root()) {
    try {
      if (!parent.empty() && !std::filesystem::is_directory(parent)) {
        throw InvalidArgument(
            fmt::format("output '{}': directory '{}' does not exist", path_, parent.string()));
      }
      exists = resume && std::filesystem::exists(path_);
      if (exists && comm_->distributed()) bytes = read_file_bytes(path_);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  raise_if_any_rank_failed(*comm_, failure);
  std::string source = path_;  // the file this rank loads
  std::string copy;            // a non-root rank's private copy of rank 0's file
  if (resume && comm_->distributed()) {
    std::string flag = exists ? "1" : "0";
    comm_->broadcast(flag, 0);
    exists = flag == "1";
    if (exists) {
      comm_->broadcast(bytes, 0);
      if (!comm_->is_root()) {
        copy = private_temp_path("resume.h5");
        write_file_bytes(copy, bytes);
        source = copy;
      }
    }
  }
  try {
    if (exists) load_for_resume(source, p);
  } catch (...) {
    failure = std::current_exception();
  }
  if (!copy.empty()) std::filesystem::remove(copy);
  raise_if_any_rank_failed(*comm_, failure);
  if (!exists) writer_ = std::make_unique<H5Writer>(path_);
  auto& w = *writer_;
  w.attribute("/", "tool", p.tool);
  w.attribute("/", "version", p.version);
  w.attribute("/", "command_line", p.command_line);
  w.attribute("/", "model", p.model);
  w.attribute("/", "dtype", p.dtype);
  // Written as text so resume compares it exactly, whatever its size.
  w.attribute("/", "seed", std::to_string(p.seed));
  w.attribute("/", "probe_examples", p.probe_examples);
  w.attribute("/", "probe_batches", p.probe_batches);
  w.attribute("/", "probe_hash", p.probe_hash);
  w.attribute("/", "threads", p.threads);
  w.attribute("/", "runtime", p.runtime);
  w.attribute("/", "blocks", p.blocks);
  w.attribute("/", "hvp_method", p.hvp_method);
  w.attribute("/", "schema", std::string(kSchema));
  w.attribute("/", "world_size", p.world_size);
  w.attribute("/", "distributed_backend", p.distributed_backend);
  for (const auto& [key, value] : p.extra) w.attribute("/", key, value);
}

void ProbeReport::load_for_resume(const std::string& source, const Provenance& p) {
  writer_ = std::make_unique<H5Writer>(H5Writer::load(source));
  H5Reader reader(source);
  auto check = [&](const char* key, const std::string& ours) {
    const std::string theirs =
        reader.has_attribute("/", key) ? reader.attribute_string("/", key) : "";
    if (theirs != ours) {
      throw InvalidArgument(
          fmt::format("cannot resume '{}': its {} is '{}', this run's is '{}' "
                      "(write to a new file, or drop --resume to replace it)",
                      path_, key, theirs, ours));
    }
  };
  check("schema", kSchema);
  check("model", p.model);
  check("dtype", p.dtype);
  check("probe_hash", p.probe_hash);
  check("blocks", p.blocks);
  check("seed", std::to_string(p.seed));
  if (reader.exists("/taylor")) *taylor_ = reader.table("/taylor");
  if (reader.exists("/status")) *status_ = reader.table("/status");
  if (reader.exists("/token_buckets")) *buckets_ = reader.table("/token_buckets");
  if (reader.is_group("/runs")) {
    for (const auto& run : reader.children("/runs")) {
      const std::string r = "/runs/" + run;
      if (!reader.is_group(r)) continue;
      for (const auto& step : reader.children(r)) {
        const std::string g = r + "/" + step;
        if (reader.is_group(g) && reader.has_attribute(g, "checkpoint_digest")) {
          digests_[g] = reader.attribute_string(g, "checkpoint_digest");
        }
      }
    }
  }
}

ProbeReport::~ProbeReport() = default;

H5Writer& ProbeReport::writer() { return *writer_; }
const Table& ProbeReport::taylor_table() const { return *taylor_; }
const Table& ProbeReport::status_table() const { return *status_; }

bool ProbeReport::done(const std::string& run, int64_t step, const std::string& direction) const {
  // A unit recorded as unavailable (a delta at the then-last checkpoint) is tried again: later
  // checkpoints may have arrived since.
  return writer_->exists(unit_path(run, step, direction)) &&
         status_of(run, step, direction) != "unavailable";
}

std::string ProbeReport::status_of(const std::string& run, int64_t step,
                                   const std::string& direction) const {
  const auto& runs = status_->strings("run");
  const auto& steps = status_->int64s("step");
  const auto& directions = status_->strings("direction");
  const auto& statuses = status_->strings("status");
  for (size_t i = 0; i < status_->num_rows(); ++i) {
    if (runs[i] == run && steps[i] == step && directions[i] == direction) return statuses[i];
  }
  return "";
}

void ProbeReport::drop_status(const std::string& run, int64_t step, const std::string& direction) {
  *status_ = without_unit(*status_, run, step, direction);
}

void ProbeReport::add_checkpoint(const std::string& run, int64_t step, double loss,
                                 double grad_norm, const std::string& digest) {
  check_name("run", run);
  const std::string g = step_group(run, step);
  writer_->group(g);
  writer_->attribute(g, "step", step);
  writer_->attribute(g, "loss", loss);
  writer_->attribute(g, "grad_norm", grad_norm);
  if (!digest.empty()) {
    writer_->attribute(g, "checkpoint_digest", digest);
    digests_[g] = digest;
  }
}

std::string ProbeReport::checkpoint_digest(const std::string& run, int64_t step) const {
  const auto it = digests_.find(step_group(run, step));
  return it == digests_.end() ? std::string() : it->second;
}

void ProbeReport::set_run_attribute(const std::string& run, const std::string& key,
                                    const std::string& value) {
  check_name("run", run);
  writer_->attribute("/runs/" + run, key, value);
}

void ProbeReport::add_taylor(const std::string& run, int64_t step, const std::string& direction,
                             const TaylorResult& r, const WithinReport* within) {
  check_name("run", run);
  check_name("direction", direction);
  auto& w = *writer_;
  const std::string g = unit_path(run, step, direction);
  w.remove(g);
  w.group(g);
  drop_status(run, step, direction);
  *taylor_ = without_unit(*taylor_, run, step, direction);
  *buckets_ = without_unit(*buckets_, run, step, direction);
  const std::pair<const char*, double> scalars[] = {{"loss", r.loss},
                                                    {"first_order", r.first_order},
                                                    {"curvature", r.curvature},
                                                    {"predicted", r.predicted},
                                                    {"realized", r.realized},
                                                    {"nds", r.nds},
                                                    {"eta_star", r.eta_star},
                                                    {"update_norm", r.update_norm},
                                                    {"s_within", r.s_within},
                                                    {"s_cross", r.s_cross},
                                                    {"rho_within", r.rho_within},
                                                    {"seconds", r.seconds},
                                                    {"loss_stderr", r.loss_stderr},
                                                    {"first_order_stderr", r.first_order_stderr},
                                                    {"curvature_stderr", r.curvature_stderr},
                                                    {"predicted_stderr", r.predicted_stderr},
                                                    {"realized_stderr", r.realized_stderr},
                                                    {"nds_stderr", r.nds_stderr},
                                                    {"eta_star_stderr", r.eta_star_stderr},
                                                    {"s_within_stderr", r.s_within_stderr},
                                                    {"s_cross_stderr", r.s_cross_stderr},
                                                    {"rho_within_stderr", r.rho_within_stderr},
                                                    {"ggn_curvature", r.ggn_curvature},
                                                    {"ggn_nds", r.ggn_nds},
                                                    {"residual_curvature", r.residual_curvature},
                                                    {"residual_nds", r.residual_nds},
                                                    {"ggn_nds_stderr", r.ggn_nds_stderr},
                                                    {"residual_nds_stderr", r.residual_nds_stderr}};
  for (const auto& [key, value] : scalars) w.attribute(g, key, value);
  if (r.status == AuditStatus::kZeroDirection) {
    // A unit with numbers whose ratios are NaN: its attributes say why, and /status lists it.
    record_status(g, run, step, direction, to_string(r.status),
                  "the direction is zero (‖u‖ = 0): g·u, uᵀHu, predicted and realized change are "
                  "0; NDS and the curvature ratios are NaN");
  }
  w.attribute(g, "hvps", r.hvps);
  w.attribute(g, "coupling_mode", to_string(r.coupling_mode));

  const double u_sq = r.update_norm * r.update_norm;
  Table blocks;
  blocks.add_column("name", r.blocks, [](const BlockTerms& b) { return b.name; });
  blocks.add_column("sq_norm", r.blocks, [](const BlockTerms& b) { return b.sq_norm; });
  blocks.add_column("first_order", r.blocks, [](const BlockTerms& b) { return b.first_order; });
  blocks.add_column("curvature", r.blocks, [](const BlockTerms& b) { return b.curvature; });
  blocks.add_column("row_sum", r.blocks, [](const BlockTerms& b) { return b.row_sum; });
  blocks.add_column("nds", r.blocks, [](const BlockTerms& b) { return b.nds; });
  blocks.add_column("first_order_stderr", r.blocks,
                    [](const BlockTerms& b) { return b.first_order_stderr; });
  blocks.add_column("curvature_stderr", r.blocks,
                    [](const BlockTerms& b) { return b.curvature_stderr; });
  blocks.add_column("row_sum_stderr", r.blocks,
                    [](const BlockTerms& b) { return b.row_sum_stderr; });
  blocks.add_column("predicted_stderr", r.blocks,
                    [](const BlockTerms& b) { return b.predicted_stderr; });
  blocks.add_column("nds_stderr", r.blocks, [](const BlockTerms& b) { return b.nds_stderr; });
  blocks.add_column("curvature_sign_stderr", r.blocks,
                    [](const BlockTerms& b) { return b.curvature_sign_stderr; });
  blocks.add_column("ggn_curvature", r.blocks, [](const BlockTerms& b) { return b.ggn_curvature; });
  blocks.add_column("ggn_nds", r.blocks, [](const BlockTerms& b) { return b.ggn_nds; });
  blocks.add_column("residual_curvature", r.blocks,
                    [](const BlockTerms& b) { return b.residual_curvature; });
  blocks.add_column("ggn_curvature_stderr", r.blocks,
                    [](const BlockTerms& b) { return b.ggn_curvature_stderr; });
  blocks.add_column("residual_curvature_stderr", r.blocks,
                    [](const BlockTerms& b) { return b.residual_curvature_stderr; });
  w.table(g + "/blocks", blocks);
  write_batches(w, g + "/batches", r.batches);
  if (r.coupling.size() > 0) {
    const auto L = static_cast<uint64_t>(r.coupling.rows());
    std::vector<double> c(L * L);
    for (uint64_t i = 0; i < L; ++i)
      for (uint64_t j = 0; j < L; ++j) c[i * L + j] = r.coupling(i, j);
    w.dataset(g + "/coupling", c, {L, L});
  }
  if (!r.multipliers.empty()) {
    Table m;
    m.add_column("eta", r.multipliers, [](const MultiplierTerms& x) { return x.eta; });
    m.add_column("predicted", r.multipliers, [](const MultiplierTerms& x) { return x.predicted; });
    m.add_column("realized", r.multipliers, [](const MultiplierTerms& x) { return x.realized; });
    m.add_column("predicted_stderr", r.multipliers,
                 [](const MultiplierTerms& x) { return x.predicted_stderr; });
    m.add_column("realized_stderr", r.multipliers,
                 [](const MultiplierTerms& x) { return x.realized_stderr; });
    w.table(g + "/multipliers", m);
  }
  if (within) {
    const std::string wg = g + "/within";
    w.group(wg);
    w.attribute(wg, "hvps", within->hvps);
    w.attribute(wg, "skipped", within->skipped);
    std::vector<std::string> params;
    for (const auto& p : within->params) params.push_back(p.name);
    w.attribute(wg, "params", params);
    for (const auto& p : within->params) {
      const std::string pg = wg + "/" + p.name;
      w.group(pg);
      std::vector<double> shape(p.shape.begin(), p.shape.end());
      w.attribute(pg, "shape", shape);
      w.attribute(pg, "sq_norm", p.sq_norm);
      w.attribute(pg, "svd_entropy", p.svd_entropy);
      w.attribute(pg, "effective_rank", p.effective_rank);
      w.attribute(pg, "top_k_energy", p.top_k_energy);
      w.dataset(pg + "/singular_values", p.singular_values);
      Table modes;
      modes.add_column("index", p.modes, [](const ModeTerms& m) { return m.index; });
      modes.add_column("sigma", p.modes, [](const ModeTerms& m) { return m.sigma; });
      modes.add_column("energy_share", p.modes, [](const ModeTerms& m) { return m.energy_share; });
      modes.add_column("curvature", p.modes, [](const ModeTerms& m) { return m.curvature; });
      w.table(pg + "/modes", modes);
      Table groups;
      groups.add_column("name", p.groups, [](const GroupTerms& x) { return x.name; });
      groups.add_column("sq_norm", p.groups, [](const GroupTerms& x) { return x.sq_norm; });
      groups.add_column("curvature", p.groups, [](const GroupTerms& x) { return x.curvature; });
      groups.add_column("nds", p.groups, [](const GroupTerms& x) { return x.nds; });
      w.table(pg + "/groups", groups);
    }
  }

  // Long-format rows: the total, then one per block.
  Table rows;
  const size_t n = r.blocks.size() + 1;
  std::vector<std::string> run_col(n, run), dir_col(n, direction), block_col;
  std::vector<int64_t> step_col(n, step);
  std::map<std::string, std::vector<double>> cols;
  auto push = [&](const std::string& block, std::map<std::string, double> v) {
    block_col.push_back(block);
    for (const auto& c : kTaylorDoubles) cols[c].push_back(v.count(c) ? v[c] : kNaN);
  };
  push("total", {{"loss", r.loss},
                 {"first_order", r.first_order},
                 {"curvature", r.curvature},
                 {"predicted", r.predicted},
                 {"realized", r.realized},
                 {"nds", r.nds},
                 {"update_norm", r.update_norm},
                 {"sq_norm", u_sq},
                 {"row_sum", r.curvature},
                 {"within", r.s_within},
                 {"cross", r.s_cross},
                 {"rho_within", r.rho_within},
                 {"eta_star", r.eta_star},
                 {"loss_stderr", r.loss_stderr},
                 {"first_order_stderr", r.first_order_stderr},
                 {"curvature_stderr", r.curvature_stderr},
                 {"predicted_stderr", r.predicted_stderr},
                 {"realized_stderr", r.realized_stderr},
                 {"nds_stderr", r.nds_stderr},
                 {"row_sum_stderr", r.curvature_stderr},
                 {"within_stderr", r.s_within_stderr},
                 {"cross_stderr", r.s_cross_stderr},
                 {"rho_within_stderr", r.rho_within_stderr},
                 {"eta_star_stderr", r.eta_star_stderr},
                 {"ggn_curvature", r.ggn_curvature},
                 {"ggn_nds", r.ggn_nds},
                 {"residual_nds", r.residual_nds},
                 {"ggn_nds_stderr", r.ggn_nds_stderr},
                 {"residual_nds_stderr", r.residual_nds_stderr}});
  size_t l = 0;
  for (const auto& b : r.blocks) {
    // A block's predicted share g_l·u_l + ½ u_lᵀ(Hu)_l: the shares add up to the total.
    push(b.name, {{"loss", r.loss},
                  {"first_order", b.first_order},
                  {"curvature", b.curvature},
                  {"predicted", b.first_order + 0.5 * b.row_sum},
                  {"nds", b.nds},
                  {"update_norm", std::sqrt(b.sq_norm)},
                  {"sq_norm", b.sq_norm},
                  {"row_sum", b.row_sum},
                  {"within", b.curvature / u_sq},
                  {"cross", (b.row_sum - b.curvature) / u_sq},
                  {"loss_stderr", r.loss_stderr},
                  {"first_order_stderr", b.first_order_stderr},
                  {"curvature_stderr", b.curvature_stderr},
                  {"predicted_stderr", b.predicted_stderr},
                  {"nds_stderr", b.nds_stderr},
                  {"row_sum_stderr", b.row_sum_stderr},
                  {"within_stderr", b.curvature_stderr / u_sq},
                  {"cross_stderr", block_cross_stderr(r.batches, l, u_sq)},
                  {"ggn_curvature", b.ggn_curvature},
                  {"ggn_nds", b.ggn_nds},
                  {"residual_nds", b.sq_norm > 0.0 ? b.residual_curvature / b.sq_norm : kNaN},
                  {"ggn_nds_stderr", b.sq_norm > 0.0 ? b.ggn_curvature_stderr / b.sq_norm : kNaN},
                  {"residual_nds_stderr",
                   b.sq_norm > 0.0 ? b.residual_curvature_stderr / b.sq_norm : kNaN}});
    ++l;
  }
  rows.add_column("run", run_col);
  rows.add_column("step", step_col);
  rows.add_column("direction", dir_col);
  rows.add_column("block", block_col);
  for (const auto& c : kTaylorDoubles) rows.add_column(c, cols[c]);
  taylor_->append_rows(rows);
}

void ProbeReport::add_token_buckets(const std::string& run, int64_t step,
                                    const std::string& direction,
                                    const std::vector<BucketResult>& buckets) {
  const std::string g = unit_path(run, step, direction);
  if (!writer_->exists(g)) {
    throw InvalidArgument(
        fmt::format("add_token_buckets: unit {} has no Taylor results yet (add_taylor first)", g));
  }
  *buckets_ = without_unit(*buckets_, run, step, direction);
  std::map<std::string, std::vector<double>> cols;
  std::vector<std::string> names;
  for (const auto& b : buckets) {
    const TaylorResult& t = b.taylor;
    names.push_back(b.name);
    const std::map<std::string, double> v = {{"share", b.share},
                                             {"loss", t.loss},
                                             {"first_order", t.first_order},
                                             {"curvature", t.curvature},
                                             {"predicted", t.predicted},
                                             {"realized", t.realized},
                                             {"nds", t.nds},
                                             {"loss_mean", b.share > 0 ? t.loss / b.share : kNaN},
                                             {"nds_mean", b.share > 0 ? t.nds / b.share : kNaN},
                                             {"loss_stderr", t.loss_stderr},
                                             {"first_order_stderr", t.first_order_stderr},
                                             {"curvature_stderr", t.curvature_stderr},
                                             {"predicted_stderr", t.predicted_stderr},
                                             {"realized_stderr", t.realized_stderr},
                                             {"nds_stderr", t.nds_stderr}};
    for (const auto& c : kBucketDoubles) cols[c].push_back(v.at(c));
  }
  Table unit;
  unit.add_column("bucket", names);
  for (const auto& c : kBucketDoubles) unit.add_column(c, cols[c]);
  writer_->table(g + "/token_buckets", unit);
  for (size_t k = 0; k < buckets.size(); ++k) {
    write_batches(*writer_, fmt::format("{}/token_buckets/batches_{}", g, buckets[k].name),
                  buckets[k].taylor.batches);
  }
  Table rows;
  const size_t n = buckets.size();
  rows.add_column("run", std::vector<std::string>(n, run));
  rows.add_column("step", std::vector<int64_t>(n, step));
  rows.add_column("direction", std::vector<std::string>(n, direction));
  rows.add_column("bucket", names);
  for (const auto& c : kBucketDoubles) rows.add_column(c, cols[c]);
  buckets_->append_rows(rows);
}

void ProbeReport::record_status(const std::string& group, const std::string& run, int64_t step,
                                const std::string& direction, const std::string& status,
                                const std::string& message) {
  writer_->attribute(group, "status", status);
  writer_->attribute(group, "message", message);
  Table row;
  row.add_column("run", std::vector<std::string>{run});
  row.add_column("step", std::vector<int64_t>{step});
  row.add_column("direction", std::vector<std::string>{direction});
  row.add_column("status", std::vector<std::string>{status});
  row.add_column("message", std::vector<std::string>{message});
  status_->append_rows(row);
}

void ProbeReport::add_status(const std::string& run, int64_t step, const std::string& direction,
                             const std::string& status, const std::string& message) {
  check_name("run", run);
  check_name("direction", direction);
  const std::string g = unit_path(run, step, direction);
  writer_->remove(g);
  writer_->group(g);
  drop_status(run, step, direction);
  *buckets_ = without_unit(*buckets_, run, step, direction);
  record_status(g, run, step, direction, status, message);
}

namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void ProbeReport::set_commit_share(double share) {
  if (!(share >= 0.0 && share < 1.0)) {
    throw InvalidArgument(fmt::format("commit share {} is not in [0, 1)", share));
  }
  commit_share_ = share;
}

void ProbeReport::commit_if_due() {
  uncommitted_ = true;
  double due = 1.0;
  if (comm_->is_root() && commit_share_ > 0.0) {
    const double since = steady_seconds() - last_commit_end_;
    due = since * commit_share_ >= (1.0 - commit_share_) * last_commit_seconds_ ? 1.0 : 0.0;
  }
  // Every rank takes part in commit(), so all follow rank 0's clock.
  if (comm_->distributed()) comm_->all_reduce_sum(&due, 1);
  if (due > 0.0) commit();
}

void ProbeReport::commit() {
  const double start = steady_seconds();
  writer_->table("/taylor", *taylor_);
  writer_->table("/status", *status_);
  if (buckets_->num_rows() > 0) writer_->table("/token_buckets", *buckets_);
  std::exception_ptr failure;
  if (comm_->is_root()) {
    try {
      writer_->commit();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // A failed write (a full disk) stops every rank at the same unit.
  raise_if_any_rank_failed(*comm_, failure);
  uncommitted_ = false;
  last_commit_end_ = steady_seconds();
  last_commit_seconds_ = last_commit_end_ - start;
}

}  // namespace curv
