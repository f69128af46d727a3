// Data parallelism on c10d (Gloo over 127.0.0.1, one thread per process): the engine, the Taylor
// audit and the spectrum on 2 and 3 processes against one process (float64, 1e-12 relative), the
// ranks bit-identical; a failure on one rank raised on every rank; ndsprobe by hand and under
// torchrun against one process; a killed rank named, the output intact and --resume completing it.
#include "curv/core/distributed.h"

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "curv/analysis/spectrum.h"
#include "curv/analysis/taylor.h"
#include "curv/core/blocks.h"
#include "curv/core/engine.h"
#include "curv/core/linear_operator.h"
#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/io/safetensors.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;
namespace fs = std::filesystem;

namespace {

// A port no one listens on now (the kernel's pick), for a fresh rendezvous per test.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string rank_environment(int rank, int world, int port) {
  return fmt::format(
      "env WORLD_SIZE={} RANK={} MASTER_ADDR=127.0.0.1 MASTER_PORT={} GLOO_SOCKET_IFNAME=lo "
      "OMP_NUM_THREADS=1",
      world, rank, port);
}

// Named segments of results, written and read as binary doubles.
using Results = std::vector<std::pair<std::string, std::vector<double>>>;

std::vector<double> flat_values(const ParamVector& x) {
  std::vector<double> out;
  for (const auto& t : x) {
    const at::Tensor d = t.detach().to(at::kDouble).contiguous().reshape({-1});
    out.insert(out.end(), d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
  }
  return out;
}

std::vector<double> matrix_values(const Eigen::MatrixXd& m) {
  return std::vector<double>(m.data(), m.data() + m.size());
}

// Everything the engine and the analyses compute on a tiny float64 GPT over 6 uneven batches.
Results engine_results(const std::shared_ptr<Communicator>& comm) {
  auto model = make_model(tiny_gpt_config(), ModelInit{3, at::kDouble});
  const ProbeSet probe = gpt_probe(11, 23, 4);  // batches of 4, 4, 4, 4, 4, 3
  EngineOptions options;
  options.communicator = comm;
  CurvatureEngine engine(*model, probe, options);
  const ParamVector v = random_direction(*model, 5);
  Results r;
  r.push_back({"loss", {engine.loss()}});
  r.push_back({"batch_losses", engine.batch_losses()});
  r.push_back({"gradient", flat_values(engine.gradient())});
  r.push_back({"hvp", flat_values(engine.hvp(v))});
  r.push_back({"hvp_support", flat_values(engine.hvp(v, std::vector<size_t>{0, 2}))});
  r.push_back({"hvp_fd", flat_values(engine.hvp_finite_difference(v))});
  std::vector<double> at_step;
  r.push_back({"loss_at", {engine.loss_at(scaled(v, 0.01), &at_step)}});
  r.push_back({"loss_at_batches", at_step});
  std::vector<std::vector<size_t>> supports{{0, 1}, {2, 3, 4}};
  r.push_back({"gauss_newton", matrix_values(engine.gauss_newton(v, supports))});

  const BlockPartition blocks = BlockPartition::by_rule(
      engine.space(), engine.objective().structure(), BlockPartition::parse_rule("layer"));
  TaylorOptions taylor;
  taylor.ggn = true;
  taylor.ggn_blocks = true;
  taylor.step_multipliers = {0.5, 2.0};
  const TaylorResult t = taylor_audit(engine, v, blocks, taylor);
  r.push_back({"taylor",
               {t.curvature, t.nds, t.first_order, t.realized, t.s_within, t.ggn_curvature,
                t.residual_curvature, t.multipliers[1].realized}});
  r.push_back({"coupling", matrix_values(t.coupling)});
  r.push_back({"batch_first_order", matrix_values(t.batches.block_first_order)});
  r.push_back({"batch_curvature", matrix_values(t.batches.block_curvature)});
  r.push_back({"batch_row_sum", matrix_values(t.batches.block_row_sum)});
  r.push_back({"batch_ggn", t.batches.ggn});
  r.push_back({"batch_realized", t.batches.realized});
  std::vector<double> stderrs{t.nds_stderr, t.ggn_nds_stderr, t.multipliers[0].realized_stderr};
  for (const auto& b : t.blocks) stderrs.push_back(b.curvature_stderr);
  r.push_back({"stderrs", stderrs});

  taylor.coupling = CouplingMode::kRandomized;
  taylor.coupling_samples = 3;
  taylor.ggn = false;
  const TaylorResult randomized = taylor_audit(engine, v, blocks, taylor);
  r.push_back({"randomized_batches", matrix_values(randomized.batches.block_curvature)});

  HessianOperator hessian(engine);
  EigenOptions eig;
  eig.top = 2;
  eig.bottom = 1;
  eig.max_hvps = 60;
  eig.keep_vectors = false;
  const EigenResult e = extreme_eigenpairs(hessian, eig);
  std::vector<double> values;
  for (const auto& p : e.largest) values.push_back(p.value);
  for (const auto& p : e.smallest) values.push_back(p.value);
  r.push_back({"eigenvalues", values});
  TraceOptions trace;
  trace.matvecs = 12;
  r.push_back({"trace", {estimate_trace(hessian, trace).estimate}});
  return r;
}

void write_results(const std::string& path, const Results& results) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& [name, values] : results) {
    const uint64_t n = values.size(), len = name.size();
    out.write(reinterpret_cast<const char*>(&len), sizeof len);
    out.write(name.data(), static_cast<std::streamsize>(len));
    out.write(reinterpret_cast<const char*>(&n), sizeof n);
    out.write(reinterpret_cast<const char*>(values.data()),
              static_cast<std::streamsize>(n * sizeof(double)));
  }
  REQUIRE(out.good());
}

