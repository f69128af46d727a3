#include "curv/optim/optimizers.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>

#include "curv/analysis/direction_registry.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/io/checkpoint.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

// A source that remembers the tensors it filled, to tell how many of them a reader still holds
// when it asks for the next.
class WatchedSource : public TensorSource {
 public:
  explicit WatchedSource(SharedTensorSource base) : base_(std::move(base)) {}
  const std::vector<TensorEntry>& entries() const override { return base_->entries(); }
  std::string origin() const override { return base_->origin(); }
  void read_into(const std::string& name, const std::vector<int64_t>& offsets,
                 at::Tensor dest) const override {
    size_t alive = 0;
    for (const auto& w : filled_) alive += w.expired() ? 0 : 1;
    most_alive = std::max(most_alive, alive);
    base_->read_into(name, offsets, dest);
    filled_.emplace_back(dest.getIntrusivePtr());
  }
  size_t reads() const { return filled_.size(); }
  mutable size_t most_alive = 0;  // the most filled tensors alive when a read began

 private:
  SharedTensorSource base_;
  mutable std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> filled_;
};

ParamVector as_list(const c10::IValue& v) {
  ParamVector out;
  for (const auto& t : v.toList()) out.push_back(t.get().toTensor());
  return out;
}

}  // namespace

TEST_CASE("AdamW, Adam and SGD match torch.optim over 20 steps", "[optimizers]") {
  for (std::string dtype : {"float32", "float64"}) {
    TempDir dir;
    run_python("torch_optim_reference.py", {dir.file("ref.pt"), dtype});
    auto ref = load_pickled_dict(dir.file("ref.pt"));
    const ParamVector theta0 = as_list(ref.at("theta0"));
    std::vector<ParamVector> grads;
    for (const auto& g : ref.at("grads").toList()) grads.push_back(as_list(g.get()));
    ParamSpace space({"w", "b"}, theta0);
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"adamw", "adamw:lr=1e-2,beta1=0.9,beta2=0.999,eps=1e-8,weight_decay=0.1"},
        {"adam", "adam:lr=1e-2,beta1=0.9,beta2=0.999,eps=1e-8,weight_decay=0.1"},
        {"sgd_nesterov", "sgd:lr=0.05,momentum=0.9,nesterov=1,weight_decay=0.01"},
        {"sgd_dampened", "sgd:lr=0.05,momentum=0.8,dampening=0.3"}};
    const double tol = dtype == "float64" ? 1e-12 : 1e-6;
    for (const auto& [name, spec] : cases) {
      auto optimizer = make_optimizer(OptimizerConfig::parse(spec), space);
      ParamVector theta = clone(theta0);
      for (const auto& g : grads) axpy(1.0, optimizer->step(theta, g), theta);
      const double err = relative_error(theta, as_list(ref.at(name)));
      INFO(dtype << " " << name << ": relative error " << err);
      CHECK(err <= tol);
      CHECK(optimizer->step_count() == 20);
    }
  }
}

TEST_CASE("Newton-Schulz lands singular values in the quintic's band; polar is U Vᵀ",
          "[optimizers]") {
  at::manual_seed(0);
  for (auto shape : {std::vector<int64_t>{64, 32}, {32, 64}, {48, 48}, {8, 4, 3, 3}}) {
    auto g = at::randn(shape, at::kDouble);
    auto o = newton_schulz(g, 5);
    CHECK(o.sizes().equals(g.sizes()));
    auto s = at::linalg_svdvals(o.reshape({shape[0], -1}));
    INFO("shape " << shape[0] << "x..., singular values in [" << s.min().item<double>() << ", "
                  << s.max().item<double>() << "]");
    CHECK(s.min().item<double>() >= 0.5);
    CHECK(s.max().item<double>() <= 1.5);
    auto p = polar_factor(g);
    auto m = g.reshape({shape[0], -1});
    auto svd = at::linalg_svd(m, false);
    CHECK(at::allclose(p.reshape({shape[0], -1}), at::mm(std::get<0>(svd), std::get<2>(svd)), 1e-12,
                       1e-12));
    // Polar factor has unit singular values.
    CHECK(at::allclose(at::linalg_svdvals(p.reshape({shape[0], -1})),
                       at::ones({std::min(m.size(0), m.size(1))}, at::kDouble), 1e-10, 1e-10));
  }
}

