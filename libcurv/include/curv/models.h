// Built-in models, written functionally on ATen so they are twice differentiable everywhere:
// an MLP and a GPT with nanoGPT's parameter names (pre-LayerNorm, plain softmax causal attention,
// exact GELU, tied or untied head). Both are described by a small JSON config.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "curv/objective.h"

namespace curv {

struct GptConfig {
  int64_t vocab_size = 512;
  int64_t block_size = 64;  // context length; inputs are (batch, T <= block_size) int64 tokens
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  bool bias = true;  // biases in Linear and LayerNorm, as nanoGPT's `bias`
  bool tied = true;  // lm_head shares transformer.wte.weight
};

struct MlpConfig {
  std::vector<int64_t> sizes = {8, 16, 4};  // input, hidden..., output
  std::string activation = "tanh";          // tanh | gelu | relu | sigmoid
  std::string loss = "cross_entropy";       // cross_entropy (int64 targets) | mse
};

struct ModelConfig {
  std::string arch = "gpt";  // gpt | mlp
  GptConfig gpt;
  MlpConfig mlp;

  void validate() const;  // throws InvalidArgument naming the field and value
  // JSON: {"arch": "gpt", "vocab_size": 512, "n_layer": 4, ...} or
  //       {"arch": "mlp", "sizes": [8, 16, 4], "activation": "tanh", "loss": "cross_entropy"}.
  static ModelConfig from_json(const std::string& text, const std::string& origin = "<json>");
  static ModelConfig from_file(const std::string& path);
  std::string to_json() const;
  std::string describe() const;
};

struct ModelInit {
  uint64_t seed = 0;
  at::ScalarType dtype = at::ScalarType::Float;
  std::string device = "cpu";
};

// A built-in model with nanoGPT-style initialisation (normal(0, 0.02), residual projections
// scaled by 1/sqrt(2 n_layer), zero biases, unit LayerNorm gains) drawn from `init.seed`.
std::unique_ptr<Objective> make_model(const ModelConfig& config, const ModelInit& init = {});

}  // namespace curv