Results read_results(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  Results results;
  uint64_t len = 0;
  while (in.read(reinterpret_cast<char*>(&len), sizeof len)) {
    std::string name(len, '\0');
    in.read(name.data(), static_cast<std::streamsize>(len));
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), sizeof n);
    std::vector<double> values(n);
    in.read(reinterpret_cast<char*>(values.data()),
            static_cast<std::streamsize>(n * sizeof(double)));
    results.push_back({name, values});
  }
  return results;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Runs `body` (commands started in the background) as a bash script that waits for all of them;
// the status is non-zero when any of them failed.
int run_script(const std::string& path, const std::string& body, std::string* log) {
  std::ofstream(path) << body
                      << "status=0\nfor p in $(jobs -p); do wait $p || status=1; done\n"
                         "exit $status\n";
  return run_command("bash " + path, log);
}

// Starts `world` copies of this test binary's hidden worker, each with its rank's environment and
// CURV_TEST_WORKER="scenario dir"; returns the shell's status (non-zero if any rank failed).
int run_workers(int world, const std::string& scenario, const std::string& dir, std::string* log) {
  const int port = free_port();
  std::string script;
  for (int r = 0; r < world; ++r) {
    script += fmt::format(
        "{} CURV_TEST_WORKER='{} {}' /proc/{}/exe '[.distributed_worker]' > {}/log{} 2>&1 &\n",
        rank_environment(r, world, port), scenario, dir, ::getpid(), dir, r);
  }
  return run_script(dir + "/workers.sh", script, log);
}

// ‖a − b‖ / ‖a‖ per segment, NaNs in the same places.
void check_close(const Results& reference, const Results& got, double tolerance) {
  REQUIRE(reference.size() == got.size());
  for (size_t s = 0; s < reference.size(); ++s) {
    const auto& [name, a] = reference[s];
    const auto& b = got[s].second;
    INFO(name);
    REQUIRE(got[s].first == name);
    REQUIRE(a.size() == b.size());
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      REQUIRE(std::isnan(a[i]) == std::isnan(b[i]));
      if (std::isnan(a[i])) continue;
      diff += (a[i] - b[i]) * (a[i] - b[i]);
      scale += a[i] * a[i];
    }
    CHECK(std::sqrt(diff) <= tolerance * std::sqrt(scale));
  }
}

}  // namespace

