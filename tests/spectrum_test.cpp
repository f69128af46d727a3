#include "curv/analysis/spectrum.h"

#include <ATen/ATen.h>

#include <Eigen/Eigenvalues>
#include <Eigen/QR>
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>

#include "curv/core/blocks.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/io/checkpoint.h"
#include "curv/models/script_objective.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

// Q diag(values) Qᵀ with a seeded random orthogonal Q: a dense operator whose spectrum is known
// exactly but whose eigenvectors are not the coordinate axes.
DenseOperator rotated(const Eigen::VectorXd& values, unsigned seed) {
  std::srand(seed);
  const Eigen::MatrixXd m = Eigen::MatrixXd::Random(values.size(), values.size());
  const Eigen::MatrixXd q = Eigen::HouseholderQR<Eigen::MatrixXd>(m).householderQ();
  return DenseOperator(q * values.asDiagonal() * q.transpose());
}

// 400 eigenvalues: a bulk in [−2, 3], a negative outlier −6, and a near-degenerate top pair
// 10 and 10 − 1e-3.
Eigen::VectorXd known_spectrum() {
  const int n = 400;
  Eigen::VectorXd v(n);
  for (int i = 0; i < n; ++i) v[i] = -2.0 + 5.0 * i / (n - 1);
  v[0] = -6.0;
  v[1] = -4.5;
  v[n - 1] = 10.0;
  v[n - 2] = 10.0 - 1e-3;
  v[n - 3] = 7.0;
  return v;
}

Eigen::VectorXd sorted(Eigen::VectorXd v) {
  std::sort(v.data(), v.data() + v.size());
  return v;
}

void check_pairs(LinearOperator& op, const EigenResult& r, const Eigen::VectorXd& exact_ascending,
                 double tol) {
  const Eigen::Index n = exact_ascending.size();
  const double scale = exact_ascending.cwiseAbs().maxCoeff();
  INFO(r.brief());
  for (size_t i = 0; i < r.largest.size(); ++i) {
    INFO("largest " << i << ": " << r.largest[i].value << " vs " << exact_ascending[n - 1 - i]);
    CHECK(std::abs(r.largest[i].value - exact_ascending[n - 1 - i]) <= tol * scale);
    CHECK(r.largest[i].residual <= 1e3 * tol * scale);
  }
  for (size_t i = 0; i < r.smallest.size(); ++i) {
    INFO("smallest " << i << ": " << r.smallest[i].value << " vs " << exact_ascending[i]);
    CHECK(std::abs(r.smallest[i].value - exact_ascending[i]) <= tol * scale);
    CHECK(r.smallest[i].residual <= 1e3 * tol * scale);
  }
  // Measured residuals are real: recompute one from the vector.
  if (!r.largest.empty() && r.largest[0].vector.defined()) {
    REQUIRE(r.largest[0].vector.numel() == op.rows());
    const at::Tensor v = r.largest[0].vector / r.largest[0].vector.norm();
    const at::Tensor hv = op.apply(v);
    CHECK((hv - r.largest[0].value * v).norm().item<double>() ==
          Approx(r.largest[0].residual).margin(1e-12 * scale));
  }
}

}  // namespace

TEST_CASE(
    "Lanczos finds both ends of a known spectrum, negative eigenvalues and a near-degenerate "
    "top pair included",
    "[spectrum]") {
  const Eigen::VectorXd values = known_spectrum();
  DenseOperator op = rotated(values, 3);
  EigenOptions options;
  options.top = 3;
  options.bottom = 2;
  options.tol = 1e-10;
  options.max_hvps = 300;
  int64_t hvps_gap = 0, hvps_residual = 0;
  for (auto [method, bound] : {std::pair{EigenMethod::kLanczos, ErrorBound::kGap},
                               std::pair{EigenMethod::kLanczos, ErrorBound::kResidual},
                               std::pair{EigenMethod::kSpectra, ErrorBound::kResidual}}) {
    options.method = method;
    options.bound = bound;
    EigenResult r = extreme_eigenpairs(op, options);
    if (method == EigenMethod::kLanczos)
      (bound == ErrorBound::kGap ? hvps_gap : hvps_residual) = r.hvps;
    INFO(r.brief() << " " << r.message);
    CHECK(r.converged());
    REQUIRE(r.largest.size() == 3);
    REQUIRE(r.smallest.size() == 2);
    CHECK(r.residuals_measured);
    CHECK(r.residual_hvps == 5);
    // Stopped well before the Krylov space filled the whole space.
    CHECK(r.hvps < 300);
    check_pairs(op, r, sorted(values), 1e-9);
    CHECK(r.largest[0].value - r.largest[1].value == Approx(1e-3).epsilon(1e-5));
    // Ritz vectors of different eigenvalues are orthogonal.
    CHECK(std::abs(at::dot(r.largest[0].vector, r.largest[1].vector).item<double>()) < 1e-6);
  }
  // The gap bound stops earlier and, as checked above, still meets the tolerance.
  INFO("Lanczos HVPs: gap bound " << hvps_gap << ", residual bound " << hvps_residual);
  CHECK(hvps_gap < hvps_residual);
}

