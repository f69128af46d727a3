// The layouts of the built-in output tables (declared in output_tables.cpp, documented in
// docs/hdf5-schema.md) and the row types they read.
#pragma once

#include <cstdint>
#include <string>

#include "curv/analysis/output_table.h"
#include "curv/analysis/spectrum.h"
#include "curv/analysis/taylor.h"
#include "curv/analysis/token_buckets.h"
#include "curv/analysis/within.h"

namespace curv {

// One (run, step, direction): the keys of the long tables.
struct UnitKey {
  std::string run;
  int64_t step = 0;
  std::string direction;
};

// A row of /taylor: the whole model (`block` null) or block `index` of the audit `taylor`.
struct TaylorRow {
  const UnitKey* key = nullptr;
  const TaylorResult* taylor = nullptr;
  const BlockTerms* block = nullptr;
  size_t index = 0;
};

struct BatchRow {
  const TaylorBatches* batches = nullptr;
  size_t index = 0;
};

struct BucketRow {
  const UnitKey* key = nullptr;
  const BucketResult* bucket = nullptr;
};

struct StatusRow {
  UnitKey key;
  std::string status;
  std::string message;
};

struct ComparisonRow {
  std::string pair;
  std::string run_a, direction_a, run_b, direction_b;
  int64_t step = 0;
  NdsComparison nds;
};

struct EigenRow {
  std::string block;
  std::string which;  // "largest" | "smallest" | "dominant"
  int64_t rank = 0;
  const RitzPair* pair = nullptr;
  const EigenResult* result = nullptr;
};

// The rows of `result`'s pairs for `block`: largest, smallest, then dominant, each by rank.
void append_eigen_rows(std::vector<EigenRow>& rows, const std::string& block,
                       const EigenResult& result);

struct TraceRow {
  std::string block;
  const TraceResult* trace = nullptr;
};

const TableLayout<TaylorRow>& taylor_layout();              // /taylor
const TableLayout<StatusRow>& status_layout();              // /status
const TableLayout<BucketRow>& token_buckets_layout();       // /token_buckets
const TableLayout<ComparisonRow>& comparisons_layout();     // /comparisons
const TableLayout<BlockTerms>& blocks_layout();             // <unit>/blocks
const TableLayout<BatchRow>& batches_layout();              // <unit>/batches
const TableLayout<MultiplierTerms>& multipliers_layout();   // <unit>/multipliers
const TableLayout<BucketRow>& unit_token_buckets_layout();  // <unit>/token_buckets
const TableLayout<ModeTerms>& modes_layout();               // <unit>/within/<param>/modes
const TableLayout<GroupTerms>& groups_layout();             // <unit>/within/<param>/groups
const TableLayout<EigenRow>& eigen_layout();                // step_<N>/spectrum/eigen
const TableLayout<TraceRow>& trace_layout();                // step_<N>/spectrum/trace
// Not a table: the scalar attributes of a unit with results, one row written as attributes.
const TableLayout<TaylorResult>& unit_attributes_layout();

}  // namespace curv