// Run by run_workers in separate processes, never by ctest (a hidden tag).
TEST_CASE("distributed worker", "[.distributed_worker]") {
  const char* spec = std::getenv("CURV_TEST_WORKER");
  REQUIRE(spec != nullptr);
  std::istringstream words(spec);
  std::string scenario, dir;
  words >> scenario >> dir;
  const auto comm = communicator_from_environment();
  const std::string out = fmt::format("{}/rank{}", dir, comm->rank());
  if (scenario == "results") {
    write_results(out, engine_results(comm));
  } else if (scenario == "nan_on_last_batch") {
    // The last batch, rank world-1's, has a NaN input: every rank must stop with its error.
    auto model = make_model(tiny_mlp_config(), ModelInit{1, at::kDouble});
    ProbeSet probe = mlp_probe(2, 10, 2);
    std::vector<Batch> batches;
    for (size_t b = 0; b < probe.size(); ++b) batches.push_back(probe[b]);
    batches.back().inputs = batches.back().inputs.clone();
    batches.back().inputs[0][0] = std::nan("");
    EngineOptions options;
    options.communicator = comm;
    CurvatureEngine engine(*model, ProbeSet(batches), options);
    std::string message = "no error";
    try {
      engine.loss();
    } catch (const NumericalError& e) {
      message = std::string("NumericalError: ") + e.what();
    }
    std::ofstream(out) << message;
  } else if (scenario == "root_failure_and_digest") {
    // A rank-0-only step that fails, then digests that differ between the ranks.
    std::string messages;
    try {
      on_root(*comm, [] { throw FormatError("cannot write 'x.h5'"); });
    } catch (const FormatError& e) {
      messages += std::string("FormatError: ") + e.what() + "\n";
    }
    try {
      check_same_on_all_ranks(*comm, 1000 + static_cast<uint64_t>(comm->rank() % 2), "test values");
    } catch (const DistributedError& e) {
      messages += std::string("DistributedError: ") + e.what() + "\n";
    }
    check_same_on_all_ranks(*comm, 42, "equal values");  // no error
    std::ofstream(out) << messages;
  }
}

TEST_CASE("balanced_split gives contiguous shares balanced by size", "[distributed]") {
  CHECK(balanced_split({1, 1, 1, 1, 1, 1}, 3) == std::vector<size_t>{0, 2, 4, 6});
  CHECK(balanced_split({4, 4, 4, 4, 4, 3}, 2) == std::vector<size_t>{0, 3, 6});
  CHECK(balanced_split({8, 1, 1, 1, 1}, 2) == std::vector<size_t>{0, 1, 5});
  // More ranks than items: the last ranks get none.
  CHECK(balanced_split({1, 1}, 4) == std::vector<size_t>{0, 1, 1, 2, 2});
  CHECK(balanced_split({5}, 1) == std::vector<size_t>{0, 1});
  CHECK_THROWS_AS(balanced_split({1}, 0), InvalidArgument);
}

TEST_CASE("the single-process communicator is rank 0 of 1 and changes nothing", "[distributed]") {
  auto comm = single_process();
  CHECK(comm->rank() == 0);
  CHECK(comm->world_size() == 1);
  CHECK_FALSE(comm->distributed());
  std::vector<double> x{1.5, -2.0};
  comm->all_reduce_sum(x.data(), x.size());
  CHECK(x == std::vector<double>{1.5, -2.0});
  // Without WORLD_SIZE (ctest's environment) the environment gives one process.
  if (!std::getenv("WORLD_SIZE")) CHECK(communicator_from_environment()->world_size() == 1);
}

namespace {

// Two ranks whose host sum doubles every number: what the device path hands it, and how.
class DoublingCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string backend() const override { return "doubling"; }
  void all_reduce_sum(double* data, size_t n) override {
    for (size_t i = 0; i < n; ++i) data[i] *= 2.0;
    ++host_sums;
  }
  void broadcast(std::string&, int) override {}
  void barrier() override {}
  int host_sums = 0;
};

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_.empty()) {
      unsetenv(name_);
    } else {
      setenv(name_, old_.c_str(), 1);
    }
  }

 private:
  const char* name_;
  std::string old_;
};

}  // namespace