TEST_CASE("power iteration returns the largest |λ|, here the negative end", "[spectrum]") {
  Eigen::VectorXd values = Eigen::VectorXd::LinSpaced(50, -1.0, 2.0);
  values[0] = -5.0;
  DenseOperator op = rotated(values, 5);
  EigenOptions options;
  options.method = EigenMethod::kPower;
  options.tol = 1e-10;
  options.max_hvps = 2000;
  EigenResult r = extreme_eigenpairs(op, options);
  INFO(r.brief());
  REQUIRE(r.dominant.size() == 1);
  CHECK(r.largest.empty());
  CHECK(r.dominant[0].value == Approx(-5.0).epsilon(1e-8));
  CHECK(r.dominant[0].residual < 1e-3);
  options.bottom = 1;
  CURV_CHECK_THROWS(extreme_eigenpairs(op, options), InvalidArgument,
                    Catch::Matchers::Contains("bottom = 1"));
}

TEST_CASE("Lanczos eigenvalues of tiny float64 models equal dense eigvalsh, globally and per block",
          "[spectrum]") {
  for (bool gpt : {false, true}) {
    auto model = make_model(gpt ? tiny_gpt_config() : tiny_mlp_config(), ModelInit{2, at::kDouble});
    CurvatureEngine engine(*model, gpt ? gpt_probe(3, 16, 8) : mlp_probe(3, 20, 7));
    const Eigen::MatrixXd h = dense_hessian(engine);
    const Eigen::VectorXd exact = Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(h).eigenvalues();
    HessianOperator op(engine);
    EigenOptions options;
    options.top = 3;
    options.bottom = 3;
    options.tol = 1e-12;
    options.max_hvps = 1000;
    engine.reset_counters();
    EigenResult r = extreme_eigenpairs(op, options);
    INFO((gpt ? "gpt " : "mlp ") << r.brief());
    CHECK(r.converged());
    CHECK(engine.counters().hvps == r.hvps + r.residual_hvps);
    check_pairs(op, r, exact, 1e-8);
    CHECK(exact[0] < 0);  // the test covers an indefinite Hessian

    const BlockPartition blocks = BlockPartition::by_rule(engine.space(), BlockRule::kTensor);
    for (const Block& block : blocks.blocks()) {
      HessianOperator sub(engine, block.params);
      if (sub.rows() < 2) continue;
      std::vector<int64_t> index;
      for (size_t p : block.params)
        for (int64_t k = 0; k < engine.space()[p].numel; ++k)
          index.push_back(engine.space()[p].offset + k);
      Eigen::MatrixXd hb(index.size(), index.size());
      for (size_t a = 0; a < index.size(); ++a)
        for (size_t b = 0; b < index.size(); ++b) hb(a, b) = h(index[a], index[b]);
      const Eigen::VectorXd eb = Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(hb).eigenvalues();
      EigenOptions bo = options;
      bo.top = 1;
      bo.bottom = 1;
      EigenResult rb = extreme_eigenpairs(sub, bo);
      INFO("block " << block.name);
      check_pairs(sub, rb, eb, 1e-8);
    }
  }
}

