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

#include "analysis/output_tables.h"
#include "curv/analysis/result_tables.h"
#include "curv/analysis/taylor.h"
#include "curv/analysis/token_buckets.h"
#include "curv/analysis/within.h"
#include "curv/core/distributed.h"
#include "curv/core/engine.h"
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

// The results layout; a file of another schema is not resumed into.
const char* kSchema = "libcurv-probe/2";

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
void write_batches(const ReportGroup& parent, const std::string& name, const TaylorBatches& t) {
  parent.table(name, batches_table(t));
  const ReportGroup group = parent.child(name);
  auto matrix = [&](const char* name, const Eigen::MatrixXd& m) {
    const auto n = static_cast<uint64_t>(m.rows()), cols = static_cast<uint64_t>(m.cols());
    std::vector<double> data(n * cols);
    for (uint64_t i = 0; i < n; ++i)
      for (uint64_t j = 0; j < cols; ++j) data[i * cols + j] = m(i, j);
    group.dataset(name, data, {n, cols});
  };
  matrix("block_first_order", t.block_first_order);
  matrix("block_curvature", t.block_curvature);
  matrix("block_row_sum", t.block_row_sum);
  matrix("block_ggn", t.block_ggn);
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
      taylor_(std::make_unique<Table>(taylor_layout().spec().empty())),
      status_(std::make_unique<Table>(status_layout().spec().empty())),
      buckets_(std::make_unique<Table>(token_buckets_layout().spec().empty())) {
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
  w.attribute("/", "vector_dtype", p.vector_dtype.empty() ? p.dtype : p.vector_dtype);
  // Written as text so resume compares it exactly, whatever its size.
  w.attribute("/", "seed", std::to_string(p.seed));
  w.attribute("/", "probe_examples", p.probe_examples);
  w.attribute("/", "probe_batches", p.probe_batches);
  w.attribute("/", "probe_hash", p.probe_hash);
  w.attribute("/", "threads", p.threads);
  w.attribute("/", "runtime", p.runtime);
  w.attribute("/", "blocks", p.blocks);
  w.attribute("/", "hvp_method", hvp_method_name(p.hvp_method));
  w.attribute("/", "schema", std::string(kSchema));
  w.attribute("/", "world_size", p.world_size);
  w.attribute("/", "distributed_backend", p.distributed_backend);
  for (const auto& [key, value] : p.extra) w.attribute("/", key, value);
}

void ProbeReport::load_for_resume(const std::string& source, const Provenance& p) {
  writer_ = std::make_unique<H5Writer>(H5Writer::load(source));
  H5Reader reader(source);
  // `written_before`: what a file from before the attribute existed held.
  auto check = [&](const char* key, const std::string& ours, const char* written_before = nullptr) {
    std::string theirs = reader.has_attribute("/", key) ? reader.attribute_string("/", key) : "";
    if (theirs.empty() && written_before && reader.has_attribute("/", written_before)) {
      theirs = reader.attribute_string("/", written_before);
    }
    if (theirs != ours) {
      throw InvalidArgument(
          Error::literal(fmt::format("cannot resume '{}': its {} is '{}', this run's is '{}' "
                                     "(write to a new file, or run without ",
                                     path_, key, theirs, ours)) +
              "{0} to replace it)",
          {{"ProbeJob.resume", ""}});
    }
  };
  check("schema", kSchema);
  check("model", p.model);
  // Numbers of another precision would sit beside these as if comparable.
  check("dtype", p.dtype);
  // Files from before vector dtypes kept their vectors in the model's dtype.
  check("vector_dtype", p.vector_dtype.empty() ? p.dtype : p.vector_dtype, "dtype");
  check("hvp_method", hvp_method_name(p.hvp_method));
  check("probe_hash", p.probe_hash);
  check("blocks", p.blocks);
  check("seed", std::to_string(p.seed));
  // The long tables grow by appending rows: they must have this version's columns.
  auto load = [&](const TableSpec& spec, Table& table) {
    if (!reader.exists(spec.name)) return;
    table = reader.table(spec.name);
    spec.check(table, fmt::format("cannot resume '{}': its {}", path_, spec.name));
  };
  load(taylor_layout().spec(), *taylor_);
  load(status_layout().spec(), *status_);
  load(token_buckets_layout().spec(), *buckets_);
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

void record_precision(const ReportGroup& unit, const CurvatureEngine& engine) {
  unit.attribute("dtype", dtype_name(engine.parameter_dtype()));
  unit.attribute("vector_dtype", dtype_name(engine.vector_dtype()));
  unit.attribute("hvp_method", hvp_method_name(engine.options().hvp_method));
}

ProbeReport::~ProbeReport() = default;

ReportGroup ProbeReport::unit_group(const std::string& run, int64_t step,
                                    const std::string& direction) {
  return {*writer_, unit_path(run, step, direction)};
}
ReportGroup ProbeReport::checkpoint_group(const std::string& run, int64_t step) {
  return {*writer_, step_group(run, step)};
}
ReportGroup ProbeReport::root() { return {*writer_, "/"}; }
const Table& ProbeReport::taylor_table() const { return *taylor_; }
const Table& ProbeReport::status_table() const { return *status_; }

std::map<std::string, Table> ProbeReport::tables() const {
  std::map<std::string, Table> out = writer_->tables();
  // The long tables are kept apart until each commit writes them.
  out["/taylor"] = *taylor_;
  out["/status"] = *status_;
  if (buckets_->num_rows() > 0) out["/token_buckets"] = *buckets_;
  return out;
}

bool ProbeReport::done(const std::string& run, int64_t step, const std::string& direction) const {
  // A unit recorded as unavailable (a delta at the then-last checkpoint) is tried again: later
  // checkpoints may have arrived since.
  return writer_->exists(unit_path(run, step, direction)) &&
         status_of(run, step, direction) != to_string(UnitStatus::kUnavailable);
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
                                 std::optional<double> grad_norm, const std::string& digest) {
  check_name("run", run);
  const std::string g = step_group(run, step);
  writer_->group(g);
  writer_->attribute(g, "step", step);
  writer_->attribute(g, "loss", loss);
  if (grad_norm) writer_->attribute(g, "grad_norm", *grad_norm);
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
                             const TaylorResult& r) {
  check_name("run", run);
  check_name("direction", direction);
  const ReportGroup unit = unit_group(run, step, direction);
  unit.clear();
  drop_status(run, step, direction);
  *taylor_ = without_unit(*taylor_, run, step, direction);
  *buckets_ = without_unit(*buckets_, run, step, direction);
  unit.attributes(unit_attributes_layout(), r);
  if (r.status == AuditStatus::kZeroDirection) {
    // A unit with numbers whose ratios are NaN: its attributes say why, and /status lists it.
    record_status(unit.path(), {run, step, direction}, to_string(r.status),
                  "the direction is zero (‖u‖ = 0): g·u, uᵀHu, predicted and realized change are "
                  "0; NDS and the curvature ratios are NaN");
  }
  unit.table(blocks_layout(), r.blocks);
  write_batches(unit, "batches", r.batches);
  if (r.coupling.size() > 0) {
    const auto L = static_cast<uint64_t>(r.coupling.rows());
    std::vector<double> c(L * L);
    for (uint64_t i = 0; i < L; ++i)
      for (uint64_t j = 0; j < L; ++j) c[i * L + j] = r.coupling(i, j);
    unit.dataset("coupling", c, {L, L});
  }
  if (!r.multipliers.empty()) unit.table(multipliers_layout(), r.multipliers);

  // Long-format rows: the total, then one per block.
  taylor_->append_rows(taylor_rows(run, step, direction, r));
}

void ProbeReport::add_token_buckets(const std::string& run, int64_t step,
                                    const std::string& direction,
                                    const std::vector<BucketResult>& buckets) {
  const ReportGroup unit = unit_group(run, step, direction);
  if (!unit.exists()) {
    throw InvalidArgument(fmt::format(
        "add_token_buckets: unit {} has no Taylor results yet (add_taylor first)", unit.path()));
  }
  *buckets_ = without_unit(*buckets_, run, step, direction);
  const UnitKey key{run, step, direction};
  std::vector<BucketRow> rows;
  for (const auto& b : buckets) rows.push_back({&key, &b});
  unit.table(unit_token_buckets_layout(), rows);
  const ReportGroup group = unit.child(unit_token_buckets_layout().spec().name);
  for (const auto& b : buckets) write_batches(group, "batches_" + b.name, b.taylor.batches);
  buckets_->append_rows(token_buckets_layout().table(rows));
}

void ProbeReport::add_within(const std::string& run, int64_t step, const std::string& direction,
                             const WithinReport& within) {
  const ReportGroup unit = unit_group(run, step, direction);
  if (!unit.exists()) {
    throw InvalidArgument(fmt::format(
        "add_within: unit {} has no Taylor results yet (add_taylor first)", unit.path()));
  }
  const ReportGroup group = unit.child("within");
  group.clear();
  group.attribute("hvps", within.hvps);
  group.attribute("skipped", within.skipped);
  std::vector<std::string> params;
  for (const auto& p : within.params) params.push_back(p.name);
  group.attribute("params", params);
  for (const auto& p : within.params) {
    const ReportGroup pg = group.child(p.name);
    pg.clear();
    pg.attribute("shape", std::vector<double>(p.shape.begin(), p.shape.end()));
    pg.attribute("sq_norm", p.sq_norm);
    pg.attribute("svd_entropy", p.svd_entropy);
    pg.attribute("effective_rank", p.effective_rank);
    pg.attribute("top_k_energy", p.top_k_energy);
    pg.dataset("singular_values", p.singular_values);
    pg.table(modes_layout(), p.modes);
    pg.table(groups_layout(), p.groups);
  }
}

void ProbeReport::record_status(const std::string& group, const UnitKey& key,
                                const std::string& status, const std::string& message) {
  writer_->attribute(group, "status", status);
  writer_->attribute(group, "message", message);
  status_->append_rows(status_layout().table({{key, status, message}}));
}

void ProbeReport::add_status(const std::string& run, int64_t step, const std::string& direction,
                             UnitStatus status, const std::string& message) {
  check_name("run", run);
  check_name("direction", direction);
  const ReportGroup unit = unit_group(run, step, direction);
  unit.clear();
  drop_status(run, step, direction);
  *buckets_ = without_unit(*buckets_, run, step, direction);
  record_status(unit.path(), {run, step, direction}, to_string(status), message);
}

std::string to_string(UnitStatus status) {
  switch (status) {
    case UnitStatus::kUnavailable:
      return "unavailable";
    case UnitStatus::kFailed:
      return "failed";
  }
  return "?";
}

bool ReportGroup::exists() const { return writer_->exists(path_); }

void ReportGroup::clear() const {
  writer_->remove(path_);
  writer_->group(path_);
}

std::string ReportGroup::join(const std::string& name) const {
  if (!name.empty() && name[0] == '/') return name;
  return path_ == "/" ? "/" + name : path_ + "/" + name;
}

void ReportGroup::table(const std::string& name, const Table& table) const {
  writer_->table(join(name), table);
}

void ReportGroup::dataset(const std::string& name, std::vector<double> data,
                          std::vector<uint64_t> dims) const {
  writer_->dataset(join(name), std::move(data), std::move(dims));
}

void ReportGroup::dataset(const std::string& name, std::vector<int64_t> data) const {
  writer_->dataset(join(name), std::move(data));
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