TEST_CASE("a tensor sum without a device backend goes through one float64 host sum",
          "[distributed]") {
  DoublingCommunicator comm;
  at::Tensor f64 = at::arange(5, at::kDouble);
  const void* storage = f64.data_ptr();
  comm.all_reduce_sum_on_device(f64);
  CHECK(f64.data_ptr() == storage);  // summed in place
  CHECK(at::equal(f64, 2 * at::arange(5, at::kDouble)));
  at::Tensor f32 = at::tensor({0.1f, 3.0f});
  comm.all_reduce_sum_on_device(f32);
  CHECK(f32.scalar_type() == at::kFloat);
  CHECK(at::equal(f32, at::tensor({0.2f, 6.0f})));
  CHECK(comm.host_sums == 2);
  at::Tensor one = at::ones({3}, at::kDouble);
  single_process()->all_reduce_sum_on_device(one);
  CHECK(at::equal(one, at::ones({3}, at::kDouble)));
}

TEST_CASE("under torchrun a bare cuda device becomes cuda:LOCAL_RANK", "[distributed]") {
  {
    ScopedEnv world("WORLD_SIZE", nullptr);
    CHECK(device_of_rank("cuda") == "cuda");
  }
  ScopedEnv world("WORLD_SIZE", "4");
  {
    ScopedEnv local("LOCAL_RANK", "3");
    CHECK(device_of_rank("cuda") == "cuda:3");
    CHECK(device_of_rank("cuda:0") == "cuda:0");  // a device given by index is kept
    CHECK(device_of_rank("cpu") == "cpu");
  }
  ScopedEnv local("LOCAL_RANK", nullptr);
  CURV_CHECK_THROWS(device_of_rank("cuda"), InvalidArgument,
                    Catch::Matchers::Contains("LOCAL_RANK is not set"));
}

TEST_CASE("torchrun's environment is checked: a missing or malformed variable is named",
          "[distributed]") {
  std::string log;
  const std::string probe = tool_path("ndsprobe") + " /nonexistent --data x.safetensors";
  CHECK(run_command("env WORLD_SIZE=2 RANK=0 MASTER_PORT=29500 " + probe, &log) != 0);
  CHECK_THAT(log, Catch::Matchers::Contains("MASTER_ADDR is not set"));
  CHECK(run_command("env WORLD_SIZE=2 RANK=5 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 " + probe,
                    &log) != 0);
  CHECK_THAT(log, Catch::Matchers::Contains("RANK='5'"));
  CHECK(run_command("env WORLD_SIZE=two " + probe, &log) != 0);
  CHECK_THAT(log, Catch::Matchers::Contains("WORLD_SIZE='two'"));
}

TEST_CASE(
    "2 and 3 ranks give the single-process engine results within 1e-12; ranks agree bit "
    "for bit",
    "[distributed]") {
  // scripts/setup-debian.sh installs gloo's headers: the data-parallel path is always built here.
  REQUIRE_THAT(distributed_backends(), Catch::Matchers::StartsWith("gloo"));
  const Results reference = engine_results(single_process());
  for (int world : {2, 3}) {
    INFO("world size " << world);
    TempDir dir;
    std::string log;
    const int status = run_workers(world, "results", dir.path(), &log);
    for (int r = 0; r < world; ++r) log += read_text(dir.file(fmt::format("log{}", r)));
    INFO(log);
    REQUIRE(status == 0);
    const Results rank0 = read_results(dir.file("rank0"));
    check_close(reference, rank0, 1e-12);
    for (int r = 1; r < world; ++r) {
      const Results other = read_results(dir.file(fmt::format("rank{}", r)));
      REQUIRE(other.size() == rank0.size());
      for (size_t s = 0; s < rank0.size(); ++s) {
        INFO(rank0[s].first);
        const auto& a = rank0[s].second;
        const auto& b = other[s].second;
        REQUIRE(a.size() == b.size());
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
      }
    }
  }
}

