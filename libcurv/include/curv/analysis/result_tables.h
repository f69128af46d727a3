// The analyses' results as in-memory tables, with the columns, order and units the HDF5 file
// gives them (docs/hdf5-schema.md): the same layouts build both, so a program that keeps its
// results in memory (the Python package's DataFrames) reads what a file would hold.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "curv/analysis/report.h"
#include "curv/analysis/spectrum.h"
#include "curv/analysis/taylor.h"
#include "curv/analysis/token_buckets.h"
#include "curv/analysis/within.h"
#include "curv/io/h5_file.h"

namespace curv {

// The unit's rows of the long table /taylor: the total, then one row per block.
Table taylor_rows(const std::string& run, int64_t step, const std::string& direction,
                  const TaylorResult& taylor);
Table blocks_table(const TaylorResult& taylor);       // <unit>/blocks
Table batches_table(const TaylorBatches& batches);    // <unit>/batches
Table multipliers_table(const TaylorResult& taylor);  // <unit>/multipliers
Table modes_table(const WithinParam& param);          // <unit>/within/<param>/modes
Table groups_table(const WithinParam& param);         // <unit>/within/<param>/groups
// The unit's rows of /token_buckets (keys, then the bucket's columns).
Table token_bucket_rows(const std::string& run, int64_t step, const std::string& direction,
                        const std::vector<BucketResult>& buckets);
// step_<N>/spectrum/eigen and /trace, for the whole Hessian (block "total").
Table eigen_table(const EigenResult& result);
Table trace_table(const TraceResult& result);

// A checkpoint's spectrum/eigen group as ndsprobe writes it: the table (eigen_table, or its rows
// with per-block ones), and as attributes the solver's options and one message per solve.
void write_eigen_group(const ReportGroup& spectrum, const Table& eigen, const EigenOptions& options,
                       const std::vector<std::string>& messages);

}  // namespace curv
