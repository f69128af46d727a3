// Parts the built-in transformers share, as Hugging Face's modelling code computes them: RMSNorm,
// the rotary position embedding (whole or partial heads, rotate_half convention) and causal
// attention with grouped-query heads. Plain ATen (and libcurv's fused) operations, twice
// differentiable; each architecture file composes them.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "curv/core/objective.h"
#include "curv/models/fused_ops.h"
#include "curv/models/models.h"
#include "models/architecture.h"

namespace curv {

// The parameters of a built-in transformer as HF's _init_weights draws them: normal(0, std)
// weights (HF's 0.02 unless an architecture scales it), constant gains and biases, drawn in float64
// on the CPU from one generator (the same model in every dtype and on every device), or left unset
// (ModelInit::draw false) for a caller that overwrites every one.
class ParameterDraw {
 public:
  explicit ParameterDraw(const ModelInit& init);
  at::Tensor normal(std::vector<int64_t> shape, double std = 0.02);
  at::Tensor filled(std::vector<int64_t> shape, double value);

 private:
  ModelInit init_;
  at::Generator generator_;
};

// A causal language model on token batches: its loss (the mean cross-entropy), per-token losses
// and logits, all from forward() after check(); its projections as Linear (a weight and, when it
// has one, its bias directly after it) and each parameter's role in `roles_`.
class CausalLanguageModel : public FunctionalModel {
 public:
  at::Tensor loss(const Batch& batch) override;
  at::Tensor token_losses(const Batch& batch) override;
  at::Tensor logits(const Batch& batch) override;
  // The embedding, each layer, then the head with the loss (Objective::loss_stages).
  size_t loss_stages() const override { return num_layers() + 2; }
  at::Tensor loss_stage(size_t stage, const at::Tensor& x, const Batch& batch) override;

 protected:
  explicit CausalLanguageModel(const ModelInit& init) : draw_(init) {}

  struct Linear {
    size_t weight = 0;
    bool bias = false;
  };
  // Registration, in a constructor, in the checkpoint's order: each parameter gets its role, the
  // layer and expert the constructor has set in layer_ and expert_ (−1: none) and, for a fused
  // projection, its row slices.
  size_t add_param(const std::string& name, at::Tensor value, ParamRole role,
                   std::vector<RowSlice> slices = {});
  // A projection (HF's nn.Linear) drawn normal(0, 0.02) and, when it has one, its zero bias
  // directly after it.
  Linear add_linear(const std::string& name, int64_t out, int64_t in, bool bias, ParamRole role,
                    const std::vector<RowSlice>& slices = {});
  // A norm's gain `name`.weight of `size` entries equal to `value` (Gemma's 1 + w gains start at
  // 0).
  size_t add_gain(const std::string& name, int64_t size, double value = 1.0);
  // HF's token embedding `model.embed_tokens.weight` [vocab, hidden], and after the layers the
  // head `lm_head.weight` unless it is tied to the embedding (returns its index, 0 when tied).
  size_t add_token_embedding(int64_t vocab, int64_t hidden);
  size_t add_untied_head(int64_t vocab, int64_t hidden, bool tied);
  // ModelError naming what a batch the model cannot read gets wrong.
  virtual void check(const Batch& batch) const = 0;
  // Logits [B, T, vocab] of int64 tokens [B, T].
  // head(layer(…layer(embed(tokens)))): the stages layer-wise recomputation runs one by one.
  at::Tensor forward(const at::Tensor& tokens) const;
  virtual size_t num_layers() const = 0;
  // The hidden states [B, T, hidden] of int64 tokens [B, T].
  virtual at::Tensor embed(const at::Tensor& tokens) const = 0;
  // Decoder layer `index` on the hidden states: a function of them and the parameters only.
  virtual at::Tensor layer(size_t index, const at::Tensor& x) const = 0;
  // The logits of the last layer's hidden states.
  virtual at::Tensor head(const at::Tensor& x) const = 0;
  // What the mean cross-entropy is multiplied by in loss() and token_losses() (modded-nanogpt's
  // loss_scale); 1 for the others.
  virtual double loss_scale() const { return 1.0; }
  // A head's logits from the final norm's output: by the token embedding when `tied` (then not a
  // listed linear map, the embedding being looked up too), else by the head weight.
  at::Tensor token_head(const at::Tensor& normed, size_t embedding, size_t head, bool tied) const;
  at::Tensor linear(const at::Tensor& x, const Linear& l) const;
  // The parameters' roles with the attention's head counts.
  ModelStructure heads_structure(int64_t n_head, int64_t n_kv_head, int64_t head_dim) const;
  // The same with, when `tied`, lm_head.weight named as model.embed_tokens.weight's tie.
  ModelStructure decoder_structure(int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                   bool tied) const;