TEST_CASE("trace estimators land within 3 standard errors of a known trace across seeds",
          "[spectrum]") {
  Eigen::VectorXd values = Eigen::VectorXd::LinSpaced(300, -1.0, 3.0);
  DenseOperator op = rotated(values, 7);
  const double exact = values.sum();
  for (TraceMethod method : {TraceMethod::kHutchinson, TraceMethod::kHutchPlusPlus}) {
    for (uint64_t seed = 1; seed <= 8; ++seed) {
      TraceOptions options;
      options.method = method;
      options.matvecs = 60;
      options.seed = seed;
      TraceResult r = estimate_trace(op, options);
      INFO(r.brief() << " exact " << exact << " seed " << seed);
      CHECK(r.matvecs == 60);
      CHECK(r.standard_error > 0);
      CHECK(std::abs(r.estimate - exact) <= 3 * r.standard_error);
    }
  }
}

TEST_CASE("Hutch++ beats Hutchinson at equal matvecs on a low-rank-plus-noise operator",
          "[spectrum]") {
  Eigen::VectorXd values = Eigen::VectorXd::Constant(300, 0.01);
  for (int i = 0; i < 10; ++i) values[i] = 100.0 / (i + 1);
  DenseOperator op = rotated(values, 11);
  const double exact = values.sum();
  double err_hutchinson = 0, err_hutchpp = 0, se_hutchinson = 0, se_hutchpp = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    TraceOptions options;
    options.matvecs = 45;
    options.seed = seed;
    options.method = TraceMethod::kHutchinson;
    TraceResult a = estimate_trace(op, options);
    options.method = TraceMethod::kHutchPlusPlus;
    TraceResult b = estimate_trace(op, options);
    err_hutchinson += std::abs(a.estimate - exact) / 10;
    err_hutchpp += std::abs(b.estimate - exact) / 10;
    se_hutchinson += a.standard_error / 10;
    se_hutchpp += b.standard_error / 10;
  }
  INFO("mean |error| Hutchinson " << err_hutchinson << " Hutch++ " << err_hutchpp);
  CHECK(err_hutchpp < 0.1 * err_hutchinson);
  CHECK(se_hutchpp < 0.1 * se_hutchinson);
}

