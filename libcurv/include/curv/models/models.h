// Built-in models, written functionally on ATen so they are twice differentiable everywhere:
// an MLP, a GPT with nanoGPT's parameter names (pre-LayerNorm, plain softmax causal attention,
// exact GELU, tied or untied head), and the two model problems of the seed papers whose
// curvature is known in closed form (model_problems.h). All are described by a small JSON config.
#pragma once

#include <any>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "curv/core/objective.h"
#include "curv/models/registry.h"

namespace curv {

struct GptConfig {
  int64_t vocab_size = 512;
  int64_t block_size = 64;  // context length; inputs are (batch, T <= block_size) int64 tokens
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  bool bias = true;  // biases in Linear and LayerNorm, as nanoGPT's `bias`
  bool tied = true;  // lm_head shares transformer.wte.weight
  // Hugging Face GPT-2 (GPT2LMHeadModel) reads the same names; these keys cover its differences.
  std::string activation = "gelu";  // gelu (exact, nanoGPT) | gelu_tanh (HF's gelu_new)
  double layer_norm_eps = 1e-5;
  int64_t n_inner = 0;  // MLP width; 0: 4 * n_embd
  // Weights stored [in, out] as HF's Conv1D (y = x W + b) instead of nn.Linear's [out, in].
  bool conv1d = false;
  int64_t mlp_width() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
};

// The Hugging Face LLaMA family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM): RMSNorm,
// rotary position embeddings (rotate_half), grouped-query attention, SwiGLU MLP, with HF's
// parameter names (model.embed_tokens, model.layers.N.self_attn.q_proj, ...). The keys are HF
// config.json's; a config.json read as a model config maps onto this (registry.h).
struct LlamaConfig {
  int64_t vocab_size = 512;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 344;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 0;        // grouped-query attention; 0: num_attention_heads
  int64_t head_dim = 0;                   // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 256;  // the longest sequence the model reads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;  // lm_head shares model.embed_tokens.weight
  bool attention_bias = false;       // biases on the q, k, v and o projections (LLaMA)
  bool qkv_bias = false;             // biases on q, k and v only (Qwen2)
  bool mlp_bias = false;             // biases on gate, up and down (LLaMA's mlp_bias)
  // Mistral's sliding-window attention: 0 for none; otherwise a sequence longer than the window
  // is refused, so plain causal attention is exactly the window's.
  int64_t sliding_window = 0;
  // Qwen3: an RMSNorm over each head's query and key (q_norm, k_norm) before the rotation.
  bool qk_norm = false;
  // Rotary frequency scaling, as transformers' rope_parameters (or legacy rope_scaling):
  // "default" (none), "linear" (every inverse frequency divided by rope_factor) or "llama3"
  // (Llama 3.1: long wavelengths divided by rope_factor, short ones kept, the band between
  // interpolated; rope_low_freq_factor, rope_high_freq_factor, rope_original_context).
  std::string rope_type = "default";
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_context = 8192;
  // HF's nn.Embedding padding_idx (config.json's pad_token_id): that token's embedding row gets
  // no gradient, as in the training HF runs, so rebuilt optimizer steps and gradients match its;
  // -1: none.
  int64_t pad_token_id = -1;
  int64_t kv_heads() const {
    return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads;
  }
  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
};

// modded-nanogpt's optimization-track architecture (records/track_3_optimization/
// train_gpt_simple.py): RMSNorm gains, QK RMSNorm, half-truncated rotary, ReLU² MLP, biases,
// untied head `proj` with a logit soft-cap. The script sums the cross-entropy over its batch of
// tokens; the loss here is the mean per token times `loss_scale` (1: the per-token loss its
// validation reports; the tokens per step, e.g. 524288, for the objective its gradient is of).
struct ModdedConfig {
  int64_t vocab_size = 50304;
  int64_t num_layers = 12;
  int64_t model_dim = 768;
  int64_t head_dim = 128;
  int64_t context = 1024;         // the longest sequence
  double logit_cap = 15.0;        // 15·z/√(z² + 15²); 0 for none
  double loss_scale = 1.0;        // see above
  double attention_scale = 0.12;  // scores are q·k times this (not 1/√head_dim)
  int64_t heads() const { return model_dim / head_dim; }
};

struct MlpConfig {
  std::vector<int64_t> sizes = {8, 16, 4};  // input, hidden..., output
  std::string activation = "tanh";          // tanh | gelu | relu | sigmoid
  std::string loss = "cross_entropy";       // cross_entropy (int64 targets) | mse
};

// The structured quadratic L(W) = ½·w_L·‖W‖² + ½·(w_H − w_L)·‖U_kᵀ W V_k‖² of one matrix
// W (rows × cols): its Hessian w_L·I⊗I + (w_H − w_L)·P_V⊗P_U has Kronecker rank 2 with jointly
// diagonal factors, curvature w_H on the modes u_i v_jᵀ with i, j < k and w_L on all others,
// k = alpha·min(rows, cols). Training starts at W_0 = U diag(d) Vᵀ with d_i = d_high for i < k,
// d_low otherwise. U, V are orthogonal: random (from basis_seed) or the identity.
struct QuadraticConfig {
  int64_t rows = 32;
  int64_t cols = 32;
  double alpha = 0.25;  // fraction of the min(rows, cols) diagonal modes with curvature w_high
  double w_high = 10.0;
  double w_low = 1.0;
  double d_high = 1.0;  // initial singular values on the high- and low-curvature modes
  double d_low = 1.0;
  std::string basis = "random";  // random | identity
  uint64_t basis_seed = 0;
  int64_t high_modes() const;  // k
};

// The one-layer linear associative memory with softmax retrieval: class c's key e_in(c) is
// mapped to logits E_out·W·e_in(c) over the classes, loss cross-entropy against the stored
// class. Keys and output embeddings are fixed (orthonormal rows, or Gaussian / sqrt(dim) rows
// when dim < classes) from embedding_seed; W (dim × dim) starts at zero. Class frequencies come
// with the data (power law p_c ∝ (c+1)^(−s), class 0 the most frequent).
struct MemoryConfig {
  int64_t classes = 64;
  int64_t dim = 64;
  std::string embeddings = "orthonormal";  // orthonormal (needs dim >= classes) | gaussian
  uint64_t embedding_seed = 0;
};

// A model's config: its architecture's name and that architecture's typed config (GptConfig,
// MlpConfig, QuadraticConfig, MemoryConfig, or a registered architecture's own), read with
// as<GptConfig>(). Parsing, validation and serialisation go through the registry (registry.h).
class ModelConfig {
 public:
  ModelConfig();  // gpt with GptConfig's defaults
  // `config` must be the type `arch`'s registered architecture parses into.
  template <typename Config>
  ModelConfig(std::string arch, Config config)
      : arch_(std::move(arch)), config_(std::move(config)) {}
  // The registered defaults of `arch`; InvalidArgument listing the registered names if unknown.
  static ModelConfig defaults(const std::string& arch);

