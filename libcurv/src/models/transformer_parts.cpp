#include "models/transformer_parts.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <limits>

#include "core/fmt_torch.h"
#include "curv/core/error.h"
#include "curv/core/param_space.h"
#include "curv/models/fused_ops.h"

namespace curv {

ParameterDraw::ParameterDraw(const ModelInit& init)
    : init_(init), generator_(at::make_generator<at::CPUGeneratorImpl>(init.seed)) {}

at::Tensor ParameterDraw::normal(std::vector<int64_t> shape, double std) {
  const c10::Device device(init_.device);
  if (!init_.draw) return at::empty(shape, at::TensorOptions().dtype(init_.dtype).device(device));
  return at::normal(0.0, std, shape, generator_, at::TensorOptions().dtype(at::kDouble))
      .to(device, init_.dtype);
}

at::Tensor ParameterDraw::filled(std::vector<int64_t> shape, double value) {
  const c10::Device device(init_.device);
  if (!init_.draw) return at::empty(shape, at::TensorOptions().dtype(init_.dtype).device(device));
  return at::full(shape, value, at::TensorOptions().dtype(at::kDouble)).to(device, init_.dtype);
}

void check_token_batch(const Batch& batch, const char* arch, int64_t vocab, int64_t context,
                       const char* context_key) {
  const auto& x = batch.inputs;
  if (x.dim() != 2 || x.scalar_type() != at::kLong) {
    throw ModelError(
        fmt::format("{}: inputs must be int64 tokens of shape (batch, T); got {} of shape {}", arch,
                    x.scalar_type(), x.sizes()));
  }
  if (!batch.targets.sizes().equals(x.sizes()) || batch.targets.scalar_type() != at::kLong) {
    throw ModelError(
        fmt::format("{}: targets must be int64 of the inputs' shape {}; got {} of shape {}", arch,
                    x.sizes(), batch.targets.scalar_type(), batch.targets.sizes()));
  }
  if (x.size(1) > context) {
    throw ModelError(
        fmt::format("{}: sequence length {} exceeds {} {}", arch, x.size(1), context_key, context));
  }
  const int64_t lo = x.min().item<int64_t>(), hi = x.max().item<int64_t>();
  if (lo < 0 || hi >= vocab) {
    throw ModelError(fmt::format("{}: token ids span [{}, {}], outside the vocabulary [0, {})",
                                 arch, lo, hi, vocab));
  }
}

namespace {

// loss · scale, the loss itself when scale is 1.
at::Tensor scaled_loss(const at::Tensor& loss, double scale) {
  return scale == 1.0 ? loss : loss * scale;
}

}  // namespace

at::Tensor CausalLanguageModel::loss(const Batch& batch) {
  check(batch);
  return scaled_loss(mean_cross_entropy(forward(batch.inputs), batch.targets), loss_scale());
}

at::Tensor CausalLanguageModel::token_losses(const Batch& batch) {
  check(batch);
  return scaled_loss(token_cross_entropy(forward(batch.inputs), batch.targets), loss_scale());
}

at::Tensor CausalLanguageModel::logits(const Batch& batch) {
  check(batch);
  return forward(batch.inputs);
}

at::Tensor CausalLanguageModel::forward(const at::Tensor& tokens) const {
  at::Tensor x = embed(tokens);
  for (size_t i = 0; i < num_layers(); ++i) x = layer(i, x);
  return head(x);
}

at::Tensor CausalLanguageModel::loss_stage(size_t stage, const at::Tensor& x, const Batch& batch) {
  const size_t layers = num_layers();
  if (stage == 0) {
    check(batch);
    return embed(batch.inputs);
  }
  if (stage <= layers) return layer(stage - 1, x);
  if (stage == layers + 1) {
    return scaled_loss(mean_cross_entropy(head(x), batch.targets), loss_scale());
  }
  throw ModelError(fmt::format("{}: loss stage {} of {}", describe(), stage, layers + 2));
}

at::Tensor CausalLanguageModel::token_head(const at::Tensor& normed, size_t embedding, size_t head,
                                           bool tied) const {
  return tied ? at::linear(normed, p(embedding)) : linear_map(normed, head);
}

void RmsNormDecoder::add_embedding(int64_t vocab, int64_t hidden) {
  embed_ = add_token_embedding(vocab, hidden);
}

void RmsNormDecoder::add_final_norm_and_head(int64_t vocab, int64_t hidden) {
  norm_ = add_gain("model.norm", hidden);
  head_ = add_untied_head(vocab, hidden, tied_);
}

at::Tensor RmsNormDecoder::embed(const at::Tensor& tokens) const {
  return at::embedding(p(embed_), tokens, pad_token_id_);
}

at::Tensor RmsNormDecoder::head(const at::Tensor& x) const {
  return token_head(norm(x, norm_), embed_, head_, tied_);
}

at::Tensor CausalLanguageModel::linear(const at::Tensor& x, const Linear& l) const {
  return linear_map(x, l.weight, l.bias ? l.weight + 1 : LinearUse::kNoBias);
}

size_t CausalLanguageModel::add_param(const std::string& name, at::Tensor value, ParamRole role,
                                      std::vector<RowSlice> slices) {
  const size_t index = params_.size();
  add(name, std::move(value));
  roles_.push_back({role, layer_, std::move(slices), false, expert_});
  return index;
}

CausalLanguageModel::Linear CausalLanguageModel::add_linear(const std::string& name, int64_t out,
                                                            int64_t in, bool bias, ParamRole role,
                                                            const std::vector<RowSlice>& slices) {
  const size_t index = add_param(name + ".weight", draw_.normal({out, in}), role, slices);
  if (bias) add_param(name + ".bias", draw_.filled({out}, 0.0), role, slices);
  return Linear{index, bias};
}

size_t CausalLanguageModel::add_gain(const std::string& name, int64_t size, double value) {
  return add_param(name + ".weight", draw_.filled({size}, value), ParamRole::kNormGain);
}

size_t CausalLanguageModel::add_token_embedding(int64_t vocab, int64_t hidden) {
  return add_param("model.embed_tokens.weight", draw_.normal({vocab, hidden}),
                   ParamRole::kTokenEmbedding);
}

size_t CausalLanguageModel::add_untied_head(int64_t vocab, int64_t hidden, bool tied) {
  if (tied) return 0;
  return add_param("lm_head.weight", draw_.normal({vocab, hidden}), ParamRole::kOutputHead);
}

ModelStructure CausalLanguageModel::decoder_structure(int64_t n_head, int64_t n_kv_head,
                                                      int64_t head_dim, bool tied) const {
  ModelStructure s = heads_structure(n_head, n_kv_head, head_dim);
  if (tied) s.tied.emplace_back("lm_head.weight", "model.embed_tokens.weight");
  return s;
}

ModelStructure CausalLanguageModel::heads_structure(int64_t n_head, int64_t n_kv_head,
                                                    int64_t head_dim) const {
  ModelStructure s;
  s.params = roles_;
  s.n_head = n_head;
  s.n_kv_head = n_kv_head;
  s.head_dim = head_dim;
  return s;
}

at::Tensor token_cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  const int64_t classes = logits.size(-1);
  const at::Tensor z = is_16_bit(logits.scalar_type()) ? logits.to(at::kFloat) : logits;
  return at::nll_loss(at::log_softmax(z.reshape({-1, classes}), -1), targets.reshape({-1}), {},
                      at::Reduction::None)
      .reshape(targets.sizes());
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& gain, double eps) {
  if (is_16_bit(x.scalar_type())) {
    // As transformers runs a 16-bit model: normalised in float32, rounded, then scaled.
    const at::Tensor normed =
        fused_rms_norm(x.to(at::kFloat), at::Tensor(), eps).to(x.scalar_type());
    return gain.defined() ? gain * normed : normed;
  }
  return fused_rms_norm(x, gain, eps);
}