namespace {

// The scalar SplitMix64 sequence, written out here as the reference for the vectors that the
// solvers generate on the operator's device.
uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

TEST_CASE("random probes follow the scalar SplitMix64 sequence: Rademacher and Gaussian",
          "[spectrum]") {
  const Eigen::VectorXd values = (Eigen::VectorXd(7) << 3, -1, 0.5, 2, 7, -4, 1).finished();
  DenseOperator op = rotated(values, 17);
  const Eigen::MatrixXd& a = op.matrix();
  const uint64_t seed = 0xfeedbeefcafe1234ULL;
  // Hutchinson with two samples: the mean of zᵀAz over the first two Rademacher vectors.
  uint64_t state = seed;
  double sum = 0.0;
  for (int sample = 0; sample < 2; ++sample) {
    Eigen::VectorXd z(7);
    for (int i = 0; i < 7; ++i) z[i] = (splitmix(state) >> 63) ? 1.0 : -1.0;
    sum += z.dot(a * z);
  }
  TraceOptions trace;
  trace.method = TraceMethod::kHutchinson;
  trace.matvecs = 2;
  trace.seed = seed;
  CHECK(estimate_trace(op, trace).estimate == Approx(sum / 2).epsilon(1e-14));
  // Power iteration's first Rayleigh quotient is gᵀAg / gᵀg for the seed's Box–Muller vector.
  state = seed;
  Eigen::VectorXd g(7);
  for (int i = 0; i < 7; ++i) {
    auto uniform = [&] { return (static_cast<double>(splitmix(state) >> 11) + 0.5) * 0x1.0p-53; };
    const double radius = std::sqrt(-2.0 * std::log(uniform()));
    g[i] = radius * std::cos(2.0 * M_PI * uniform());
  }
  EigenOptions power;
  power.method = EigenMethod::kPower;
  power.max_hvps = 2;
  power.seed = seed;
  power.check_residuals = false;
  const EigenResult r = extreme_eigenpairs(op, power);
  REQUIRE(!r.largest_history.empty());
  CHECK(r.largest_history[0] == Approx(g.dot(a * g) / g.squaredNorm()).epsilon(1e-13));
}

TEST_CASE("a Lanczos basis kept on the host gives the same numbers as one on the device",
          "[spectrum]") {
  const Eigen::VectorXd values =
      (Eigen::VectorXd(9) << 5, 4.5, -2, 1, 0.3, 0.2, -0.1, 3, 2).finished();
  DenseOperator op = rotated(values, 19);
  EigenOptions eig;
  eig.top = 2;
  eig.bottom = 1;
  const EigenResult device = extreme_eigenpairs(op, eig);
  eig.basis = KrylovBasis::kHost;
  const EigenResult host = extreme_eigenpairs(op, eig);
  CHECK(host.hvps == device.hvps);
  CHECK(host.largest[0].value == device.largest[0].value);
  CHECK(host.smallest[0].value == device.smallest[0].value);
  DensityOptions density;
  density.runs = 2;
  density.steps = 5;
  const DensityResult d_device = spectral_density(op, density);
  density.basis = KrylovBasis::kHost;
  CHECK(spectral_density(op, density).nodes == d_device.nodes);
  CHECK(parse_krylov_basis("host") == KrylovBasis::kHost);
  CHECK(parse_krylov_basis("none") == KrylovBasis::kNone);
  CHECK_THROWS_WITH(parse_krylov_basis("disk"), Catch::Matchers::Contains("device, host or none"));
}

TEST_CASE("Lanczos without a basis finds the extreme eigenpairs of a known spectrum",
          "[spectrum]") {
  // 600 eigenvalues: a bulk in [−1, 2], the top 8 and 7.5, the bottom −1.05 just below the bulk:
  // 8 converges long before −1.05 does, and the plain recurrence loses orthogonality meanwhile.
  Eigen::VectorXd values = Eigen::VectorXd::LinSpaced(600, -1.0, 2.0);
  values[0] = -1.05;
  values[598] = 7.5;
  values[599] = 8.0;
  DenseOperator op = rotated(values, 5);
  EigenOptions eig;
  eig.top = 1;
  eig.bottom = 1;
  eig.tol = 1e-10;
  eig.bound = ErrorBound::kResidual;
  eig.max_hvps = 400;
  eig.basis = KrylovBasis::kNone;
  const EigenResult none = extreme_eigenpairs(op, eig);
  INFO(none.brief());
  REQUIRE(none.converged());
  CHECK(none.iterations > 60);
  CHECK(none.largest[0].value == Approx(8.0).epsilon(1e-10));
  CHECK(none.smallest[0].value == Approx(-1.05).epsilon(1e-10));
  INFO("the Ritz vectors come from the recurrence run again: measured residuals are small");
  CHECK(none.residuals_measured);
  CHECK(none.largest[0].residual < 1e-6);
  CHECK(none.smallest[0].residual < 1e-6);
  CHECK(none.hvps == 2 * none.iterations - 1);
  const at::Tensor v = none.largest[0].vector;
  REQUIRE(v.defined());
  const at::Tensor hv = op.apply(v / v.norm());
  CHECK(hv.dot(v / v.norm()).item<double>() == Approx(8.0).epsilon(1e-9));
  INFO("with a basis, the same values");
  eig.basis = KrylovBasis::kDevice;
  const EigenResult kept = extreme_eigenpairs(op, eig);
  CHECK(kept.largest[0].value == Approx(none.largest[0].value).epsilon(1e-11));
  CHECK(kept.smallest[0].value == Approx(none.smallest[0].value).epsilon(1e-11));
  INFO("more than one eigenvalue per end needs a basis");
  eig.basis = KrylovBasis::kNone;
  eig.top = 2;
  CHECK_THROWS_WITH(extreme_eigenpairs(op, eig), Catch::Matchers::Contains("one per end"));
  INFO("a density's moments need no basis: the low ones equal those with a basis");
  DensityOptions density;
  density.runs = 2;
  density.steps = 80;
  const DensityResult with_basis = spectral_density(op, density);
  density.basis = KrylovBasis::kNone;
  const DensityResult d = spectral_density(op, density);
  CHECK(d.hvps == with_basis.hvps);
  for (int k = 0; k <= 4; ++k) {
    CHECK(d.moment(k) == Approx(with_basis.moment(k)).epsilon(1e-10));
  }
  TraceOptions trace;
  trace.method = TraceMethod::kHutchPlusPlus;
  trace.basis = KrylovBasis::kNone;
  CHECK_THROWS_WITH(estimate_trace(op, trace), Catch::Matchers::Contains("Hutch++"));
}

TEST_CASE("an operator refuses a vector of another length, dtype or device", "[spectrum]") {
  DenseOperator op(Eigen::MatrixXd::Identity(3, 3));
  CHECK(op.apply(at::ones({3}, at::kDouble)).sum().item<double>() == 3.0);
  CHECK_THROWS_WITH(op.apply(at::ones({4}, at::kDouble)), Catch::Matchers::Contains("3 entries"));
  CHECK_THROWS_WITH(op.apply(at::ones({3}, at::kFloat)), Catch::Matchers::Contains("Float"));
  CHECK(op.num_applies() == 1);
}

TEST_CASE("SLQ recovers the moments of a known spectrum", "[spectrum]") {
  Eigen::VectorXd values = Eigen::VectorXd::LinSpaced(500, -1.0, 4.0);
  values[499] = 9.0;
  const double n = values.size();
  DensityOptions options;
  options.runs = 10;
  options.steps = 30;
  options.seed = 5;
  SECTION("diagonal: Rademacher quadratic forms and Gauss quadrature are both exact") {
    DenseOperator op(Eigen::MatrixXd(values.asDiagonal()));
    DensityResult r = spectral_density(op, options);
    for (int k = 1; k <= 3; ++k) {
      const double exact = values.array().pow(k).sum() / n;
      INFO("k = " << k);
      CHECK(r.moment(k) == Approx(exact).epsilon(1e-9));
    }
    CHECK(r.trace == Approx(values.sum()).epsilon(1e-9));
  }
  SECTION("rotated: within 4 standard errors of the Rademacher estimate") {
    DenseOperator op = rotated(values, 13);
    DensityResult r = spectral_density(op, options);
    INFO(r.brief());
    CHECK(r.hvps == options.runs * options.steps);
    for (int k = 1; k <= 3; ++k) {
      const Eigen::ArrayXd f = values.array().pow(k);
      const double exact = f.sum() / n;
      // Var(zᵀAz)/n² ≤ 2‖f(A)‖_F²/n² for Rademacher z; averaged over the runs.
      const double se = std::sqrt(2.0 * f.square().sum()) / n / std::sqrt(double(options.runs));
      INFO("k = " << k << ": " << r.moment(k) << " vs " << exact << " (SE bound " << se << ")");
      CHECK(std::abs(r.moment(k) - exact) <= 4 * se);
    }
    CHECK(std::abs(r.trace - values.sum()) <= 3 * r.trace_standard_error);
    // The smoothed density is a probability density.
    double integral = 0;
    for (size_t i = 1; i < r.grid.size(); ++i)
      integral += 0.5 * (r.density[i] + r.density[i - 1]) * (r.grid[i] - r.grid[i - 1]);
    CHECK(integral == Approx(1.0).epsilon(1e-3));
    for (int64_t run = 0; run < r.runs; ++run) {
      double total = 0;
      for (int64_t j = 0; j < r.steps; ++j) total += r.weights[run * r.steps + j];
      CHECK(total == Approx(1.0).epsilon(1e-12));
    }
    CHECK(r.sigma > 0);
  }
}

TEST_CASE("option validation names the field and the value", "[spectrum]") {
  EigenOptions e;
  e.tol = 2;
  CURV_CHECK_THROWS(e.validate(), InvalidArgument, Catch::Matchers::Contains("tol = 2"));
  TraceOptions t;
  t.matvecs = 4;
  CURV_CHECK_THROWS(t.validate(), InvalidArgument, Catch::Matchers::Contains("matvecs = 4"));
  DensityOptions d;
  d.steps = 0;
  CURV_CHECK_THROWS(d.validate(), InvalidArgument, Catch::Matchers::Contains("steps = 0"));
  CURV_CHECK_THROWS(parse_eigen_method("arnoldi"), InvalidArgument,
                    Catch::Matchers::Contains("arnoldi"));
  CURV_CHECK_THROWS(parse_trace_method("xtrace"), InvalidArgument,
                    Catch::Matchers::Contains("xtrace"));
  CURV_CHECK_THROWS(parse_error_bound("kahan"), InvalidArgument,
                    Catch::Matchers::Contains("kahan"));
}

TEST_CASE("Adam preconditioner from checkpoint state, and the preconditioned sharpness",
          "[spectrum]") {
  QuadraticObjective quad(3);
  const ParamSpace& space = quad.space();
  Checkpoint ckpt;
  ckpt.step = 20;
  ckpt.path = "ckpt/step_20";
  ckpt.meta = parse_checkpoint_meta(R"({"step": 20, "optimizer": {"name": "adamw", "step_count": 20,
                       "hyper": {"lr": 0.01, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6}}})",
                                    "meta.json");
  std::vector<at::Tensor> v;
  for (size_t i = 0; i < space.size(); ++i) {
    v.push_back(at::rand(space[i].shape, at::kDouble) + 0.1);
    ckpt.optimizer.emplace_back(space[i].name + ".exp_avg_sq", v.back());
  }
  AdamPreconditioner p;
  REQUIRE(adam_preconditioner(saved_optimizer(ckpt), space, &p) == "");
  CHECK(p.step_count == 20);
  CHECK(p.edge_of_stability() == Approx((2 + 2 * 0.8) / (0.2 * 0.01)));
  const double bias2 = 1 - std::pow(0.99, 20);
  Eigen::VectorXd expected(space.numel());
  for (size_t i = 0; i < space.size(); ++i) {
    auto flat = v[i].reshape(-1);
    for (int64_t k = 0; k < space[i].numel; ++k) {
      expected[space[i].offset + k] =
          1 / std::sqrt(std::sqrt(flat[k].item<double>() / bias2) + 1e-6);
    }
  }
  CHECK((p.inverse_sqrt - expected).norm() <= 1e-14 * expected.norm());

  // λ_max(P^-1/2 H P^-1/2) on the quadratic equals the dense answer.
  CurvatureEngine engine(quad, dummy_probe(4, 4));
  HessianOperator h(engine);
  ScaledOperator scaled(h, p.inverse_sqrt);
  EigenOptions options;
  options.tol = 1e-12;
  EigenResult r = extreme_eigenpairs(scaled, options);
  Eigen::MatrixXd a(10, 10);
  const at::Tensor hess = quad.hessian().contiguous();
  for (int i = 0; i < 10; ++i)
    for (int j = 0; j < 10; ++j) a(i, j) = hess[i][j].item<double>();
  const Eigen::MatrixXd pa = p.inverse_sqrt.asDiagonal() * a * p.inverse_sqrt.asDiagonal();
  const double exact = Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(pa).eigenvalues().maxCoeff();
  CHECK(r.largest.at(0).value == Approx(exact).epsilon(1e-10));

  // Missing state and other optimizers are reasons, not errors.
  Checkpoint partial = ckpt;
  partial.optimizer.pop_back();
  CHECK_THAT(adam_preconditioner(saved_optimizer(partial), space, &p),
             Catch::Matchers::Contains("'b'"));
  Checkpoint sgd = ckpt;
  sgd.meta = parse_checkpoint_meta(
      R"({"step": 20, "optimizer": {"name": "sgd", "step_count": 20}})", "meta.json");
  CHECK_THAT(adam_preconditioner(saved_optimizer(sgd), space, &p),
             Catch::Matchers::Contains("sgd"));
}