TEST_CASE("a NaN on one rank stops every rank with the same NumericalError naming it",
          "[distributed]") {
  // scripts/setup-debian.sh installs gloo's headers: the data-parallel path is always built here.
  REQUIRE_THAT(distributed_backends(), Catch::Matchers::StartsWith("gloo"));
  TempDir dir;
  std::string log;
  REQUIRE(run_workers(2, "nan_on_last_batch", dir.path(), &log) == 0);
  const std::string rank0 = read_text(dir.file("rank0")), rank1 = read_text(dir.file("rank1"));
  INFO(rank0 << "\n" << rank1);
  CHECK(rank0 == rank1);
  CHECK_THAT(rank0, Catch::Matchers::StartsWith("NumericalError: rank 1: loss of") &&
                        Catch::Matchers::Contains("probe batch 4"));
}

TEST_CASE("a rank-0 failure and differing digests stop every rank with the same error",
          "[distributed]") {
  // scripts/setup-debian.sh installs gloo's headers: the data-parallel path is always built here.
  REQUIRE_THAT(distributed_backends(), Catch::Matchers::StartsWith("gloo"));
  TempDir dir;
  std::string log;
  REQUIRE(run_workers(3, "root_failure_and_digest", dir.path(), &log) == 0);
  const std::string rank0 = read_text(dir.file("rank0"));
  INFO(rank0);
  CHECK(read_text(dir.file("rank1")) == rank0);
  CHECK(read_text(dir.file("rank2")) == rank0);
  CHECK_THAT(rank0,
             Catch::Matchers::Contains("FormatError: rank 0: cannot write 'x.h5'") &&
                 Catch::Matchers::Contains(
                     "DistributedError: the ranks' test values differ (rank 1 from rank 0)"));
}

TEST_CASE("curvtrain on 2 ranks trains the single-process run within 1e-10", "[distributed]") {
  REQUIRE_THAT(distributed_backends(), Catch::Matchers::StartsWith("gloo"));
  TempDir dir;
  const std::string args =
      "--steps 6 --save-every 3 --eval-every 3 --optimizer muon --batch-size 6 --dtype float64 "
      "--threads 1 --probe-every 2 --probe-on probe --quiet";
  run_tool("curvtrain", args + " -o " + dir.file("one") + " --probe-output " + dir.file("one.h5"));
  const int port = free_port();
  std::string script;
  for (int r = 0; r < 2; ++r) {
    script += fmt::format("{} {} {} -o {} --probe-output {} > {}/rank{}.log 2>&1 &\n",
                          rank_environment(r, 2, port), tool_path("curvtrain"), args,
                          dir.file("two"), dir.file("two.h5"), dir.path(), r);
  }
  std::string log;
  const int status = run_script(dir.file("train.sh"), script, &log);
  log += read_text(dir.file("rank0.log")) + read_text(dir.file("rank1.log"));
  INFO(log);
  REQUIRE(status == 0);
  const auto one = list_checkpoints(dir.file("one")), two = list_checkpoints(dir.file("two"));
  REQUIRE(one.size() == 3);
  REQUIRE(two.size() == 3);
  for (size_t k = 0; k < one.size(); ++k) {
    INFO("step " << one[k].step);
    const Checkpoint a = load_checkpoint(one[k]), b = load_checkpoint(two[k]);
    REQUIRE(a.model.size() == b.model.size());
    for (size_t i = 0; i < a.model.size(); ++i) {
      INFO(a.model[i].first);
      REQUIRE(a.model[i].first == b.model[i].first);
      const at::Tensor& t = a.model[i].second;
      CHECK(at::norm(b.model[i].second - t).item<double>() <= 1e-10 * at::norm(t).item<double>());
    }
  }
  // The probe set's audits (one batch, so rank 0 does them) equal the single process's.
  run_python("compare_h5.py", {dir.file("one.h5"), dir.file("two.h5"), "1e-10"});
  // Rank 0 alone wrote the log; both ranks' runs printed nothing else.
  CHECK(read_text(dir.file("two/log.csv")).find("step,lr") == 0);
  CHECK(read_text(dir.file("rank1.log")).empty());
}

