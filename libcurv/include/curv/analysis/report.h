// ProbeReport: the HDF5 results file of ndsprobe and the in-training probe (schema in
// docs/hdf5-schema.md). Each finished unit is committed by rewriting the whole file atomically,
// so a killed run leaves a readable file and a rerun resumes where it stopped.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "curv/analysis/output_table.h"
#include "curv/core/hvp_method.h"

namespace curv {

struct TaylorResult;
struct BucketResult;
struct UnitKey;
struct WithinReport;
class Communicator;
class CurvatureEngine;

// Why a unit has no numbers (its status attribute and /status row). A unit audited along a zero
// direction has numbers and the status of its audit instead (AuditStatus::kZeroDirection).
enum class UnitStatus {
  kUnavailable,  // the direction cannot be computed here (a delta at a run's last checkpoint)
  kFailed,       // the computation failed (programs that record failures and go on)
};
std::string to_string(UnitStatus status);  // "unavailable" | "failed"

// One group of the results file that an analysis writes into: a unit's, a checkpoint's, or the
// root. Names are relative to the group; tables follow their declared layout.
class ReportGroup {
 public:
  ReportGroup(H5Writer& writer, std::string path) : writer_(&writer), path_(std::move(path)) {}
  const std::string& path() const { return path_; }
  ReportGroup child(const std::string& name) const { return {*writer_, join(name)}; }
  bool exists() const;
  // Empties the group (or creates it empty), its attributes included.
  void clear() const;
  template <typename Row>
  void table(const TableLayout<Row>& layout, const std::vector<Row>& rows) const {
    table(layout.spec().name, layout.table(rows));
  }
  void table(const std::string& name, const Table& table) const;
  void dataset(const std::string& name, std::vector<double> data,
               std::vector<uint64_t> dims = {}) const;
  void dataset(const std::string& name, std::vector<int64_t> data) const;
  template <typename T>
  void attribute(const std::string& name, T value) const {
    writer_->attribute(path_, name, std::move(value));
  }
  template <typename Row>
  void attributes(const TableLayout<Row>& layout, const Row& row) const {
    layout.write_attributes(*writer_, path_, row);
  }

 private:
  std::string join(const std::string& name) const;  // a name starting with '/' is absolute
  H5Writer* writer_;
  std::string path_;
};

// The precision a unit was measured at, as its attributes dtype, vector_dtype and hvp_method
// (the engine's parameter dtype, vector dtype and HVP method).
void record_precision(const ReportGroup& unit, const CurvatureEngine& engine);

// Root attributes that identify a results file. Resuming requires the identifying ones (model,
// dtype, probe_hash, blocks, seed) to match the file's.
struct Provenance {
  std::string tool;     // "ndsprobe", "curvtrain", or the embedding program
  std::string version;  // libcurv version
  std::string command_line;
  std::string model;         // model description
  std::string dtype;         // the model's: "float64" | "float32" | "bfloat16" | "float16"
  std::string vector_dtype;  // of directions, gradients and HVPs (EngineOptions::vector_dtype)
  int64_t seed = 0;
  int64_t probe_examples = 0;
  int64_t probe_batches = 0;
  std::string probe_hash;
  int64_t threads = 0;
  std::string runtime;  // LibTorch version and threads
  std::string blocks;   // block rule, e.g. "layer"
  HvpMethod hvp_method = HvpMethod::kExact;
  std::map<std::string, std::string> extra;    // free-form key/values written as attributes
  int64_t world_size = 1;                      // processes the probe set was split over
  std::string distributed_backend = "single";  // "single" | "gloo"
};

// The fields every tool fills the same way: tool, libcurv version, command line, dtype, seed,
// threads (0 = all cores) and the runtime summary. The caller adds model, probe set and blocks.
Provenance make_provenance(const std::string& tool, const std::string& command_line,
                           const std::string& dtype, uint64_t seed, int threads);
// argv joined by spaces, for Provenance::command_line.
std::string join_command_line(int argc, const char* const* argv);

class ProbeReport {
 public:
  // Without `resume`, an existing file at `path` is replaced at the first commit() (never
  // before). With `resume`, an existing file is loaded and must carry matching provenance
  // (InvalidArgument names the differing attribute); a missing file starts empty.
  // With several ranks (`comm`), every rank holds the same report — rank 0 reads the file and
  // sends its bytes to the others — and only rank 0 writes; constructing and commit() are then
  // collectives, and a failure on rank 0 is raised on every rank.
  ProbeReport(std::string path, Provenance provenance, bool resume,
              std::shared_ptr<Communicator> comm = nullptr);
  ~ProbeReport();
  ProbeReport(const ProbeReport&) = delete;
  ProbeReport& operator=(const ProbeReport&) = delete;