TEST_CASE("overlap of a direction with an eigenspace and with the gradient", "[spectrum]") {
  QuadraticObjective quad(4);
  const ParamSpace& space = quad.space();
  ParamVector u = {at::zeros({2, 3}, at::kDouble), at::zeros({4}, at::kDouble)};
  u[0][0][0] = 3.0;
  u[1][1] = 4.0;  // ‖u‖² = 25
  ParamVector g = {at::zeros({2, 3}, at::kDouble), at::zeros({4}, at::kDouble)};
  g[0][0][0] = -1.0;
  at::Tensor e0 = at::zeros({space.numel()}, at::kDouble), e1 = e0.clone();
  e0[0] = 1.0;  // along u's first component
  e1[7] = 1.0;  // along b[1]
  Overlap o = direction_overlap(u, {e0}, g);
  CHECK(o.eigenspace_share == Approx(9.0 / 25));
  CHECK(o.gradient_cosine == Approx(-3.0 / 5));
  o = direction_overlap(u, {e0, e1}, g);
  CHECK(o.eigenspace_share == Approx(1.0));
  CHECK(o.per_vector.at(1) == Approx(16.0 / 25));
  o = direction_overlap(zeros_like(u), {e0}, g);
  CHECK(std::isnan(o.eigenspace_share));
}