TEST_CASE("Muon's scale rules give the stated RMS on an exact polar update", "[optimizers]") {
  at::manual_seed(1);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{64, 16}, {16, 64}}) {
    ParamVector theta = {at::zeros({rows, cols}, at::kDouble)};
    ParamSpace space({"layers.0.weight"}, theta);
    ParamVector grad = {at::randn({rows, cols}, at::kDouble)};
    for (bool rms : {false, true}) {
      auto config = OptimizerConfig::parse("muon:lr=1,exact_polar=1,nesterov=0");
      config.rms_scale = rms;
      auto u = make_optimizer(config, space)->step(theta, grad)[0];
      const double got = u.square().mean().sqrt().item<double>();
      // U Vᵀ has RMS 1/sqrt(max(rows, cols)).
      const double expected = rms ? 0.2
                                  : std::sqrt(std::max(1.0, double(rows) / cols)) /
                                        std::sqrt(double(std::max(rows, cols)));
      INFO(rows << "x" << cols << (rms ? " rms" : " shape") << " rule: RMS " << got);
      CHECK(got == Approx(expected).epsilon(1e-10));
    }
  }
}

TEST_CASE("NorMuon's first step has equal row RMS and Muon's Frobenius norm", "[optimizers]") {
  at::manual_seed(2);
  ParamVector theta = {at::zeros({12, 20}, at::kDouble)};
  ParamSpace space({"layers.0.weight"}, theta);
  // Rows of very different scales: orthogonalisation alone does not equalise them.
  ParamVector grad = {at::randn({12, 20}, at::kDouble) *
                      at::linspace(0.1, 3, 12, at::kDouble).unsqueeze(1)};
  auto normuon = make_optimizer(OptimizerConfig::parse("normuon:lr=1,nesterov=0"), space);
  auto muon = make_optimizer(OptimizerConfig::parse("muon:lr=1,nesterov=0"), space);
  auto u = normuon->step(theta, grad)[0];
  auto um = muon->step(theta, grad)[0];
  auto row_rms = u.square().mean(-1).sqrt();
  // Equal up to the 1e-10 that guards the division by √v.
  CHECK((row_rms.max() - row_rms.min()).item<double>() <= 1e-8 * row_rms.max().item<double>());
  CHECK(u.norm().item<double>() == Approx(um.norm().item<double>()).epsilon(1e-10));
  CHECK(normuon->state().size() == 2);
  CHECK(normuon->state()[1].second.sizes().equals({12, 1}));
}

TEST_CASE("rebuilt optimizer directions equal the saved checkpoint deltas", "[optimizers]") {
  const std::vector<std::string> specs = {
      "adamw:lr=0.05",
      "muon:lr=0.1,adam_lr=0.05",
      "muon:lr=0.1,sum_momentum=1,rms_scale=1,nesterov=0,weight_decay=0.1",
      "normuon:lr=0.1",
      "sgd:lr=1,momentum=0.9,nesterov=1",
      "signsgd:lr=0.05",
      "signum:lr=0.05",
      "lion:lr=0.05,weight_decay=0.1"};
  for (const auto& spec : specs) {
    TempDir dir;
    auto cfg = tiny_gpt_config();
    auto model = make_model(cfg, ModelInit{3, at::kFloat});
    ProbeSet batch = gpt_probe(9, 8, 8);
    auto optimizer = make_optimizer(OptimizerConfig::parse(spec), model->space());
    for (int step = 0; step <= 3; ++step) {
      ParamVector theta = snapshot_parameters(*model);
      save_checkpoint(dir.path(), step, model->space(), theta, optimizer->state(),
                      R"({"optimizer": )" + optimizer->meta_json() + "}");
      CurvatureEngine engine(*model, batch);
      ParamVector u = optimizer->step(theta, engine.gradient());
      axpy(1.0, u, theta);
      load_parameters(*model, theta);
    }
    auto listing = list_checkpoints(dir.path());
    const std::string family = spec.substr(0, spec.find(':'));
    auto direction = make_direction(family);
    for (size_t k = 1; k + 1 < listing.size(); ++k) {
      Checkpoint ckpt = load_checkpoint(listing[k]);
      Checkpoint next = load_checkpoint(listing[k + 1]);
      const SavedOptimizer saved = saved_optimizer(ckpt);
      DirectionContext c;
      c.saved = &saved;
      c.step = ckpt.step;
      c.theta = parameters_from(ckpt, model->space(), model->parameters());
      c.theta_next = parameters_from(next, model->space(), model->parameters());
      load_parameters(*model, c.theta);
      CurvatureEngine engine(*model, batch);
      c.engine = &engine;
      ParamVector u = direction->compute(c);
      const double err = relative_error(u, sub(c.theta_next, c.theta));
      INFO(spec << " at step " << ckpt.step << ": relative error " << err << " (" << c.note << ")");
      CHECK(err <= 1e-6);
    }
  }
}

