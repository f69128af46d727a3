// CurvatureEngine::coupling: C_lm = u_lᵀ H u_m against the dense float64 Hessian, on every built-in
// architecture (whose linear maps it reads from their inputs and outputs) and on an objective that
// lists none, with kept graphs, recomputed graphs, micro-batches, finite differences and
// layer-wise recomputation.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>

#include "curv/core/blocks.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/linear_operator.h"
#include "curv/models/models.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

struct Case {
  std::string name;
  ModelConfig config;
  int64_t vocab = 0;  // 0: the MLP's probe
  size_t listed = 0;  // linear maps the model lists per sequence batch
};

std::vector<Case> cases() {
  GptConfig tied;
  tied.vocab_size = 7;
  tied.block_size = 4;
  tied.n_layer = 2;
  tied.n_head = 2;
  tied.n_embd = 4;
  tied.tied = true;
  tied.conv1d = true;  // HF GPT-2's [in, out] layout: the transposed maps
  LlamaConfig llama;
  llama.vocab_size = 11;
  llama.hidden_size = 8;
  llama.intermediate_size = 12;
  llama.num_hidden_layers = 2;
  llama.num_attention_heads = 4;
  llama.num_key_value_heads = 2;  // q, k and v read one input; gate and up another
  llama.max_position_embeddings = 8;
  llama.qk_norm = true;
  llama.mlp_bias = true;
  LlamaConfig llama_tied = llama;
  llama_tied.tie_word_embeddings = true;
  llama_tied.attention_bias = true;
  ModdedConfig modded;
  modded.vocab_size = 9;
  modded.num_layers = 1;
  modded.model_dim = 8;
  modded.head_dim = 4;
  modded.context = 4;
  return {{"gpt, untied head", tiny_gpt_config(), 5, 5},
          {"gpt, tied head, Conv1D layout", ModelConfig("gpt", tied), 7, 8},
          {"llama, grouped-query attention", ModelConfig("llama", llama), 11, 15},
          {"llama, tied head, biases", ModelConfig("llama", llama_tied), 11, 14},
          {"modded", ModelConfig("modded", modded), 9, 7},
          // A window of 2 of the probe's 4 positions on the first layer; caps that bend.
          {"gemma2, soft-capped, sliding window", ModelConfig::from_json(R"({"arch": "gemma2",
              "vocab_size": 11, "hidden_size": 8, "intermediate_size": 12,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 4, "max_position_embeddings": 8, "sliding_window": 2,
              "query_pre_attn_scalar": 4, "attn_logit_softcapping": 0.5,
              "final_logit_softcapping": 2.0, "tie_word_embeddings": false})"),
           11, 15},
          // Top-2 of 4 experts: the routing is held fixed in every derivative.
          {"mixtral, 4 experts, top 2",
           ModelConfig::from_json(R"({"arch": "mixtral", "vocab_size": 11, "hidden_size": 8,
              "expert_intermediate_size": 6, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1, "max_position_embeddings": 8, "num_experts": 4,
              "num_experts_per_tok": 2})"),
           11, 5},
          {"gemma3, q/k norms, tied head", ModelConfig::from_json(R"({"arch": "gemma3",
              "vocab_size": 11, "hidden_size": 8, "intermediate_size": 12,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 4, "max_position_embeddings": 8, "sliding_window": 2,
              "query_pre_attn_scalar": 4, "rope_factor": 8.0,
              "layer_types": ["sliding_attention", "full_attention"]})"),
           11, 14},
          {"mlp (its first map reads the data)", tiny_mlp_config(), 0, 2}};
}

ProbeSet probe_of(const Case& c) {
  return c.vocab == 0 ? mlp_probe(5, 9, 4) : gpt_probe(5, 9, 4, c.vocab, 4);
}

// U_blocksᵀ H U_blocks from the dense Hessian.
Eigen::MatrixXd dense_coupling(CurvatureEngine& engine, const ParamVector& u,
                               const BlockPartition& blocks) {
  const Eigen::MatrixXd h = dense_hessian(engine);
  const int64_t n = engine.space().numel();
  Eigen::MatrixXd basis(n, static_cast<Eigen::Index>(blocks.size()));
  for (size_t l = 0; l < blocks.size(); ++l) {
    basis.col(static_cast<Eigen::Index>(l)) = flat(masked(u, blocks[l].params), n);
  }
  return basis.transpose() * h * basis;
}