  const std::string& path() const { return path_; }
  // True when results (or a recorded status) for this unit are already in the file.
  bool done(const std::string& run, int64_t step, const std::string& direction) const;

  // Checkpoint-level values: loss and gradient norm at θ_t (none when nothing reported at the
  // checkpoint needed the gradient), and the checkpoint's content digest (io's
  // checkpoint_digest; "" for none); attributes of /runs/<run>/step_<N>.
  void add_checkpoint(const std::string& run, int64_t step, double loss,
                      std::optional<double> grad_norm, const std::string& digest = "");
  // The digest recorded for a checkpoint by add_checkpoint or in the resumed file; "" if none.
  std::string checkpoint_digest(const std::string& run, int64_t step) const;
  void set_run_attribute(const std::string& run, const std::string& key, const std::string& value);
  // A unit's Taylor audit: its attributes, blocks, batches, coupling and multipliers, replacing
  // whatever the unit held, and its rows of /taylor. The unit's other analyses write after it.
  void add_taylor(const std::string& run, int64_t step, const std::string& direction,
                  const TaylorResult& taylor);
  // The within-block breakdown of a unit already added with add_taylor: its `within` group.
  void add_within(const std::string& run, int64_t step, const std::string& direction,
                  const WithinReport& within);
  // Token-bucket audits of a unit already added with add_taylor: its `token_buckets` table and
  // rows of the long table /token_buckets.
  void add_token_buckets(const std::string& run, int64_t step, const std::string& direction,
                         const std::vector<BucketResult>& buckets);
  // A unit that produced no numbers, and why.
  void add_status(const std::string& run, int64_t step, const std::string& direction,
                  UnitStatus status, const std::string& message);
  // Rewrites the file atomically with everything added so far.
  void commit();
  // Commits unless the time since the last commit is short next to that commit's own cost: the
  // file is rewritten whole, so committing after every unit would cost time quadratic in the
  // number of units. Commits when the work since the last commit took at least
  // (1 - share) / share times as long as that commit did, which keeps the commits' share of the
  // run time near `share` (set_commit_share; 0 commits every time). The units in between are
  // written by the next commit; after a crash --resume recomputes them. With several ranks the
  // decision is rank 0's, sent to the others.
  void commit_if_due();
  // True when results were added since the last commit.
  bool has_uncommitted() const { return uncommitted_; }
  void set_commit_share(double share);

  const Table& taylor_table() const;
  const Table& status_table() const;
  // Every table the file holds or will hold at the next commit, by its path in the file
  // (H5Writer::tables): the units resumed from the file included.
  std::map<std::string, Table> tables() const;
  // Where the analyses write: a unit's group (after add_taylor), a checkpoint's, the root.
  ReportGroup unit_group(const std::string& run, int64_t step, const std::string& direction);
  ReportGroup checkpoint_group(const std::string& run, int64_t step);
  ReportGroup root();

 private:
  // Loads the existing results at `source` (rank 0's file, or a copy of it) and checks that
  // they match this run's provenance.
  void load_for_resume(const std::string& source, const Provenance& provenance);
  std::string status_of(const std::string& run, int64_t step, const std::string& direction) const;
  void drop_status(const std::string& run, int64_t step, const std::string& direction);
  // The unit group's status and message attributes and its row of /status.
  void record_status(const std::string& group, const UnitKey& key, const std::string& status,
                     const std::string& message);

  std::string path_;
  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<H5Writer> writer_;
  std::unique_ptr<Table> taylor_;
  std::unique_ptr<Table> status_;
  std::unique_ptr<Table> buckets_;              // /token_buckets
  std::map<std::string, std::string> digests_;  // step group → checkpoint_digest attribute
  double commit_share_ = 0.05;
  double last_commit_seconds_ = 0.0;
  double last_commit_end_ = 0.0;  // seconds on the steady clock
  bool uncommitted_ = false;
};

// Group path of one unit: "/runs/<run>/step_<N>/<direction>".
std::string unit_path(const std::string& run, int64_t step, const std::string& direction);

}  // namespace curv