namespace {

// A tiny GPT run of four checkpoints and a probe set of six batches.
struct ProbeFixture {
  TempDir dir;
  std::string run, data, args;
  ProbeFixture() {
    run = dir.file("run");
    data = dir.file("probe.safetensors");
    const ModelConfig cfg = tiny_gpt_config();
    auto model = make_model(cfg, ModelInit{1, at::kDouble});
    const ProbeSet probe = gpt_probe(7, 12, 12);
    write_safetensors(data, {{"inputs", probe[0].inputs}, {"targets", probe[0].targets}});
    for (int step = 0; step <= 30; step += 10) {
      ParamVector theta = random_direction(*model, 100 + step);
      for (auto& t : theta) t = t.mul(0.5);
      save_checkpoint(run, step, model->space(), theta, {}, R"({"model": )" + cfg.to_json() + "}");
    }
    args = fmt::format(
        "{} --data {} --batch-size 2 --dtype float64 --threads 1 --directions delta,random "
        "--within --modes 2 --ggn --spectrum --eig-top 2 --trace hutchinson --trace-hvps 9 --quiet",
        run, data);
  }
  // ndsprobe on `world` ranks started by hand; returns the shell's status.
  int on_ranks(int world, const std::string& extra, std::string* log) const {
    const int port = free_port();
    std::string script;
    for (int r = 0; r < world; ++r) {
      script +=
          fmt::format("{} {} {} {} > {}/rank{}.log 2>&1 &\n", rank_environment(r, world, port),
                      tool_path("ndsprobe"), args, extra, dir.path(), r);
    }
    const int status = run_script(dir.file("ranks.sh"), script, log);
    for (int r = 0; r < world; ++r) *log += read_text(dir.file(fmt::format("rank{}.log", r)));
    return status;
  }
};

// Every dataset of `b` equals `a`'s: floats within `tolerance` (norm-wise per dataset).
void check_files_close(const std::string& a, const std::string& b, double tolerance) {
  run_python("compare_h5.py", {a, b, fmt::format("{:g}", tolerance)});
}

}  // namespace

TEST_CASE("ndsprobe on 2 and 3 ranks writes the single-process file within 1e-12",
          "[distributed]") {
  // scripts/setup-debian.sh installs gloo's headers: the data-parallel path is always built here.
  REQUIRE_THAT(distributed_backends(), Catch::Matchers::StartsWith("gloo"));
  ProbeFixture f;
  const std::string single = f.dir.file("single.h5");
  run_tool("ndsprobe", f.args + " -o " + single);
  CHECK(H5Reader(single).attribute_int("/", "world_size") == 1);
  for (int world : {2, 3}) {
    INFO("world size " << world);
    const std::string out = f.dir.file(fmt::format("ranks{}.h5", world));
    std::string log;
    const int status = f.on_ranks(world, "-o " + out, &log);
    INFO(log);
    REQUIRE(status == 0);
    check_files_close(single, out, 1e-12);
    H5Reader reader(out);
    CHECK(reader.attribute_int("/", "world_size") == world);
    CHECK(reader.attribute_string("/", "distributed_backend") == "gloo");
    // Rank 0 alone prints the summary.
    CHECK_THAT(read_text(f.dir.file("rank0.log")), Catch::Matchers::Contains("mean NDS"));
    CHECK(read_text(f.dir.file("rank1.log")).empty());
  }
}

