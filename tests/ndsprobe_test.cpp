// ndsprobe end to end: checkpoint directories made here, the tool run as a process, its HDF5
// read back with h5py; and every kind of bad input.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include "curv/analysis/memory_plan.h"
#include "curv/analysis/probe_run.h"
#include "curv/core/engine.h"
#include "curv/core/runtime.h"
#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/io/safetensors.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;
namespace fs = std::filesystem;

namespace {

// A tiny GPT trained by plain gradient descent for a few steps, saved every step, plus probe data.
struct Fixture {
  TempDir dir;
  std::string run, data, config;
  std::vector<ParamVector> thetas;

  Fixture() {
    run = dir.file("run_a");
    data = dir.file("probe.safetensors");
    config = dir.file("model.json");
    auto cfg = tiny_gpt_config();
    std::ofstream(config) << cfg.to_json();
    auto model = make_model(cfg, ModelInit{1, at::kFloat});
    ProbeSet probe = gpt_probe(7, 12, 12);
    write_safetensors(data, {{"inputs", probe[0].inputs}, {"targets", probe[0].targets}});
    for (int step = 0; step <= 30; step += 10) {
      thetas.push_back(snapshot_parameters(*model));
      save_checkpoint(run, step, model->space(), thetas.back(), {},
                      R"({"model": )" + cfg.to_json() + "}");
      CurvatureEngine engine(*model, probe);
      ParamVector next = engine.parameters();
      axpy(-0.5, engine.gradient(), next);
      load_parameters(*model, next);
    }
  }
  std::string ndsprobe(const std::string& args, int* status = nullptr) const {
    return run_tool("ndsprobe", args, status);
  }
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The fixture's delta audit in bfloat16 on a GPU, for plan_probe_job (planning reads shapes only,
// so a GPU run is planned without a GPU).
ProbeJob gpu_delta_job(const Fixture& f) {
  ProbeJob job;
  job.run.runs = {f.run};
  job.run.directions = {"delta"};
  job.model.init.dtype = at::kBFloat16;
  job.model.init.device = "cuda";
  job.data.path = f.data;
  return job;
}

int64_t parameter_count(const Fixture& f) {
  int64_t n = 0;
  for (const auto& t : f.thetas.front()) n += t.numel();
  return n;
}

// The plan's part `name`, or nullptr.
const MemoryPart* find_part(const MemoryPlan& plan, const std::string& name) {
  for (const auto& p : plan.parts) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("ndsprobe end to end on a checkpoint directory, checked with h5py", "[ndsprobe]") {
  Fixture f;
  const std::string out = f.dir.file("out.h5");
  const std::string stdout_text = f.ndsprobe(
      f.run + " --data " + f.data + " --dtype float64 --within --multipliers 0.5,2 -o " + out);
  CHECK_THAT(stdout_text, Catch::Matchers::Contains("mean NDS"));
  run_python("check_ndsprobe_h5.py",
             {out, "run_a", "0,10,20,30", "delta,gradient,random", "--within"});

  // The delta at step 10 is θ_20 − θ_10: its norm is in the file.
  H5Reader reader(out);
  const double norm_file = reader.attribute_double("/runs/run_a/step_10/delta", "update_norm");
  CHECK(norm_file == Approx(norm(sub(f.thetas[2], f.thetas[1]))).epsilon(1e-6));
  CHECK(reader.attribute_string("/runs/run_a/step_30/delta", "status") == "unavailable");
  CHECK(reader.table("/status").num_rows() == 1);
  // The model came from meta.json: no --model needed.
  CHECK_THAT(reader.attribute_string("/", "model"), Catch::Matchers::Contains("gpt("));
}

TEST_CASE("ndsprobe writes standard errors and paired comparisons, checked with numpy",
          "[ndsprobe][statistics]") {
  Fixture f;
  const std::string out = f.dir.file("out.h5");
  // 12 sequences in batches of 5, 5 and 2.
  const std::string text =
      f.ndsprobe(f.run + " --data " + f.data +
                 " --dtype float64 --batch-size 5 --directions delta,gradient --compare "
                 "delta:gradient --compare run_a/gradient:run_a/delta -o " +
                 out);
  CHECK_THAT(text, Catch::Matchers::Contains("mean NDS ± SE"));
  CHECK_THAT(text, Catch::Matchers::Contains("delta:gradient (run_a)"));
  run_python("check_statistics_h5.py", {out});
  H5Reader reader(out);
  const Table comparisons = reader.table("/comparisons");
  CHECK(comparisons.num_rows() == 2 * 3);  // two pairs at steps 0, 10, 20 (no delta at 30)
  // A resumed invocation recomputes the comparisons from the file, including finished units.
  f.ndsprobe(f.run + " --data " + f.data +
             " --dtype float64 --batch-size 5 --directions delta,gradient --compare "
             "delta:gradient --resume -o " +
             out);
  CHECK(H5Reader(out).table("/comparisons").num_rows() == 3);
  // One batch: no spread, so NaN standard errors and "n/a" in the summary.
  const std::string one = f.dir.file("one.h5");
  CHECK_THAT(f.ndsprobe(f.run + " --data " + f.data + " --directions gradient -o " + one),
             Catch::Matchers::Contains("n/a"));
  CHECK(std::isnan(H5Reader(one).attribute_double("/runs/run_a/step_0/gradient", "nds_stderr")));
  // Names the invocation does not audit are refused before any compute.
  int rc = 0;
  const std::string err = f.ndsprobe(
      f.run + " --data " + f.data + " --directions gradient --compare gradient:adamw -o " + one,
      &rc);
  CHECK(rc == 1);
  CHECK_THAT(err, Catch::Matchers::Contains("no direction 'adamw'"));
}

TEST_CASE("ndsprobe --token-buckets writes bucket audits that sum to the totals",
          "[ndsprobe][buckets]") {
  Fixture f;
  const std::string out = f.dir.file("out.h5");
  f.ndsprobe(f.run + " --data " + f.data +
             " --dtype float64 --batch-size 5 --steps 0:10 --directions gradient,delta "
             "--token-buckets quantiles:3 -o " +
             out);
  H5Reader reader(out);
  CHECK(reader.attribute_string("/", "token_buckets") == "quantiles:3");
  const Table buckets = reader.table("/token_buckets");
  const Table taylor = reader.table("/taylor");
  REQUIRE(buckets.num_rows() == 4 * 3);  // 2 steps x 2 directions x 3 buckets
  for (size_t i = 0; i < taylor.num_rows(); ++i) {
    if (taylor.strings("block")[i] != "total") continue;
    double curvature = 0, loss = 0;
    for (size_t j = 0; j < buckets.num_rows(); ++j) {
      if (buckets.strings("run")[j] == taylor.strings("run")[i] &&
          buckets.int64s("step")[j] == taylor.int64s("step")[i] &&
          buckets.strings("direction")[j] == taylor.strings("direction")[i]) {
        curvature += buckets.doubles("curvature")[j];
        loss += buckets.doubles("loss")[j];
      }
    }
    CHECK(curvature == Approx(taylor.doubles("curvature")[i]).epsilon(1e-12));
    CHECK(loss == Approx(taylor.doubles("loss")[i]).epsilon(1e-12));
  }
  // Resuming keeps the finished units' bucket rows and adds the new ones.
  f.ndsprobe(f.run + " --data " + f.data +
             " --dtype float64 --batch-size 5 --steps 0:20 --directions gradient,delta "
             "--token-buckets quantiles:3 --resume -o " +
             out);
  CHECK(H5Reader(out).table("/token_buckets").num_rows() == 6 * 3);
  int rc = 0;
  const std::string err = f.ndsprobe(
      f.run + " --data " + f.data + " --token-buckets tails -o " + f.dir.file("x.h5"), &rc);
  CHECK(rc == 1);
  CHECK_THAT(err, Catch::Matchers::Contains("--token-buckets 'tails'"));
}

TEST_CASE("ndsprobe resumes: finished units are kept, not recomputed", "[ndsprobe]") {
  Fixture f;
  const std::string out = f.dir.file("out.h5");
  f.ndsprobe(f.run + " --data " + f.data + " --steps 0:10 --directions gradient -o " + out);
  H5Reader first(out);
  const double nds0 = first.attribute_double("/runs/run_a/step_0/gradient", "nds");
  f.ndsprobe(f.run + " --data " + f.data + " --directions gradient --resume -o " + out);
  H5Reader second(out);
  CHECK(second.attribute_double("/runs/run_a/step_0/gradient", "nds") == nds0);
  CHECK(second.exists("/runs/run_a/step_30/gradient"));
  CHECK(second.table("/taylor").num_rows() == 4 * (1 + 3));  // 4 steps x (total + 3 blocks)
  // Resuming with another probe set is refused, and the file is left as it was.
  const std::string before = read_file(out);
  int rc = 0;
  const std::string err = f.ndsprobe(f.run + " --data " + f.data +
                                         " --examples 5 --directions "
                                         "gradient --resume -o " +
                                         out,
                                     &rc);
  CHECK(rc != 0);
  CHECK_THAT(err, Catch::Matchers::Contains("probe_hash"));
  CHECK(read_file(out) == before);
}

TEST_CASE("ndsprobe in bfloat16: every unit records its precision; --resume at another is refused",
          "[ndsprobe][low_precision]") {
  Fixture f;
  const std::string out = f.dir.file("bf16.h5");
  const std::string base =
      f.run + " --data " + f.data + " --steps 0:10 --directions delta,adamw.whatif";
  int rc = 0;
  const std::string log = f.ndsprobe(base + " --dtype bfloat16 -o " + out, &rc);
  INFO(log);
  REQUIRE(rc == 0);
  {
    H5Reader r(out);
    CHECK(r.attribute_string("/", "dtype") == "bfloat16");
    CHECK(r.attribute_string("/", "vector_dtype") == "float32");
    for (const std::string unit :
         {"/runs/run_a/step_0/delta", "/runs/run_a/step_10/adamw.whatif"}) {
      INFO(unit);
      CHECK(r.attribute_string(unit, "dtype") == "bfloat16");
      CHECK(r.attribute_string(unit, "vector_dtype") == "float32");
      CHECK(r.attribute_string(unit, "hvp_method") == "exact");
      CHECK(std::isfinite(r.attribute_double(unit, "nds")));
    }
  }
  const std::string before = read_file(out);
  auto refused = [&](const std::string& args, const std::string& message) {
    int status = 0;
    const std::string text = f.ndsprobe(base + args + " --resume -o " + out, &status);
    INFO("args: " << args << "\noutput: " << text);
    CHECK(status != 0);
    CHECK_THAT(text, Catch::Matchers::Contains(message));
    CHECK(read_file(out) == before);
  };
  refused(" --dtype float32", "its dtype is 'bfloat16', this run's is 'float32'");
  refused(" --dtype bfloat16 --vector-dtype float64",
          "its vector_dtype is 'float32', this run's is 'float64'");
  refused(" --dtype bfloat16 --hvp fd", "its hvp_method is 'exact', this run's is 'fd'");
  // float16 runs where this LibTorch multiplies float16 matrices on the CPU, and is refused
  // before anything is read where it does not.
  const std::string half = f.ndsprobe(base + " --dtype float16 -o " + f.dir.file("fp16.h5"), &rc);
  if (cpu_matrix_products(at::kHalf)) {
    CHECK(rc == 0);
  } else {
    CHECK(rc == 1);
    CHECK_THAT(half,
               Catch::Matchers::Contains(
                   "--dtype float16: this LibTorch has no float16 matrix products on the CPU"));
  }
  // At the same precision it resumes.
  rc = -1;
  f.ndsprobe(base + " --dtype bfloat16 --vector-dtype float32 --resume -o " + out, &rc);
  CHECK(rc == 0);
}

TEST_CASE(
    "ndsprobe --plan counts what the run holds; --memory-budget refuses naming the largest part",
    "[ndsprobe][memory_plan]") {
  Fixture f;
  const std::string out = f.dir.file("plan.h5");
  const std::string base = f.run + " --data " + f.data + " --steps 0:10 --directions delta";
  int rc = -1;
  const std::string plan = f.ndsprobe(base + " --dtype bfloat16 --plan -o " + out, &rc);
  INFO(plan);
  CHECK(rc == 0);
  CHECK_FALSE(fs::exists(out));
  // The parameters in bfloat16, the gradient and u in float32 (the tiny GPT's 308 numbers).
  const int64_t n = parameter_count(f);
  CHECK_THAT(plan, Catch::Matchers::Contains(fmt::format("{} B  {} × 2 B (bfloat16)", 2 * n, n)));
  CHECK_THAT(plan, Catch::Matchers::Contains(fmt::format(
                       "gradient                      1.2 KiB  {} × 4 B (float32)", n)));
  CHECK_THAT(plan, Catch::Matchers::Contains("kept graphs"));
  CHECK_THAT(plan, Catch::Matchers::Contains("total"));
  // Over a budget: --plan and the run itself stop, naming the largest part; no file is written.
  const std::string refused = f.ndsprobe(base + " --plan --memory-budget 1K -o " + out, &rc);
  CHECK(rc == 1);
  CHECK_THAT(refused, Catch::Matchers::Contains("over its budget of --memory-budget 1 KiB"));
  CHECK_THAT(refused, Catch::Matchers::Contains("the largest part is 'kept graphs'"));
  CHECK_THAT(refused, Catch::Matchers::Contains("--micro-batch"));
  const std::string stopped = f.ndsprobe(base + " --memory-budget 1K -o " + out, &rc);
  CHECK(rc == 1);
  CHECK_THAT(stopped, Catch::Matchers::Contains("the largest part is 'kept graphs'"));
  CHECK_FALSE(fs::exists(out));
  // Within the budget the run goes ahead.
  f.ndsprobe(base + " --memory-budget 1G -o " + out, &rc);
  CHECK(rc == 0);
  CHECK(fs::exists(out));
}

TEST_CASE("the memory plan of a GPU run: host copies leave the device's total by their bytes",
          "[ndsprobe][memory_plan]") {
  Fixture f;
  ProbeJob job = gpu_delta_job(f);
  const int64_t n = parameter_count(f);
  auto part = [](const MemoryPlan& plan, const std::string& name) -> const MemoryPart& {
    if (const MemoryPart* p = find_part(plan, name)) return *p;
    FAIL("no part " << name << " in\n" << plan.describe());
    throw std::logic_error("unreachable");
  };
  const MemoryPlan on_device = plan_probe_job(job);
  INFO(on_device.describe());
  for (const char* name : {"next checkpoint (delta)", "θ saved to restore it"}) {
    CHECK(part(on_device, name).bytes == 2 * n);
    CHECK_FALSE(part(on_device, name).on_host);
    CHECK(part(on_device, name).fix == "in host memory with {6}");
  }
  job.engine.host_copies = true;
  const MemoryPlan host = plan_probe_job(job);
  INFO(host.describe());
  CHECK(part(host, "next checkpoint (delta)").on_host);
  CHECK(part(host, "θ saved to restore it").on_host);
  CHECK(on_device.total() - host.total() == 4 * n);
  CHECK_THAT(host.describe(), Catch::Matchers::Contains("in host memory (not counted on cuda):"));
  // On a GPU a rebuilt AdamW step holds one tensor's state at a time: two moments of the largest
  // tensor.
  job.run.directions = {"adamw"};
  int64_t largest = 0;
  for (const auto& t : f.thetas.front()) largest = std::max(largest, t.numel());
  CHECK(part(plan_probe_job(job), "optimizer state").bytes == 2 * largest * 4);
  // The state is read before any HVP: a phase of its own beside the audit's vectors, not on top
  // of a pass.
  job.run.directions = {"delta", "adamw"};
  const MemoryPlan with_state = plan_probe_job(job);
  INFO(with_state.describe());
  int64_t passes = 0;
  for (const auto& p : with_state.parts) {
    if (p.in_passes && !p.on_host) passes += p.bytes;
  }
  CHECK(with_state.phase_total(MemoryPhase::kAudit) == host.phase_total(MemoryPhase::kAudit));
  CHECK(with_state.phase_total(MemoryPhase::kDirection) ==
        host.phase_total(MemoryPhase::kAudit) - passes + 2 * largest * 4);
  CHECK_THAT(with_state.describe(), Catch::Matchers::Contains("[direction]"));
  // On the CPU the host is the device: nothing leaves the total, and the state's mapped files
  // count whole.
  job.model.init.device = "cpu";
  const MemoryPlan cpu = plan_probe_job(job);
  CHECK(part(cpu, "optimizer state").bytes == 2 * n * 4);
  CHECK_FALSE(part(cpu, "θ saved to restore it").on_host);
  CHECK(part(cpu, "θ saved to restore it").fix.empty());
}

TEST_CASE("the memory plan counts the solver vectors each spectrum method holds at its peak",
          "[ndsprobe][memory_plan]") {
  Fixture f;
  ProbeJob job = gpu_delta_job(f);  // bfloat16: float32 solver vectors
  const int64_t n = parameter_count(f);
  auto& sp = job.run.spectrum;
  auto vectors = [&]() -> int64_t {
    const MemoryPlan plan = plan_probe_job(job);
    INFO(plan.describe());
    const MemoryPart* p = find_part(plan, "solver vectors");
    if (p == nullptr) return 0;
    CHECK(p->phase == MemoryPhase::kSpectrum);
    CHECK(p->bytes % (4 * n) == 0);
    return p->bytes / (4 * n);
  };
  CHECK(vectors() == 0);
  sp.eigenvalues = true;
  sp.eigen.top = 1;
  sp.eigen.bottom = 0;
  sp.eigen.basis = KrylovBasis::kNone;
  // Without a basis: two, and the Ritz vector beside them when the recurrence runs again.
  CHECK(vectors() == 3);
  sp.eigen.bottom = 1;
  CHECK(vectors() == 4);
  sp.eigen.check_residuals = false;
  sp.eigen.keep_vectors = false;
  CHECK(vectors() == 2);
  sp.eigen.check_residuals = true;
  // A basis on the device: every step's vector, then the Ritz vectors beside them.
  sp.eigen.basis = KrylovBasis::kDevice;
  sp.eigen.top = 3;
  sp.eigen.max_hvps = 24;
  CHECK(vectors() == 28);
  // In host memory: the recurrence's two and the staging buffer, or the Ritz vectors and a
  // residual's product; on the CPU that memory is the device's.
  sp.eigen.basis = KrylovBasis::kHost;
  CHECK(vectors() == 5);
  job.model.init.device = "cpu";
  CHECK(vectors() == 28);
  job.model.init.device = "cuda";
  // Power iteration: the pairs found, its vector and product. The density's runs without a basis
  // hold two; the most of what is on is counted.
  sp.eigen.method = EigenMethod::kPower;
  sp.eigen.top = 2;
  sp.eigen.bottom = 0;
  CHECK(vectors() == 3);
  sp.density = true;
  sp.density_options.basis = KrylovBasis::kDevice;
  sp.density_options.steps = 10;
  CHECK(vectors() == 11);
  // Overlap keeps the top eigenvectors through the units.
  sp.overlap = true;
  const MemoryPlan plan = plan_probe_job(job);
  const MemoryPart* kept = find_part(plan, "eigenvectors (overlap)");
  REQUIRE(kept != nullptr);
  CHECK(kept->bytes == 2 * 4 * n);
  CHECK(kept->phase == MemoryPhase::kAudit);
}

TEST_CASE("ndsprobe spectrum options end to end, checked with h5py; resume skips them",
          "[ndsprobe][spectrum]") {
  Fixture f;
  // Steps 10 and 20 get AdamW state, so their preconditioned sharpness is available; 0 and 30
  // have no optimizer state.
  auto model = make_model(tiny_gpt_config(), ModelInit{1, at::kFloat});
  const ParamSpace& space = model->space();
  const std::string cfg = tiny_gpt_config().to_json();
  for (int k : {1, 2}) {
    NamedTensors state;
    for (size_t i = 0; i < space.size(); ++i) {
      state.emplace_back(space[i].name + ".exp_avg", at::randn(space[i].shape) * 1e-3);
      state.emplace_back(space[i].name + ".exp_avg_sq", at::rand(space[i].shape) * 1e-4 + 1e-6);
    }
    save_checkpoint(f.run, 10 * k, space, f.thetas[k], state,
                    R"({"model": )" + cfg + R"(, "optimizer": {"name": "adamw", "step_count": )" +
                        std::to_string(10 * k) +
                        R"(, "hyper": {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}}})");
  }
  const std::string out = f.dir.file("spectrum.h5");
  const std::string flags =
      " --dtype float64 --directions gradient,random --spectrum --eig-top 2 --eig-bottom 2 "
      "--spectrum-blocks --trace hutchpp --trace-hvps 30 --density --slq-runs 4 --slq-steps 20 "
      "--precond-sharpness --overlap --eig-tol 1e-8";
  f.ndsprobe(f.run + " --data " + f.data + flags + " -o " + out);
  run_python("check_spectrum_h5.py",
             {out, "run_a", "0,10,20,30", "gradient,random", "2", "2", "10,20"});
  H5Reader reader(out);
  CHECK_THAT(reader.attribute_string("/runs/run_a/step_0/spectrum/precond", "message"),
             Catch::Matchers::Contains("optimizer"));

  // Resuming with everything in the file spends no HVP and changes no number.
  std::string log;
  const int rc = run_command(
      tool_path("ndsprobe") + " " + f.run + " --data " + f.data + flags + " --resume -o " + out,
      &log);
  INFO(log);
  REQUIRE(rc == 0);
  CHECK_THAT(log, Catch::Matchers::Contains(" 0 HVPs"));
  H5Reader after(out);
  CHECK(after.table("/runs/run_a/step_10/spectrum/eigen").doubles("eigenvalue") ==
        reader.table("/runs/run_a/step_10/spectrum/eigen").doubles("eigenvalue"));

  // The other eigen-solvers agree with Lanczos at step 10: Spectra on every block, power
  // iteration on the largest |λ|.
  const Table lanczos = reader.table("/runs/run_a/step_10/spectrum/eigen");
  auto value_of = [](const Table& t, const std::string& block, const std::string& which) {
    for (size_t i = 0; i < t.num_rows(); ++i) {
      if (t.strings("block")[i] == block && t.strings("which")[i] == which &&
          t.int64s("rank")[i] == 0)
        return t.doubles("eigenvalue")[i];
    }
    FAIL("no " << which << " eigenvalue of block " << block);
    return 0.0;
  };
  const std::string other = f.dir.file("other.h5");
  f.ndsprobe(f.run + " --data " + f.data +
             " --dtype float64 --directions gradient --steps 10 "
             "--spectrum --spectrum-blocks --eig-method spectra --eig-tol 1e-10 -o " +
             other);
  const Table spectra = H5Reader(other).table("/runs/run_a/step_10/spectrum/eigen");
  CHECK(spectra.num_rows() == lanczos.num_rows() / 2);  // top 1 + bottom 1 instead of 2 + 2
  for (const std::string& block : spectra.strings("block")) {
    for (const std::string which : {"largest", "smallest"}) {
      INFO(block << " " << which);
      CHECK(value_of(spectra, block, which) ==
            Approx(value_of(lanczos, block, which)).epsilon(1e-7));
    }
  }
  f.ndsprobe(f.run + " --data " + f.data +
             " --dtype float64 --directions gradient --steps 10 "
             "--spectrum --eig-method power --eig-tol 1e-12 --eig-max-hvps 20000 -o " +
             other);
  const double lmax = value_of(lanczos, "total", "largest");
  const double lmin = value_of(lanczos, "total", "smallest");
  const double dominant = std::abs(lmax) >= std::abs(lmin) ? lmax : lmin;
  CHECK(value_of(H5Reader(other).table("/runs/run_a/step_10/spectrum/eigen"), "total",
                 "dominant") == Approx(dominant).epsilon(1e-6));

  // Bad spectrum options name the flag.
  int status = 0;
  std::string err = f.ndsprobe(f.run + " --data " + f.data +
                                   " --spectrum --eig-method power "
                                   "--eig-bottom 2 -o " +
                                   f.dir.file("bad.h5"),
                               &status);
  CHECK(status != 0);
  CHECK_THAT(err, Catch::Matchers::Contains("--eig-bottom 2"));
  err = f.ndsprobe(
      f.run + " --data " + f.data + " --trace hutchpp --trace-hvps 4 -o " + f.dir.file("bad.h5"),
      &status);
  CHECK(status != 0);
  CHECK_THAT(err, Catch::Matchers::Contains("--trace-hvps 4"));
}

TEST_CASE("ndsprobe rejects bad input clearly and leaves existing output intact", "[ndsprobe]") {
  Fixture f;
  const std::string out = f.dir.file("out.h5");
  f.ndsprobe(f.run + " --data " + f.data + " --steps 0:0 --directions gradient -o " + out);
  const std::string before = read_file(out);
  auto expect_error = [&](const std::string& args, const std::string& message) {
    int rc = 0;
    const std::string text = f.ndsprobe(args + " -o " + out, &rc);
    INFO("args: " << args << "\noutput: " << text);
    CHECK(rc != 0);
    CHECK_THAT(text, Catch::Matchers::Contains(message));
    CHECK(read_file(out) == before);
  };
  // An empty directory and a missing one.
  fs::create_directories(f.dir.file("empty"));
  expect_error(f.dir.file("empty") + " --data " + f.data, "no checkpoints");
  expect_error(f.dir.file("missing") + " --data " + f.data, "missing");
  // A checkpoint with a parameter renamed (missing + extra) and one with a wrong shape.
  auto model = make_model(tiny_gpt_config(), ModelInit{1, at::kFloat});
  ParamVector theta = snapshot_parameters(*model);
  auto names = model->space().names();
  {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (size_t i = 0; i < names.size(); ++i) {
      tensors.emplace_back(i == 3 ? "transformer.h.0.ln1.bias" : names[i], theta[i]);
    }
    fs::create_directories(f.dir.file("renamed/step_0"));
    write_safetensors(f.dir.file("renamed/step_0/model.safetensors"), tensors);
  }
  expect_error(f.dir.file("renamed") + " --data " + f.data + " --model " + f.config,
               "transformer.h.0.ln_1.bias");
  {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (size_t i = 0; i < names.size(); ++i) {
      tensors.emplace_back(names[i], i == 2 ? at::zeros({5}) : theta[i]);
    }
    fs::create_directories(f.dir.file("reshaped/step_0"));
    write_safetensors(f.dir.file("reshaped/step_0/model.safetensors"), tensors);
  }
  expect_error(f.dir.file("reshaped") + " --data " + f.data + " --model " + f.config, "[5]");
  // A truncated model file.
  fs::create_directories(f.dir.file("truncated/step_0"));
  {
    const std::string bytes = read_file(f.run + "/step_0/model.safetensors");
    std::ofstream(f.dir.file("truncated/step_0/model.safetensors"), std::ios::binary)
        << bytes.substr(0, bytes.size() / 2);
  }
  expect_error(f.dir.file("truncated") + " --data " + f.data + " --model " + f.config,
               "model.safetensors");
  // Probe data of the wrong shape for the model, data without targets, an unknown direction.
  const std::string bad_data = f.dir.file("bad.safetensors");
  write_safetensors(bad_data, {{"inputs", at::zeros({3, 9}, at::kLong)},
                               {"targets", at::zeros({3, 9}, at::kLong)}});
  expect_error(f.run + " --data " + bad_data, "block_size");
  const std::string no_targets = f.dir.file("no_targets.safetensors");
  write_safetensors(no_targets, {{"inputs", at::zeros({3, 4}, at::kLong)}});
  expect_error(f.run + " --data " + no_targets, "'targets'");
  expect_error(f.run + " --data " + f.data + " --directions delta,adamx", "adamx");
  // An output in a directory that does not exist, without touching anything else.
  int rc = 0;
  const std::string text =
      f.ndsprobe(f.run + " --data " + f.data + " -o " + f.dir.file("nope/out.h5"), &rc);
  CHECK(rc != 0);
  CHECK_THAT(text, Catch::Matchers::Contains("nope"));
  // A bad flag value is a usage error.
  expect_error(f.run + " --data " + f.data + " --coupling exact", "coupling");
}

TEST_CASE("a killed ndsprobe run leaves a readable file or none", "[ndsprobe]") {
  Fixture f;
  int readable = 0;
  for (const char* after : {"0.7", "1.0", "1.3", "1.8"}) {
    const std::string out = f.dir.file(std::string("killed_") + after + ".h5");
    std::string output;
    run_command("timeout -s KILL " + std::string(after) + " " + tool_path("ndsprobe") + " " +
                    f.run + " --data " + f.data + " --dtype float64 --within --quiet -o " + out,
                &output);
    if (!fs::exists(out)) continue;
    // Whatever was committed before the kill is a complete, readable file.
    H5Reader reader(out);
    CHECK(reader.attribute_string("/", "tool") == "ndsprobe");
    CHECK_NOTHROW(reader.table("/taylor"));
    ++readable;
  }
  INFO("files written before the kill: " << readable);
}

TEST_CASE("a custom driver running ProbeRun on its own engine writes ndsprobe's /taylor",
          "[ndsprobe]") {
  Fixture f;
  const std::string tool_out = f.dir.file("tool.h5");
  f.ndsprobe(f.run + " --data " + f.data +
             " --dtype float64 --within --directions delta,gradient --quiet -o " + tool_out);

  ProbeRunOptions options;
  options.runs = {f.run};
  options.directions = {"delta", "gradient"};
  options.within = true;
  ProbeRun run(options);
  REQUIRE(run.runs().size() == 1);
  CHECK(run.units() == 8);  // four checkpoints × two directions
  auto model = make_model(tiny_gpt_config(), ModelInit{9, at::kDouble});
  ProbeDataSource data;
  data.path = f.data;
  CurvatureEngine engine(*model, data.load());
  const BlockPartition blocks = BlockOptions{}.partition(model->space(), model->structure());
  const std::string lib_out = f.dir.file("library.h5");
  Provenance provenance = make_provenance("custom driver", "", "float64", 0, 0);
  provenance.model = model->describe();
  ProbeReport report(lib_out, provenance, /*resume=*/false);
  std::vector<std::string> labels;
  const ProbeRunSummary summary =
      run.execute(engine, blocks, report, [&](size_t done, size_t total, const std::string& label) {
        CHECK(total == 8);
        CHECK(done == labels.size() + 1);
        labels.push_back(label);
      });
  CHECK(labels.size() == 8);
  CHECK(summary.skipped == 0);

  const Table tool = H5Reader(tool_out).table("/taylor");
  const Table library = H5Reader(lib_out).table("/taylor");
  REQUIRE(library.num_rows() == tool.num_rows());
  REQUIRE(library.num_rows() > 0);
  CHECK(library.strings("direction") == tool.strings("direction"));
  CHECK(library.strings("block") == tool.strings("block"));
  for (const std::string column : {"curvature", "nds", "first_order", "predicted", "realized"}) {
    const auto& a = library.doubles(column);
    const auto& b = tool.doubles(column);
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(column << " row " << i);
      if (std::isnan(b[i])) {
        CHECK(std::isnan(a[i]));
      } else {
        CHECK(a[i] == Approx(b[i]).epsilon(1e-10).margin(1e-300));
      }
    }
  }
}

TEST_CASE("out of memory in a unit: one message naming it, the finished units kept, resumable",
          "[ndsprobe][memory]") {
  Fixture f;
  ProbeRunOptions options;
  options.runs = {f.run};
  options.directions = {"delta", "gradient"};
  auto model = make_model(tiny_gpt_config(), ModelInit{9, at::kDouble});
  ProbeDataSource data;
  data.path = f.data;
  const ProbeSet probe = data.load();
  const BlockPartition blocks = BlockOptions{}.partition(model->space(), model->structure());
  Provenance provenance = make_provenance("custom driver", "", "float64", 0, 0);
  provenance.model = model->describe();
  const std::string out = f.dir.file("oom.h5");

  // How many losses the first two units (step 0's delta and gradient) evaluate.
  int64_t after_two_units = 0;
  {
    ExhaustingObjective counting(*model, std::numeric_limits<int64_t>::max());
    CurvatureEngine engine(counting, probe);
    ProbeReport report(f.dir.file("counting.h5"), provenance, /*resume=*/false);
    ProbeRun(options).execute(engine, blocks, report, [&](size_t done, size_t, const auto&) {
      if (done == 2) after_two_units = counting.calls();
    });
  }
  REQUIRE(after_two_units > 0);
  {
    // Step 10's gradient pass fits; its delta's audit runs out of memory.
    ExhaustingObjective exhausting(*model, after_two_units + static_cast<int64_t>(probe.size()));
    CurvatureEngine engine(exhausting, probe);
    ProbeReport report(out, provenance, /*resume=*/false);
    try {
      ProbeRun(options).execute(engine, blocks, report);
      FAIL("no error");
    } catch (const OutOfMemory& e) {
      const std::string what = e.what();
      CHECK_THAT(what, Catch::Contains("run_a step 10 delta: "));
      CHECK_THAT(what, Catch::Contains("EngineOptions.micro_batch"));
      CHECK_THAT(what, Catch::Contains("ProbeJob.resume"));
      CHECK_THAT(what, Catch::Contains(out));
    }
  }
  auto units_in = [](const std::string& path) {
    const Table taylor = H5Reader(path).table("/taylor");
    std::set<std::pair<int64_t, std::string>> units;
    for (size_t i = 0; i < taylor.num_rows(); ++i) {
      units.emplace(taylor.int64s("step")[i], taylor.strings("direction")[i]);
    }
    return units;
  };
  // The units finished before it are in the file; the same run resumed completes it.
  using Unit = std::pair<int64_t, std::string>;
  CHECK(units_in(out) == std::set<Unit>{{0, "delta"}, {0, "gradient"}});
  CurvatureEngine engine(*model, probe);
  ProbeReport report(out, provenance, /*resume=*/true);
  const ProbeRunSummary summary = ProbeRun(options).execute(engine, blocks, report);
  CHECK(summary.skipped == 2);
  // Four checkpoints x two directions, but no delta at the last.
  CHECK(units_in(out).size() == 7);
}

TEST_CASE("ndsprobe reads optimizer state only for directions that use it", "[ndsprobe]") {
  Fixture f;
  // Damage one checkpoint's optimizer state: delta and gradient never read it, adamw must.
  std::ofstream(f.run + "/step_10/optimizer.safetensors", std::ios::binary) << "not safetensors";
  const std::string out = f.dir.file("out.h5");
  int rc = 0;
  const std::string text = f.ndsprobe(
      f.run + " --data " + f.data + " --directions delta,gradient --quiet -o " + out, &rc);
  INFO(text);
  CHECK(rc == 0);
  H5Reader reader(out);
  CHECK(reader.attribute_double("/runs/run_a/step_10/delta", "update_norm") > 0);
  const std::string failed =
      f.ndsprobe(f.run + " --data " + f.data +
                     " --steps 10:10 --directions adamw.whatif --quiet -o " + f.dir.file("x.h5"),
                 &rc);
  CHECK(rc != 0);
  CHECK_THAT(failed, Catch::Matchers::Contains("step_10/optimizer.safetensors"));
}

TEST_CASE("the tools run OpenBLAS's vector kernels where OpenBLAS fell back to generic ones",
          "[ndsprobe]") {
  Fixture f;
  const std::string out = f.dir.file("out.h5");
  f.ndsprobe(f.run + " --data " + f.data + " --steps 0:0 --directions gradient --quiet -o " + out);
  const std::string runtime = H5Reader(out).attribute_string("/", "runtime");
  INFO("tool: " << runtime << "; this process: OpenBLAS " << openblas_core());
  if (openblas_core().empty()) {
    CHECK_THAT(runtime, !Catch::Matchers::Contains("OpenBLAS"));
    return;
  }
  // This process loaded OpenBLAS as the environment says; the tool re-executes itself with the
  // better core when there is one.
  const std::string better = better_openblas_core();
  CHECK_THAT(runtime,
             Catch::Matchers::Contains("OpenBLAS " + (better.empty() ? openblas_core() : better)));
  // A core the user chose is left alone.
  ::setenv("OPENBLAS_CORETYPE", "Prescott", 1);
  CHECK(better_openblas_core().empty());
  ::unsetenv("OPENBLAS_CORETYPE");
}

namespace {

// Every column of the two files' /taylor tables, bit for bit.
void check_taylor_identical(const std::string& a, const std::string& b) {
  const Table ta = H5Reader(a).table("/taylor"), tb = H5Reader(b).table("/taylor");
  REQUIRE(ta.names() == tb.names());
  REQUIRE(ta.num_rows() == tb.num_rows());
  for (const auto& name : ta.names()) {
    INFO(name);
    const auto& ca = ta.column(name);
    const auto& cb = tb.column(name);
    if (const auto* x = std::get_if<std::vector<double>>(&ca)) {
      const auto& y = std::get<std::vector<double>>(cb);
      CHECK(std::memcmp(x->data(), y.data(), x->size() * sizeof(double)) == 0);
    } else {
      CHECK(ca == cb);
    }
  }
}

// A GPT run of checkpoints 0, 10, ..., last_step whose audit takes a few seconds: enough units
// to be interrupted between commits.
struct InterruptibleRun {
  TempDir dir;
  std::string run, data;
  explicit InterruptibleRun(int last_step) {
    GptConfig g;
    g.vocab_size = 64;
    g.block_size = 32;
    g.n_layer = 2;
    g.n_head = 4;
    g.n_embd = 64;
    const ModelConfig cfg("gpt", g);
    auto model = make_model(cfg, ModelInit{1, at::kFloat});
    const ProbeSet probe = gpt_probe(3, 32, 32, g.vocab_size, g.block_size);
    data = dir.file("probe.safetensors");
    run = dir.file("run");
    write_safetensors(data, {{"inputs", probe[0].inputs}, {"targets", probe[0].targets}});
    for (int step = 0; step <= last_step; step += 10) {
      ParamVector theta = random_direction(*model, 100 + step);
      for (auto& t : theta) t = t.mul(0.05).to(at::kFloat);
      save_checkpoint(run, step, model->space(), theta, {}, R"({"model": )" + cfg.to_json() + "}");
    }
  }
  // ndsprobe's arguments for this run, one thread, batches of 8, plus `flags`.
  std::string args(const std::string& flags) const {
    return fmt::format("{} --data {} --batch-size 8 --threads 1 {}", run, data, flags);
  }
};

constexpr const char* kReliabilityDirections = "--directions gradient,random,delta";

}  // namespace

TEST_CASE("ndsprobe stops cleanly on SIGINT and SIGTERM and --resume completes it bit for bit",
          "[ndsprobe][signals]") {
  InterruptibleRun f(30);
  TempDir& dir = f.dir;
  const std::string args = f.args("--directions gradient,random --within --modes 2");
  const std::string whole = dir.file("whole.h5");
  int status = 0;
  run_tool("ndsprobe", args + " --quiet -o " + whole, &status);
  REQUIRE(status == 0);
  const size_t units = H5Reader(whole).table("/taylor").num_rows();

  for (const auto& [signal, code] : {std::pair<std::string, int>{"INT", 130}, {"TERM", 143}}) {
    INFO("SIG" << signal);
    const std::string out = dir.file("interrupted_" + signal + ".h5");
    // Started in the background; the signal comes as soon as the first unit is committed.
    std::string log;
    const int rc = run_command(
        fmt::format("{} {} -o {} 2> {}.log & pid=$!; "
                    "while [ ! -f {} ] && kill -0 $pid 2>/dev/null; do sleep 0.05; done; "
                    "kill -{} $pid; wait $pid; status=$?; cat {}.log; exit $status",
                    tool_path("ndsprobe"), args, out, out, out, signal, out),
        &log);
    INFO(log);
    CHECK(rc == code);
    CHECK_THAT(log, Catch::Matchers::Contains("interrupted by SIG" + signal) &&
                        Catch::Matchers::Contains("--resume"));
    // What was committed is a readable file holding fewer units than the whole run.
    const size_t partial = H5Reader(out).table("/taylor").num_rows();
    CHECK(partial > 0);
    CHECK(partial < units);
    run_tool("ndsprobe", args + " --quiet --resume -o " + out, &status);
    REQUIRE(status == 0);
    const Table resumed = H5Reader(out).table("/taylor"),
                reference = H5Reader(whole).table("/taylor");
    REQUIRE(resumed.num_rows() == units);
    for (const auto& column : {"loss", "first_order", "curvature", "nds", "realized", "within"}) {
      INFO(column);
      const auto& a = resumed.doubles(column);
      const auto& b = reference.doubles(column);
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
    }
  }
}

TEST_CASE(
    "kill -9 at 20 random moments: every survivor file is readable and --resume gives the "
    "uninterrupted /taylor bit for bit",
    "[ndsprobe][reliability]") {
  InterruptibleRun f(50);
  const std::string args = f.args(kReliabilityDirections);
  const std::string whole = f.dir.file("whole.h5");
  const auto start = std::chrono::steady_clock::now();
  run_tool("ndsprobe", args + " --quiet -o " + whole);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const size_t units = H5Reader(whole).table("/taylor").num_rows();
  // Moments spread over the whole run, process start included, from a fixed seed.
  std::mt19937_64 gen(2026);
  std::uniform_real_distribution<double> moment(0.0, seconds);
  size_t partial_files = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const double delay = moment(gen);
    INFO("trial " << trial << ", kill after " << delay << " s of " << seconds);
    const std::string out = f.dir.file(fmt::format("killed{}.h5", trial));
    run_command(
        fmt::format("{} {} --quiet -o {} 2>/dev/null & pid=$!; sleep {:.3f}; kill -9 $pid; "
                    "wait $pid",
                    tool_path("ndsprobe"), args, out, delay));
    if (fs::exists(out)) {
      // Readable, and holding only whole units.
      const size_t rows = H5Reader(out).table("/taylor").num_rows();
      CHECK(rows <= units);
      partial_files += rows < units ? 1 : 0;
    }
    run_tool("ndsprobe", args + " --quiet --resume -o " + out);
    check_taylor_identical(whole, out);
  }
  // The moments fell inside the run, not only before its first or after its last commit.
  CHECK(partial_files >= 5);
}

TEST_CASE(
    "a full file system (RLIMIT_FSIZE) stops the run with a clear error, keeps the last "
    "committed file and --resume completes it",
    "[ndsprobe][reliability]") {
  InterruptibleRun f(50);
  const std::string args = f.args(kReliabilityDirections);
  const std::string whole = f.dir.file("whole.h5"), out = f.dir.file("full.h5");
  run_tool("ndsprobe", args + " --quiet -o " + whole);
  const auto size = fs::file_size(whole);
  // Files may grow to half the final size: the early commits fit, the later ones do not. An
  // ignored SIGXFSZ makes the write fail with EFBIG instead of killing the process.
  std::string log;
  const int status =
      run_command(fmt::format("bash -c \"trap '' XFSZ; ulimit -f {}; {} {} --quiet -o {}\"",
                              size / 2048, tool_path("ndsprobe"), args, out),
                  &log);
  INFO(log);
  CHECK(status == 1);
  CHECK_THAT(log, Catch::Matchers::Contains("ndsprobe: error:") && Catch::Matchers::Contains(out));
  const size_t rows = H5Reader(out).table("/taylor").num_rows();
  CHECK(rows > 0);
  CHECK(rows < H5Reader(whole).table("/taylor").num_rows());
  CHECK_FALSE(fs::exists(out + ".tmp"));
  run_tool("ndsprobe", args + " --quiet --resume -o " + out);
  check_taylor_identical(whole, out);
}

TEST_CASE("a checkpoint changed between a run and its resume is named and the file kept",
          "[ndsprobe][reliability]") {
  Fixture f;
  const std::string out = f.dir.file("out.h5");
  const std::string args = f.run + " --data " + f.data + " --directions delta,random -o " + out;
  f.ndsprobe(args);
  CHECK_THAT(H5Reader(out).attribute_string("/runs/run_a/step_10", "checkpoint_digest"),
             Catch::Matchers::StartsWith("recorded:"));
  // Unchanged checkpoints resume (nothing to do).
  f.ndsprobe(args + " --resume");
  // A file guarded by the full digest resumes without the flag: each digest is compared with
  // one of its kind.
  const std::string full = f.dir.file("full.h5");
  const std::string full_args =
      f.run + " --data " + f.data + " --directions delta,random -o " + full;
  f.ndsprobe(full_args + " --full-digest");
  CHECK_THAT(H5Reader(full).attribute_string("/runs/run_a/step_10", "checkpoint_digest"),
             Catch::Matchers::StartsWith("crc32:"));
  f.ndsprobe(full_args + " --resume");
  const std::string before = read_file(out);
  // step_10 saved again with other weights.
  ParamVector theta = f.thetas[1];
  for (auto& t : theta) t = t * 1.5;
  auto model = make_model(tiny_gpt_config(), ModelInit{1, at::kFloat});
  save_checkpoint(f.run, 10, model->space(), theta, {},
                  R"({"model": )" + tiny_gpt_config().to_json() + "}");
  int status = 0;
  const std::string text = f.ndsprobe(args + " --resume", &status);
  CHECK(status == 1);
  CHECK_THAT(text, Catch::Matchers::Contains("changed since its results were written") &&
                       Catch::Matchers::Contains(f.run + "/step_10") &&
                       Catch::Matchers::Contains("step 10"));
  CHECK(read_file(out) == before);
}