std::vector<std::vector<size_t>> supports_of(const BlockPartition& blocks) {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : blocks.blocks()) out.push_back(b.params);
  return out;
}

double max_relative(const Eigen::MatrixXd& a, const Eigen::MatrixXd& b) {
  return (a - b).cwiseAbs().maxCoeff() / std::max(1e-300, b.cwiseAbs().maxCoeff());
}

}  // namespace

TEST_CASE("the block coupling equals the dense float64 form on the built-in architectures",
          "[engine][coupling]") {
  for (const Case& c : cases()) {
    INFO(c.name);
    auto model = make_model(c.config, ModelInit{7, at::kDouble});
    const ProbeSet probe = probe_of(c);
    std::vector<LinearUse> listed;
    model->loss_listing_linears(probe[0], listed);
    CHECK(listed.size() == c.listed);
    const ParamVector u = random_direction(*model, 13);
    CurvatureEngine reference(*model, probe);
    const Eigen::MatrixXd h = dense_hessian(reference);
    const int64_t n = reference.space().numel();
    for (const BlockRule rule : {BlockRule::kLayer, BlockRule::kTensor}) {
      const bool layers = rule == BlockRule::kLayer;
      INFO((layers ? "layer blocks" : "one block per tensor"));
      const BlockPartition blocks =
          BlockPartition::by_rule(model->space(), model->structure(), rule);
      Eigen::MatrixXd basis(n, static_cast<Eigen::Index>(blocks.size()));
      for (size_t l = 0; l < blocks.size(); ++l) {
        basis.col(static_cast<Eigen::Index>(l)) = flat(masked(u, blocks[l].params), n);
      }
      const Eigen::MatrixXd want = basis.transpose() * h * basis;
      // A direction with its blocks' signs flipped, as the randomized coupling draws them.
      ParamVector w = u;
      Eigen::VectorXd signs(basis.cols());
      for (size_t l = 0; l < blocks.size(); ++l) {
        signs(static_cast<Eigen::Index>(l)) = l % 3 == 1 ? -1.0 : 1.0;
        for (size_t i : blocks[l].params) w[i] = u[i] * signs(static_cast<Eigen::Index>(l));
      }

      EngineOptions recomputed, sliced, fd, by_layer;
      recomputed.reuse_graph = false;
      sliced.micro_batch = 3;
      fd.hvp_method = HvpMethod::kFiniteDifference;
      by_layer.recompute_layers = true;
      by_layer.micro_batch = 3;
      std::vector<EngineOptions> variants{EngineOptions{}, fd};
      if (layers) variants.insert(variants.end(), {recomputed, sliced});
      if (model->loss_stages() > 0) variants.push_back(by_layer);
      for (const EngineOptions& options : variants) {
        const bool exact = options.hvp_method == HvpMethod::kExact;
        const double tol = exact ? 1e-10 : 1e-5;
        INFO("reuse_graph " << options.reuse_graph << ", micro_batch " << options.micro_batch
                            << (exact ? "" : ", finite differences")
                            << (options.recompute_layers ? ", layer by layer" : ""));
        CurvatureEngine engine(*model, probe, options);
        Eigen::MatrixXd observed = Eigen::MatrixXd::Zero(want.rows(), want.cols());
        Eigen::VectorXd first = Eigen::VectorXd::Zero(want.rows());
        size_t batches = 0;
        const Eigen::MatrixXd got =
            engine.coupling(u, supports_of(blocks), [&](const CouplingTerms& t) {
              CHECK((*t.coupling - t.coupling->transpose()).cwiseAbs().maxCoeff() == 0.0);
              observed += t.weight * *t.coupling;
              first += t.weight * *t.first_order;
              ++batches;
            });
        CHECK(batches == probe.size());
        CHECK(max_relative(got, want) <= tol);
        CHECK(max_relative(observed, got) <= 1e-12);
        const ParamVector& g = engine.gradient();
        for (size_t l = 0; l < blocks.size(); ++l) {
          const double gu = dot(g, u, blocks[l].params);
          CHECK(std::abs(first(static_cast<Eigen::Index>(l)) - gu) <=
                1e-10 * std::max(1e-12, std::abs(gu)));
        }
        CHECK(engine.counters().hvps == static_cast<int64_t>(blocks.size()));

        // One product along u (the row sums) and along the sign-flipped w, read per block.
        Eigen::VectorXd rows_observed = Eigen::VectorXd::Zero(want.rows());
        const Eigen::VectorXd rows =
            engine.block_row(u, supports_of(blocks), u, [&](const CouplingTerms& t) {
              REQUIRE(t.coupling->cols() == 1);
              rows_observed += t.weight * t.coupling->col(0);
            });
        const Eigen::MatrixXd want_rows = want.rowwise().sum();
        CHECK(max_relative(rows, want_rows) <= tol);
        CHECK(max_relative(rows_observed, rows) <= 1e-12);
        const Eigen::MatrixXd want_signed = want * signs;
        CHECK(max_relative(engine.block_row(u, supports_of(blocks), w), want_signed) <= tol);
      }
    }
  }
}

