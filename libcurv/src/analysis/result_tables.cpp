#include "curv/analysis/result_tables.h"

#include "analysis/output_tables.h"

namespace curv {

Table taylor_rows(const std::string& run, int64_t step, const std::string& direction,
                  const TaylorResult& taylor) {
  const UnitKey key{run, step, direction};
  std::vector<TaylorRow> rows = {{&key, &taylor, nullptr, 0}};
  for (size_t l = 0; l < taylor.blocks.size(); ++l) {
    rows.push_back({&key, &taylor, &taylor.blocks[l], l});
  }
  return taylor_layout().table(rows);
}

Table blocks_table(const TaylorResult& taylor) { return blocks_layout().table(taylor.blocks); }

Table batches_table(const TaylorBatches& batches) {
  std::vector<BatchRow> rows;
  for (size_t b = 0; b < batches.size(); ++b) rows.push_back({&batches, b});
  return batches_layout().table(rows);
}

Table multipliers_table(const TaylorResult& taylor) {
  return multipliers_layout().table(taylor.multipliers);
}

Table modes_table(const WithinParam& param) { return modes_layout().table(param.modes); }

Table groups_table(const WithinParam& param) { return groups_layout().table(param.groups); }

Table token_bucket_rows(const std::string& run, int64_t step, const std::string& direction,
                        const std::vector<BucketResult>& buckets) {
  const UnitKey key{run, step, direction};
  std::vector<BucketRow> rows;
  for (const auto& b : buckets) rows.push_back({&key, &b});
  return token_buckets_layout().table(rows);
}

Table eigen_table(const EigenResult& result) {
  std::vector<EigenRow> rows;
  append_eigen_rows(rows, "total", result);
  return eigen_layout().table(rows);
}

Table trace_table(const TraceResult& result) {
  return trace_layout().table({TraceRow{"total", &result}});
}

void write_eigen_group(const ReportGroup& spectrum, const Table& eigen, const EigenOptions& options,
                       const std::vector<std::string>& messages) {
  const std::string name = eigen_layout().spec().name;
  spectrum.table(name, eigen);
  const ReportGroup group = spectrum.child(name);
  group.attribute("method", to_string(options.method));
  group.attribute("tol", options.tol);
  group.attribute("bound", to_string(options.bound));
  group.attribute("max_hvps", options.max_hvps);
  group.attribute("krylov_basis", to_string(options.basis));
  group.attribute("residuals", "measured: one extra HVP per pair");
  group.attribute("messages", messages);
}

}  // namespace curv