TEST_CASE("the top eigenvalue agrees with a Python power iteration on the same TorchScript model",
          "[spectrum][script]") {
  TempDir dir;
  run_python("make_script_fixture.py", {dir.path(), "float64"});
  run_python("power_iteration_reference.py", {dir.path()});
  double python_value = 0;
  std::ifstream(dir.file("power_iteration.txt")) >> python_value;
  REQUIRE(python_value != 0);

  auto model = load_script_objective(dir.file("model_loss.pt"));
  ProbeSet probe = load_script_fixture_probe(dir.path());
  CurvatureEngine engine(*model, probe);
  HessianOperator op(engine);
  EigenOptions options;
  options.top = 1;
  options.bottom = 1;
  options.tol = 1e-12;
  options.max_hvps = 500;
  EigenResult r = extreme_eigenpairs(op, options);
  INFO(r.brief() << "; Python power iteration " << python_value);
  // Power iteration converges to the eigenvalue of largest magnitude, either end.
  const double ours = std::abs(r.largest[0].value) >= std::abs(r.smallest[0].value)
                          ? r.largest[0].value
                          : r.smallest[0].value;
  CHECK(ours == Approx(python_value).epsilon(1e-8));
  options.method = EigenMethod::kPower;
  options.bottom = 0;
  options.max_hvps = 5000;
  EigenResult power = extreme_eigenpairs(op, options);
  CHECK(power.dominant.at(0).value == Approx(python_value).epsilon(1e-6));
}