TEST_CASE("an objective that lists no linear maps gets the same coupling", "[engine][coupling]") {
  // The TorchScript path's situation: the second backward forms every block's products itself.
  auto model = make_model(tiny_gpt_config(), ModelInit{3, at::kDouble});
  struct Unlisted : Objective {
    Objective& inner;
    explicit Unlisted(Objective& o) : inner(o) {}
    const ParamSpace& space() const override { return inner.space(); }
    ParamVector parameters() override { return inner.parameters(); }
    at::Tensor loss(const Batch& b) override { return inner.loss(b); }
    std::string describe() const override { return "unlisted " + inner.describe(); }
  } unlisted(*model);
  const ProbeSet probe = gpt_probe(4, 8, 4);
  const ParamVector u = random_direction(*model, 2);
  const BlockPartition blocks = BlockPartition::by_rule(model->space(), BlockRule::kLayer);
  CurvatureEngine listed_engine(*model, probe), unlisted_engine(unlisted, probe);
  const Eigen::MatrixXd a = listed_engine.coupling(u, supports_of(blocks));
  const Eigen::MatrixXd b = unlisted_engine.coupling(u, supports_of(blocks));
  CHECK(max_relative(a, b) <= 1e-12);
}

TEST_CASE("the block coupling: zero parts, and blocks that overlap or leave the model",
          "[engine][coupling]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{3, at::kDouble});
  const ProbeSet probe = gpt_probe(4, 8, 4);
  ParamVector u = random_direction(*model, 2);
  const BlockPartition blocks = BlockPartition::by_rule(model->space(), BlockRule::kLayer);
  REQUIRE(blocks.size() >= 3);
  for (size_t i : blocks[1].params) u[i].zero_();
  CurvatureEngine engine(*model, probe);
  const Eigen::MatrixXd c = engine.coupling(u, supports_of(blocks));
  CHECK(c.row(1).cwiseAbs().maxCoeff() == 0.0);
  CHECK(c.col(1).cwiseAbs().maxCoeff() == 0.0);
  CHECK(engine.counters().hvps == static_cast<int64_t>(blocks.size()) - 1);
  CHECK(max_relative(c, dense_coupling(engine, u, blocks)) <= 1e-10);

  auto overlapping = supports_of(blocks);
  overlapping[0].push_back(overlapping[1].front());
  CHECK_THROWS_WITH(engine.coupling(u, overlapping),
                    Catch::Contains(model->space()[overlapping[1].front()].name) &&
                        Catch::Contains("blocks 0 and 1"));
  auto outside = supports_of(blocks);
  outside[2].push_back(u.size());
  CHECK_THROWS_AS(engine.coupling(u, outside), InvalidArgument);
  CHECK_THROWS_AS(engine.coupling(ParamVector(u.begin(), u.end() - 1), supports_of(blocks)),
                  InvalidArgument);
}