  const std::string& arch() const { return arch_; }
  const std::any& config() const { return config_; }
  // The typed config; InvalidArgument naming the arch when it holds another type.
  template <typename Config>
  const Config& as() const {
    if (const auto* c = std::any_cast<Config>(&config_)) return *c;
    throw_wrong_type(typeid(Config).name());
  }
  template <typename Config>
  Config& as() {
    if (auto* c = std::any_cast<Config>(&config_)) return *c;
    throw_wrong_type(typeid(Config).name());
  }
  // What data the model reads (ModelData in registry.h): tools choose their data by it.
  ModelData data() const;
  // Architecture::parameter_count: the numbers the parameters hold (NaN: not known; above
  // `stop_above`, a lower bound).
  double parameter_count(double stop_above = std::numeric_limits<double>::infinity()) const;

  void validate() const;  // throws InvalidArgument naming the field and value
  // JSON: {"arch": "gpt", "vocab_size": 512, "n_layer": 4, ...} or
  //       {"arch": "mlp", "sizes": [8, 16, 4], "activation": "tanh", "loss": "cross_entropy"},
  //       {"arch": "quadratic", "rows": 32, "cols": 32, "alpha": 0.25, "w_high": 10, ...},
  //       {"arch": "memory", "classes": 64, "dim": 64, "embeddings": "orthonormal"},
  //       {"arch": "llama", "hidden_size": 128, "num_hidden_layers": 4, ...},
  //       {"arch": "modded", "num_layers": 12, "model_dim": 768, "head_dim": 128, ...}.
  // "arch" defaults to gpt; an unknown arch is an InvalidArgument listing the registered ones.
  // A Hugging Face config.json (a "model_type" and no "arch") is read by the architecture that
  // takes its model_type (llama, mistral, qwen2 -> llama; gpt2 -> gpt); a field it does not
  // support is a FormatError naming `origin` and the field.
  static ModelConfig from_json(const std::string& text, const std::string& origin = "<json>");
  static ModelConfig from_file(const std::string& path);
  std::string to_json() const;
  std::string describe() const;

 private:
  [[noreturn]] void throw_wrong_type(const char* requested) const;
  std::string arch_;
  std::any config_;
};

struct ModelInit {
  uint64_t seed = 0;
  at::ScalarType dtype = at::ScalarType::Float;
  std::string device = "cpu";
  // false: the transformers (gpt, llama, modded) leave their parameters unset (allocated on the
  // device, not drawn) for a caller that overwrites every one, as from a checkpoint. Drawing
  // GPT-2 small's 124M values on the CPU takes seconds.
  bool draw = true;
};

// The model of config.arch() from the registry, drawn from `init.seed`. The built-in GPT has
// nanoGPT-style initialisation (normal(0, 0.02), residual projections scaled by
// 1/sqrt(2 n_layer), zero biases, unit LayerNorm gains).
std::unique_ptr<Objective> make_model(const ModelConfig& config, const ModelInit& init = {});

// The built-in language models (gpt, llama, modded) and the MLP take their mean cross-entropy
// from one fused autograd operation whose backward is one differentiable operation with a
// hand-written derivative (default): the same numbers as ATen's log_softmax + nll_loss to
// rounding, with less memory kept for HVPs and fewer passes over the [tokens, vocabulary]
// logits in each. `false` selects ATen's operations, for comparison. Process-wide.
void set_fused_cross_entropy(bool enabled);
bool fused_cross_entropy();

}  // namespace curv