TEST_CASE(
    "a step from streamed saved state equals the step from loaded state, holding one "
    "parameter's state at a time",
    "[optimizers]") {
  at::manual_seed(4);
  const ParamVector theta = {at::randn({6, 5}, at::kDouble), at::randn({5}, at::kDouble),
                             at::randn({4, 6}, at::kDouble)};
  ParamSpace space({"a.weight", "a.bias", "b.weight"}, theta);
  auto gradient = [&] {
    ParamVector g;
    for (const auto& t : theta) g.push_back(at::randn_like(t));
    return g;
  };
  for (const std::string spec :
       {"adamw:weight_decay=0.1", "adam:weight_decay=0.1", "sgd:momentum=0.9,nesterov=1", "muon",
        "normuon", "lion", "signum", "nadam:weight_decay=0.1", "radam",
        "adafactor:weight_decay=0.1", "ademamix:t_alpha_beta3=10", "soap:precondition_frequency=2",
        "shampoo:momentum=0.9,precondition_frequency=2",
        "adamw-schedulefree:warmup_steps=2,weight_decay=0.1", "adamuon:weight_decay=0.1",
        "mars:weight_decay=0.1,optimize_1d=1"}) {
    INFO(spec);
    // Three steps give every slot a value; the fourth is taken both ways from the saved state.
    auto trained = make_optimizer(OptimizerConfig::parse(spec), space);
    for (int k = 0; k < 3; ++k) trained->step(theta, gradient());
    const NamedTensors state = trained->state();
    const ParamVector g = gradient();
    auto loaded = make_optimizer(OptimizerConfig::parse(spec), space);
    loaded->load_state(state, 3, "state.safetensors");
    const ParamVector want = loaded->step(theta, g);
    WatchedSource watched(memory_tensor_source(state, "state.safetensors"));
    auto streamed = make_optimizer(OptimizerConfig::parse(spec), space);
    const ParamVector got = streamed->step_from_saved(theta, g, watched, 3, "state.safetensors");
    for (size_t i = 0; i < theta.size(); ++i) CHECK(at::equal(got[i], want[i]));
    CHECK(streamed->step_count() == 4);
    CHECK(streamed->state().empty());
    CHECK(watched.reads() == state.size());
    // Only the parameter's own earlier slots are alive when the next slot is read.
    size_t most_slots = 0;
    for (size_t i = 0; i < space.size(); ++i) {
      const std::string prefix = space[i].name + ".";
      most_slots = std::max<size_t>(
          most_slots, std::count_if(state.begin(), state.end(), [&](const auto& entry) {
            return entry.first.rfind(prefix, 0) == 0;
          }));
    }
    CHECK(watched.most_alive < most_slots);
  }
  // The watch itself: reading the state whole holds every tensor read before.
  WatchedSource watched(memory_tensor_source(
      {{"a.exp_avg", at::zeros({2})}, {"b.exp_avg", at::zeros({2})}, {"c.exp_avg", at::zeros({2})}},
      "state.safetensors"));
  const auto whole = read_all(watched);
  CHECK(watched.most_alive == 2);
  // A missing slot and a wrong shape, named before anything is read.
  auto adam = make_optimizer(OptimizerConfig::parse("adamw"), space);
  const auto partial = memory_tensor_source({{"a.weight.exp_avg", at::zeros({6, 5})}}, "s.st");
  CURV_CHECK_THROWS(adam->step_from_saved(theta, gradient(), *partial, 3, "s.st"), InvalidArgument,
                    Catch::Matchers::Contains("s.st") &&
                        Catch::Matchers::Contains("'a.weight.exp_avg_sq' is missing"));
  const auto reshaped = memory_tensor_source(
      {{"a.weight.exp_avg", at::zeros({6, 5})}, {"a.weight.exp_avg_sq", at::zeros({30})}}, "s.st");
  CURV_CHECK_THROWS(adam->step_from_saved(theta, gradient(), *reshaped, 3, "s.st"), InvalidArgument,
                    Catch::Matchers::Contains("[30]"));
}