at::Tensor rotary_inverse_frequencies(double theta, int64_t dims, const at::TensorOptions& f64) {
  return at::pow(theta, at::arange(0, dims, 2, f64) / static_cast<double>(dims)).reciprocal();
}

RotaryTable rotary_table(const at::Tensor& inverse_frequencies, int64_t T, at::ScalarType dtype) {
  const auto f64 = inverse_frequencies.options();
  auto angles = at::outer(at::arange(T, f64), inverse_frequencies);
  auto emb = at::cat({angles, angles}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype), emb.size(-1)};
}

RotaryTable layer_rotary_table(const at::Tensor& x, double theta, int64_t dims, double factor) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(x.device());
  const at::Tensor inv = rotary_inverse_frequencies(theta, dims, f64);
  return rotary_table(factor == 1.0 ? inv : inv / factor, x.size(1), x.scalar_type());
}

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTable& t) {
  const int64_t D = x.size(-1);
  if (t.dims == D) return fused_rotary(x, t.cos, t.sin);
  return at::cat(
      {fused_rotary(x.narrow(-1, 0, t.dims), t.cos, t.sin), x.narrow(-1, t.dims, D - t.dims)}, -1);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale) {
  AttentionScores scores;
  scores.scale = scale;
  return causal_attention(q, k, v, scores);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionScores& scores) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t KV = k.size(1), group = H / KV;
  auto repeat = [&](const at::Tensor& t) {
    return group == 1 ? t : t.unsqueeze(2).expand({B, KV, group, T, D}).reshape({B, H, T, D});
  };
  auto s = batched_matmul(q, repeat(k).transpose(-2, -1));
  double scale = scores.scale;
  if (scores.softcap > 0) {
    s = at::tanh(s * (scale / scores.softcap)) * scores.softcap;
    scale = 1.0;
  }
  if (scores.window > 0 && scores.window < T) {
    // −inf where the key is `window` or more positions before the query; causal_softmax masks
    // the keys after it.
    const auto positions = at::arange(T, at::TensorOptions().dtype(at::kLong).device(q.device()));
    const auto too_old = positions.unsqueeze(1) - positions.unsqueeze(0) >= scores.window;
    s = s.masked_fill(too_old, -std::numeric_limits<double>::infinity());
  }
  // A 16-bit model's attention probabilities in float32, rounded after (as transformers does).
  auto att = is_16_bit(s.scalar_type())
                 ? causal_softmax(s.to(at::kFloat), scale).to(s.scalar_type())
                 : causal_softmax(s, scale);
  return batched_matmul(att, repeat(v)).transpose(1, 2).reshape({B, T, H * D});
}

}  // namespace curv