  ParameterDraw draw_;
  int64_t layer_ = -1, expert_ = -1;
  std::vector<ParamStructure> roles_;  // aligned with the parameters
};

// A token batch a causal language model of `arch` can read: int64 inputs [B, T] with targets of
// the same shape, T ≤ context (the config's `context_key`), ids in [0, vocab); ModelError naming
// what differs otherwise.
void check_token_batch(const Batch& batch, const char* arch, int64_t vocab, int64_t context,
                       const char* context_key = "max_position_embeddings");

// The cross-entropy of each target token, shaped like `targets`.
at::Tensor token_cross_entropy(const at::Tensor& logits, const at::Tensor& targets);

// x / sqrt(mean(x²) + eps) over the last dimension, times `gain` (HF's LlamaRMSNorm), in the
// model's dtype (HF normalises in float32 whatever the dtype; here float64 stays exact).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& gain, double eps);

// A causal language model in HF's decoder shell with RMSNorm (llama and the families read as it,
// olmo2, phi3, the mixtures of experts): the token embedding before the layers, the final norm's
// gain and the head (or its tie to the embedding) after them, every norm an RMSNorm of one
// epsilon. The family registers its layers between the two and computes layer().
class RmsNormDecoder : public CausalLanguageModel {
 protected:
  RmsNormDecoder(const ModelInit& init, int64_t pad_token_id, double rms_norm_eps, bool tied)
      : CausalLanguageModel(init), pad_token_id_(pad_token_id), eps_(rms_norm_eps), tied_(tied) {}
  // `model.embed_tokens.weight` [vocab, hidden], registered before the layers.
  void add_embedding(int64_t vocab, int64_t hidden);
  // `model.norm.weight` and, unless tied, `lm_head.weight`, registered after the layers.
  void add_final_norm_and_head(int64_t vocab, int64_t hidden);
  at::Tensor norm(const at::Tensor& x, size_t gain) const { return rms_norm(x, p(gain), eps_); }
  at::Tensor embed(const at::Tensor& tokens) const override;
  at::Tensor head(const at::Tensor& x) const override;

 private:
  int64_t pad_token_id_;
  double eps_;
  bool tied_;
  size_t embed_ = 0, norm_ = 0, head_ = 0;
};

// θ^(−2i/dims) for i < dims / 2, in float64 (the default rope type).
at::Tensor rotary_inverse_frequencies(double theta, int64_t dims, const at::TensorOptions& f64);

// The rotary angles t · inv_i of positions t < T, as cos and sin tables [T, 2 · inv.numel()]
// (each frequency twice, HF's cat((freqs, freqs))), computed in float64 and cast to `dtype`.
struct RotaryTable {
  at::Tensor cos, sin;
  int64_t dims = 0;  // the features of each head that rotate: the first `dims`
};
RotaryTable rotary_table(const at::Tensor& inverse_frequencies, int64_t T, at::ScalarType dtype);
// The table of a layer's hidden states x [B, T, …] for the default rope θ over the first `dims`
// features of each head, its frequencies divided by `factor` (linear scaling): in float64 on x's
// device, cast to x's dtype. Each layer forms it again: a T × dims table, next to nothing beside
// a layer.
RotaryTable layer_rotary_table(const at::Tensor& x, double theta, int64_t dims,
                               double factor = 1.0);

// x [..., T, head_dim] rotated by position: x·cos + rotate_half(x)·sin over the first
// table.dims features, the rest passed through (GPT-NeoX's partial rotary).
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTable& table);

// What a causal attention layer does to its scores beyond q kᵀ · scale: Gemma 2's tanh
// soft-capping, s ↦ cap · tanh(s / cap) before the mask (0: none), and a sliding window, each
// query reading the `window` latest positions, itself included (0: every earlier position).
struct AttentionScores {
  double scale = 1.0;
  double softcap = 0.0;
  int64_t window = 0;
};

// softmax(q kᵀ · scale + causal mask) v for q [B, H, T, D] and k, v [B, KV, T, D], query head j
// reading key/value head j / (H / KV) (HF's repeat_kv); the heads' outputs side by side,
// [B, T, H · D].
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale);
// The same with soft-capped scores and a sliding window (HF's eager attention with softcap and
// sliding_window): the masked positions get probability 0 exactly.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionScores& scores);

}  // namespace curv