TEST_CASE("optimizer state problems are clear errors; what-if needs no state", "[optimizers]") {
  TempDir dir;
  auto model = make_model(tiny_gpt_config(), ModelInit{3, at::kFloat});
  ProbeSet batch = gpt_probe(9, 4, 4);
  ParamVector theta = snapshot_parameters(*model);
  auto adam = make_optimizer(OptimizerConfig::parse("adamw"), model->space());
  {
    CurvatureEngine engine(*model, batch);
    adam->step(theta, engine.gradient());
  }
  NamedTensors state = adam->state();
  const std::string meta = R"({"optimizer": )" + adam->meta_json() + "}";
  // Saved by AdamW, asked for Muon.
  save_checkpoint(dir.file("a"), 1, model->space(), theta, state, meta);
  // A missing key and a wrong shape.
  NamedTensors missing(state.begin() + 1, state.end());
  save_checkpoint(dir.file("b"), 1, model->space(), theta, missing, meta);
  NamedTensors reshaped = state;
  reshaped[2].second = at::zeros({7});
  save_checkpoint(dir.file("c"), 1, model->space(), theta, reshaped, meta);

  SavedOptimizer saved;
  auto context_for = [&](const std::string& run, Checkpoint& ckpt, CurvatureEngine& engine) {
    ckpt = load_checkpoint(list_checkpoints(run)[0]);
    saved = saved_optimizer(ckpt);
    DirectionContext c;
    c.saved = &saved;
    c.engine = &engine;
    c.theta = theta;
    return c;
  };
  CurvatureEngine engine(*model, batch);
  Checkpoint ckpt;
  auto c = context_for(dir.file("a"), ckpt, engine);
  CURV_CHECK_THROWS(make_direction("muon")->compute(c), InvalidArgument,
                    Catch::Matchers::Contains("'adamw', not 'muon'"));
  c.whatif_fallback = true;
  CHECK(norm(make_direction("muon")->compute(c)) > 0);
  CHECK_THAT(c.note, Catch::Matchers::Contains("what-if"));

  c = context_for(dir.file("b"), ckpt, engine);
  CURV_CHECK_THROWS(make_direction("adamw")->compute(c), InvalidArgument,
                    Catch::Matchers::Contains(state[0].first) &&
                        Catch::Matchers::Contains("optimizer.safetensors"));
  c = context_for(dir.file("c"), ckpt, engine);
  CURV_CHECK_THROWS(make_direction("adamw")->compute(c), InvalidArgument,
                    Catch::Matchers::Contains(state[2].first) && Catch::Matchers::Contains("[7]"));

  // What-if AdamW from fresh state: the first step is −lr·g/(|g| + ε) (bias-corrected), plus decay.
  c = context_for(dir.file("a"), ckpt, engine);
  ParamVector u = make_direction("adamw.whatif:lr=0.01,weight_decay=0")->compute(c);
  const auto& g = engine.gradient();
  for (size_t i = 0; i < u.size(); ++i) {
    auto expected = -0.01 * g[i] / (g[i].abs() + 1e-8);
    CHECK(at::allclose(u[i], expected, 1e-5, 1e-7));
  }
  CURV_CHECK_THROWS(make_direction("adamw:lr=x"), InvalidArgument, Catch::Matchers::Contains("lr"));
  CURV_CHECK_THROWS(make_direction("adamx"), InvalidArgument, Catch::Matchers::Contains("adamw"));
  CURV_CHECK_THROWS(make_direction("adamw:match=1"), InvalidArgument,
                    Catch::Matchers::Contains("whatif"));
  CURV_CHECK_THROWS(OptimizerConfig::parse("sgd:nesterov=1"), InvalidArgument,
                    Catch::Matchers::Contains("momentum"));
}