TEST_CASE(
    "a killed rank is named by the others, the output stays a valid earlier state and "
    "--resume completes it",
    "[distributed]") {
  // scripts/setup-debian.sh installs gloo's headers: the data-parallel path is always built here.
  REQUIRE_THAT(distributed_backends(), Catch::Matchers::StartsWith("gloo"));
  ProbeFixture f;
  const std::string whole = f.dir.file("whole.h5"), out = f.dir.file("killed.h5");
  run_tool("ndsprobe", f.args + " -o " + whole);
  const size_t units = H5Reader(whole).table("/taylor").num_rows();
  const int port = free_port();
  const std::string p = tool_path("ndsprobe");
  // Rank 1 is killed as soon as rank 0 first commits the output.
  std::string log;
  const std::string script = fmt::format(
      "{} {} {} -o {} --dist-timeout 60 2> {}/rank0.log & r0=$!\n"
      "{} {} {} -o {} --dist-timeout 60 2> /dev/null & r1=$!\n"
      "while [ ! -f {} ] && kill -0 $r0 2>/dev/null; do sleep 0.02; done\n"
      "kill -9 $r1\nwait $r0\nexit $?\n",
      rank_environment(0, 2, port), p, f.args, out, f.dir.path(), rank_environment(1, 2, port), p,
      f.args, out, out);
  std::ofstream(f.dir.file("kill.sh")) << script;
  const int status = run_command("bash " + f.dir.file("kill.sh"), &log);
  log += read_text(f.dir.file("rank0.log"));
  INFO(log);
  CHECK(status == 1);
  CHECK_THAT(log, Catch::Matchers::Contains("lost rank 1"));
  // A readable file holding the units committed before the kill (the first commit may hold only
  // the first checkpoint's spectrum).
  const size_t partial = H5Reader(out).table("/taylor").num_rows();
  CHECK(partial < units);
  // A single process resumes the file two ranks started.
  run_tool("ndsprobe", f.args + " --resume -o " + out);
  check_files_close(whole, out, 1e-12);
}

TEST_CASE("SIGINT on one rank stops both after the same unit and --resume completes the file",
          "[distributed]") {
  REQUIRE_THAT(distributed_backends(), Catch::Matchers::StartsWith("gloo"));
  ProbeFixture f;
  const std::string whole = f.dir.file("whole.h5"), out = f.dir.file("stopped.h5");
  run_tool("ndsprobe", f.args + " -o " + whole);
  const int port = free_port();
  const std::string p = tool_path("ndsprobe");
  const std::string script = fmt::format(
      "{} {} {} -o {} 2> {}/rank0.log & r0=$!\n"
      "{} {} {} -o {} 2> {}/rank1.log & r1=$!\n"
      "while [ ! -f {} ] && kill -0 $r0 2>/dev/null; do sleep 0.02; done\n"
      "kill -INT $r1\nwait $r0; s0=$?\nwait $r1; s1=$?\necho \"statuses $s0 $s1\"\n",
      rank_environment(0, 2, port), p, f.args, out, f.dir.path(), rank_environment(1, 2, port), p,
      f.args, out, f.dir.path(), out);
  std::ofstream(f.dir.file("stop.sh")) << script;
  std::string log;
  run_command("bash " + f.dir.file("stop.sh"), &log);
  log += read_text(f.dir.file("rank0.log")) + read_text(f.dir.file("rank1.log"));
  INFO(log);
  CHECK_THAT(log, Catch::Matchers::Contains("statuses 130 130"));
  CHECK(H5Reader(out).table("/taylor").num_rows() < H5Reader(whole).table("/taylor").num_rows());
  run_tool("ndsprobe", f.args + " --resume -o " + out);
  check_files_close(whole, out, 1e-12);
}

TEST_CASE("torchrun starts ndsprobe as a non-Python program on 2 ranks", "[distributed]") {
  // scripts/setup-debian.sh installs gloo's headers: the data-parallel path is always built here.
  REQUIRE_THAT(distributed_backends(), Catch::Matchers::StartsWith("gloo"));
  ProbeFixture f;
  const std::string single = f.dir.file("single.h5"), out = f.dir.file("torchrun.h5");
  run_tool("ndsprobe", f.args + " -o " + single);
  std::string log;
  // Debian's torchrun 1.13 on Python 3.11 needs --redirects 1 --tee 1 (pytorch#92319). The
  // torchrun is the one of the LibTorch built against (CURV_TORCHRUN): its agent's store speaks
  // that version's protocol to the ranks.
  const int status = run_command(
      fmt::format("OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo {} --no_python --nproc_per_node 2 "
                  "--redirects 1 --tee 1 --master_addr 127.0.0.1 --master_port {} {} {} -o {}",
                  CURV_TORCHRUN, free_port(), tool_path("ndsprobe"), f.args, out),
      &log);
  INFO(log);
  REQUIRE(status == 0);
  check_files_close(single, out, 1e-12);
  CHECK(H5Reader(out).attribute_int("/", "world_size") == 2);
}
