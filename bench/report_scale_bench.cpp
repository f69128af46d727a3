// Cost of committing ndsprobe's HDF5 file as it grows. Every commit rewrites the whole file
// atomically (H5Writer::commit), so committing after each unit costs time quadratic in the number
// of units; ProbeReport::commit_if_due keeps the commits near a fixed share of the run time
// instead. This adds UNITS units of a real Taylor audit's shape (B probe batches, L blocks:
// per-unit tables of B x L) one by one, each after UNIT_MS of simulated work, once committing
// after every unit and once with commit_if_due, and prints both as Markdown at milestones.
//
//   report_scale_bench [--units 1000] [--batches 64] [--blocks 48] [--unit-ms 100]
//                      [--out /tmp/report_scale.h5]
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "curv/analysis/report.h"
#include "curv/analysis/taylor.h"

int main(int argc, char** argv) {
  int64_t units = 1000, batches = 64, blocks = 48, unit_ms = 100;
  std::string out = "/tmp/report_scale.h5";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--units") units = std::atoll(argv[i + 1]);
    if (flag == "--batches") batches = std::atoll(argv[i + 1]);
    if (flag == "--blocks") blocks = std::atoll(argv[i + 1]);
    if (flag == "--unit-ms") unit_ms = std::atoll(argv[i + 1]);
    if (flag == "--out") out = argv[i + 1];
  }
  // One audit's worth of numbers, of the shapes taylor_audit fills with full coupling.
  curv::TaylorResult r;
  r.loss = 3.0;
  r.first_order = -0.1;
  r.curvature = 0.05;
  r.nds = 0.5;
  r.update_norm = 0.3;
  r.coupling = Eigen::MatrixXd::Random(blocks, blocks);
  for (int64_t l = 0; l < blocks; ++l) {
    curv::BlockTerms b;
    b.name = fmt::format("block{}", l);
    b.sq_norm = 0.01;
    b.curvature = 0.001;
    r.blocks.push_back(b);
  }
  auto& t = r.batches;
  t.weight.assign(batches, 1.0 / batches);
  for (auto* v : {&t.loss, &t.first_order, &t.curvature, &t.realized, &t.within, &t.ggn}) {
    v->assign(batches, 0.25);
  }
  t.block_first_order = Eigen::MatrixXd::Random(batches, blocks);
  t.block_curvature = Eigen::MatrixXd::Random(batches, blocks);
  t.block_row_sum = Eigen::MatrixXd::Random(batches, blocks);
  t.block_ggn = Eigen::MatrixXd::Random(batches, blocks);

  std::printf("%lld units of B = %lld batches x L = %lld blocks, %lld ms of work per unit\n\n",
              static_cast<long long>(units), static_cast<long long>(batches),
              static_cast<long long>(blocks), static_cast<long long>(unit_ms));
  std::printf(
      "| commits | units | file size (MB) | commits made | last commit (s) | time in commits (s) "
      "| run time (s) | commits' share |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  using clock = std::chrono::steady_clock;
  auto seconds_since = [](clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
  };
  for (const double share : {0.0, 0.05}) {
    std::filesystem::remove(out);
    curv::Provenance p = curv::make_provenance("report_scale_bench", "", "float32", 0, 1);
    p.model = "synthetic";
    p.blocks = "layer";
    curv::ProbeReport report(out, p, /*resume=*/false);
    report.set_commit_share(share);
    const auto run_start = clock::now();
    double in_commits = 0.0, last = 0.0;
    int64_t commits = 0;
    for (int64_t k = 1; k <= units; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(unit_ms));
      const int64_t step = (k - 1) / 10, direction = (k - 1) % 10;
      if (direction == 0) report.add_checkpoint("run", step, 3.0, 1.0);
      report.add_taylor("run", step, fmt::format("random{}", direction), r);
      const auto start = clock::now();
      if (k == units) {
        report.commit();
      } else {
        report.commit_if_due();
      }
      const double seconds = seconds_since(start);
      if (!report.has_uncommitted() && seconds > 1e-4) {
        in_commits += seconds, last = seconds, ++commits;
      }
      if (k == 1 || k == 10 || k == 100 || k == 250 || k == 500 || k == 750 || k == units) {
        const double run = seconds_since(run_start);
        std::printf("| %s | %lld | %.1f | %lld | %.3f | %.1f | %.1f | %.1f%% |\n",
                    share == 0.0 ? "every unit" : "commit_if_due", static_cast<long long>(k),
                    std::filesystem::file_size(out) / 1e6, static_cast<long long>(commits), last,
                    in_commits, run, 100.0 * in_commits / run);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
