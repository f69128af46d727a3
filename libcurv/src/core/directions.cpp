#include "curv/core/directions.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "core/strings.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"

namespace curv {

namespace {

class DeltaDirection : public Direction {
 public:
  std::string name() const override { return "delta"; }
  bool reads_saved_state() const override { return false; }
  std::string unavailable(const DirectionContext& c) const override {
    return c.theta_next.empty() ? "no next checkpoint to take a delta to" : "";
  }
  ParamVector compute(DirectionContext& c) override {
    // In the engine's vector dtype: the difference of two 16-bit checkpoints is not 16-bit.
    return c.engine ? sub(c.theta_next, c.theta, c.engine->vector_dtype())
                    : sub(c.theta_next, c.theta);
  }
  const ParamVector* landing(const DirectionContext& c) const override { return &c.theta_next; }
};

class GradientDirection : public Direction {
 public:
  std::string name() const override { return "gradient"; }
  bool reads_saved_state() const override { return false; }
  bool reads_next_checkpoint() const override { return false; }
  ParamVector compute(DirectionContext& c) override { return scaled(c.engine->gradient(), -1.0); }
};

class RandomDirection : public Direction {
 public:
  explicit RandomDirection(std::vector<std::vector<size_t>> blocks) : blocks_(std::move(blocks)) {}
  std::string name() const override { return "random"; }
  bool reads_saved_state() const override { return false; }
  ParamVector compute(DirectionContext& c) override {
    const ParamVector reference = c.theta_next.empty()
                                      ? scaled(c.engine->gradient(), -1.0)
                                      : sub(c.theta_next, c.theta, c.engine->vector_dtype());
    // One stream per (seed, step): reruns and resumed runs draw the same direction.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(c.seed * 1000003ULL +
                                                        static_cast<uint64_t>(c.step));
    ParamVector u;
    for (const auto& t : reference) {
      u.push_back(at::randn(t.sizes(), gen, at::TensorOptions().dtype(at::kDouble))
                      .to(t.device(), t.scalar_type()));
    }
    std::vector<std::vector<size_t>> blocks = blocks_.empty() ? c.blocks : blocks_;
    if (blocks.empty()) {
      for (size_t i = 0; i < u.size(); ++i) blocks.push_back({i});
    }
    for (const auto& block : blocks) {
      const double want = std::sqrt(dot(reference, reference, block));
      const double have = std::sqrt(dot(u, u, block));
      for (size_t p : block) u[p] = u[p] * (have > 0 ? want / have : 0.0);
    }
    return u;
  }

 private:
  std::vector<std::vector<size_t>> blocks_;
};

}  // namespace

std::unique_ptr<Direction> make_delta_direction() { return std::make_unique<DeltaDirection>(); }
std::unique_ptr<Direction> make_gradient_direction() {
  return std::make_unique<GradientDirection>();
}
std::unique_ptr<Direction> make_random_direction(std::vector<std::vector<size_t>> blocks) {
  return std::make_unique<RandomDirection>(std::move(blocks));
}

}  // namespace curv