namespace {

// A diagonal operator of many rows that adds its product in place: what a solver holds shows in
// the process's resident memory, each vector being an allocation of its own pages.
class Diagonal : public LinearOperator {
 public:
  explicit Diagonal(at::Tensor d) : d_(std::move(d)) {}
  int64_t rows() const override { return d_.size(0); }

 protected:
  at::Tensor product(const at::Tensor& x) override { return x * d_; }
  void product_add(const at::Tensor& x, const at::Tensor& y) override { y.addcmul_(x, d_); }

 private:
  at::Tensor d_;
};

// A line of /proc/self/status in bytes (VmRSS: resident now, VmHWM: its peak).
int64_t status_bytes(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string word;
  while (status >> word) {
    if (word == key + ":") {
      int64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
  }
  return -1;
}

// The peak resident memory a call adds over what was resident before it, in vectors of `bytes`.
template <class F>
double resident_peak_in_vectors(int64_t bytes, F call) {
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to VmRSS
  const int64_t before = status_bytes("VmRSS");
  call();
  return static_cast<double>(status_bytes("VmHWM") - before) / static_cast<double>(bytes);
}

}  // namespace

TEST_CASE("Lanczos without a basis holds two vectors, three while it forms a Ritz vector",
          "[spectrum]") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  WARN("not measured: a sanitizer's allocator keeps freed memory resident");
#else
  // 256 MiB per vector: the start vector's generator scratch (a few chunks of 2^22 entries) is a
  // fraction of one.
  const int64_t n = int64_t{1} << 25;
  Diagonal op(at::linspace(-1.0, 2.0, n, at::kDouble));
  EigenOptions eig;
  eig.top = 1;
  eig.bottom = 0;
  eig.basis = KrylovBasis::kNone;
  eig.max_hvps = 4;
  eig.check_residuals = false;
  eig.keep_vectors = false;
  EigenResult r;
  const double run = resident_peak_in_vectors(n * 8, [&] { r = extreme_eigenpairs(op, eig); });
  INFO("resident peak over the operator: " << run << " vectors");
  CHECK(r.hvps == 4);
  // q_j and q_{j−1}, the product added into q_{j−1}'s memory (the start vector was the first q).
  CHECK(run < 2.6);
  eig.check_residuals = true;
  const double ritz = resident_peak_in_vectors(n * 8, [&] { r = extreme_eigenpairs(op, eig); });
  INFO("with the Ritz vector: " << ritz << " vectors");
  CHECK(r.residuals_measured);
  CHECK(ritz < 3.6);
#endif
}