TEST_CASE("the optimizer table: keys each optimizer reads, defaults that round-trip",
          "[optimizers]") {
  CURV_CHECK_THROWS(OptimizerConfig::parse("adamw:momentum=0.9"), InvalidArgument,
                    Catch::Matchers::Contains("momentum") && Catch::Matchers::Contains("adamw") &&
                        Catch::Matchers::Contains("lr, weight_decay, beta1, beta2, eps"));
  CURV_CHECK_THROWS(OptimizerConfig::parse("signsgd:beta1=0.5"), InvalidArgument,
                    Catch::Matchers::Contains("beta1") && Catch::Matchers::Contains("signsgd"));
  CURV_CHECK_THROWS(OptimizerConfig::parse("sgd:muon_params=x"), InvalidArgument,
                    Catch::Matchers::Contains("muon_params") && Catch::Matchers::Contains("sgd"));
  CURV_CHECK_THROWS(OptimizerConfig::parse("adamw:lrr=1"), InvalidArgument,
                    Catch::Matchers::Contains("lrr") && Catch::Matchers::Contains("'lr'"));
  CURV_CHECK_THROWS(make_direction("adamw.whatif:momentum=0.9"), InvalidArgument,
                    Catch::Matchers::Contains("momentum"));
  CURV_CHECK_THROWS(
      OptimizerConfig::defaults("adamx"), InvalidArgument,
      Catch::Matchers::Contains("adamw, adam, muon, normuon, sgd, signsgd, signum, lion"));
  // The Muon family's AdamW part reads the adam_* keys; NorMuon's second moment reads beta2.
  CHECK(OptimizerConfig::parse("muon:adam_beta2=0.9,muon_params=h").adam_beta2 == 0.9);
  CHECK(OptimizerConfig::parse("normuon:beta2=0.9").beta2 == 0.9);
  CHECK_THROWS_AS(OptimizerConfig::parse("muon:beta2=0.9"), InvalidArgument);

  const ParamSpace space({"w"}, {at::zeros({3, 4}, at::kDouble)});
  REQUIRE(
      optimizer_names() ==
      std::vector<std::string>{
          "adamw", "adam",       "muon",  "normuon", "sgd",       "signsgd",   "signum",
          "lion",  "torch-muon", "nadam", "radam",   "adafactor", "ademamix",  "adamw-schedulefree",
          "soap",  "adamuon",    "mars",  "shampoo", "kron",      "adam-mini", "scion"});
  for (const auto& entry : optimizer_table()) {
    INFO(entry.name);
    const OptimizerConfig d = OptimizerConfig::defaults(entry.name);
    CHECK(d.name == entry.name);
    CHECK_FALSE(entry.help.empty());
    // Every key the entry lists is settable, and setting each to its default changes nothing.
    std::string spec = entry.name;
    const auto hyper = d.hyper();
    for (size_t k = 0; k < entry.keys.size(); ++k) {
      const std::string& key = entry.keys[k];
      std::string value = key == "muon_params" ? d.muon_params : "";
      for (const auto& [name, v] : hyper) {
        if (name == key) value = fmt::format("{}", v);
      }
      if (key == "muon_params") continue;  // empty: parse_key_values wants a value
      spec += (k ? "," : ":") + key + "=" + value;
    }
    const OptimizerConfig parsed = OptimizerConfig::parse(spec);
    CHECK(parsed.to_json() == d.to_json());
    CHECK(OptimizerConfig::parse(entry.name).to_json() == d.to_json());
    // Stored metadata records every field, read or not: set_stored accepts them all.
    OptimizerConfig stored = OptimizerConfig::defaults(entry.name);
    for (const auto& [key, v] : hyper) stored.set_stored(key, fmt::format("{}", v));
    CHECK(stored.to_json() == d.to_json());
    auto optimizer = make_optimizer(d, space);
    CHECK(optimizer->config().name == entry.name);
    // Each rule trains: three steps from fresh state on a fixed gradient move θ, finitely (SOAP's
    // first step only sets its eigenbases up).
    const ParamVector theta = {at::full({3, 4}, 0.5, at::kDouble)};
    const ParamVector grad = {at::linspace(-1, 1, 12, at::kDouble).view({3, 4})};
    double moved = 0;
    for (int step = 0; step < 3; ++step) {
      const ParamVector u = optimizer->step(theta, grad);
      CHECK(u[0].isfinite().all().item<bool>());
      moved += u[0].abs().max().item<double>();
    }
    CHECK(moved > 0);
  }
  // Kron fits its factors as it trains (every step early on, by the default schedule).
  auto kron = make_optimizer(OptimizerConfig::parse("kron"), space);
  for (int step = 0; step < 2; ++step) {
    kron->step({at::full({3, 4}, 0.5, at::kDouble)},
               {at::linspace(-1, 1, 12, at::kDouble).view({3, 4})});
  }
  for (const auto& [key, value] : kron->state()) {
    if (key == "w.Q.0") CHECK_FALSE(at::allclose(value, at::eye(3, value.options())));
  }
  // Whether a rebuilt step needs saved state follows from the state the rule keeps.
  CHECK_FALSE(make_optimizer(OptimizerConfig::parse("signsgd"), space)->needs_saved_state());
  CHECK_FALSE(make_optimizer(OptimizerConfig::parse("sgd"), space)->needs_saved_state());
  CHECK(make_optimizer(OptimizerConfig::parse("sgd:momentum=0.9"), space)->needs_saved_state());
  CHECK(make_optimizer(OptimizerConfig::parse("adamw"), space)->needs_saved_state());
  CHECK(make_optimizer(OptimizerConfig::parse("muon"), space)->needs_saved_state());
}
