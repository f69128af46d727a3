// The built-in LLaMA family: Hugging Face's LlamaForCausalLM, MistralForCausalLM and
// Qwen2ForCausalLM forward pass on plain ATen calls (twice differentiable everywhere), with HF's
// parameter names and order, read from the config.json that HF saves beside the weights.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/fmt_torch.h"
#include "curv/models/fused_ops.h"
#include "models/architecture.h"

namespace curv {

namespace {

class Llama : public FunctionalModel {
 public:
  Llama(const LlamaConfig& c, const ModelInit& init) : c_(c) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(init.seed);
    auto opts = at::TensorOptions().dtype(at::kDouble);
    // Drawn in float64 on the CPU from one generator (the same model in every dtype and on every
    // device), as HF's _init_weights: normal(0, 0.02) weights, zero biases, unit norm gains.
    auto normal = [&](std::vector<int64_t> shape) {
      return at::normal(0.0, 0.02, shape, gen, opts).to(c10::Device(init.device), init.dtype);
    };
    auto filled = [&](std::vector<int64_t> shape, double value) {
      return at::full(shape, value, opts).to(c10::Device(init.device), init.dtype);
    };
    const int64_t C = c.hidden_size, D = c.head_size(), H = c.num_attention_heads;
    const int64_t KV = c.kv_heads(), F = c.intermediate_size;
    int64_t layer_index = -1;
    auto add_param = [&](const std::string& name, at::Tensor value, ParamRole role) {
      const size_t index = params_.size();
      add(name, std::move(value));
      roles_.push_back({role, layer_index, {}});
      return index;
    };
    // A projection (HF's nn.Linear) and, when it has one, its bias directly after it.
    auto add_linear = [&](const std::string& name, int64_t out, int64_t in, bool bias,
                          ParamRole role) {
      const size_t index = add_param(name + ".weight", normal({out, in}), role);
      if (bias) add_param(name + ".bias", filled({out}, 0.0), role);
      return Linear{index, bias};
    };
    embed_ = add_param("model.embed_tokens.weight", normal({c.vocab_size, C}),
                       ParamRole::kTokenEmbedding);
    // HF's named_parameters order: self_attn (q, k, v, o), mlp (gate, up, down), then the norms.
    const bool qkv_bias = c.attention_bias || c.qkv_bias;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string h = fmt::format("model.layers.{}.", l);
      layer_index = l;
      Layer layer;
      layer.q = add_linear(h + "self_attn.q_proj", H * D, C, qkv_bias, ParamRole::kAttentionQuery);
      layer.k = add_linear(h + "self_attn.k_proj", KV * D, C, qkv_bias, ParamRole::kAttentionKey);
      layer.v = add_linear(h + "self_attn.v_proj", KV * D, C, qkv_bias, ParamRole::kAttentionValue);
      layer.o = add_linear(h + "self_attn.o_proj", C, H * D, c.attention_bias,
                           ParamRole::kAttentionOutput);
      layer.gate = add_linear(h + "mlp.gate_proj", F, C, c.mlp_bias, ParamRole::kMlpGate);
      layer.up = add_linear(h + "mlp.up_proj", F, C, c.mlp_bias, ParamRole::kMlpInput);
      layer.down = add_linear(h + "mlp.down_proj", C, F, c.mlp_bias, ParamRole::kMlpOutput);
      layer.input_norm =
          add_param(h + "input_layernorm.weight", filled({C}, 1.0), ParamRole::kNormGain);
      layer.post_norm =
          add_param(h + "post_attention_layernorm.weight", filled({C}, 1.0), ParamRole::kNormGain);
      layers_.push_back(layer);
    }
    layer_index = -1;
    norm_ = add_param("model.norm.weight", filled({C}, 1.0), ParamRole::kNormGain);
    if (!c.tie_word_embeddings) {
      head_ = add_param("lm_head.weight", normal({c.vocab_size, C}), ParamRole::kOutputHead);
    }
    finish();
  }

  ModelStructure structure() const override {
    ModelStructure s;
    s.params = roles_;
    s.n_head = c_.num_attention_heads;
    s.n_kv_head = c_.kv_heads();
    s.head_dim = c_.head_size();
    if (c_.tie_word_embeddings) s.tied.emplace_back("lm_head.weight", "model.embed_tokens.weight");
    return s;
  }

  at::Tensor loss(const Batch& batch) override {
    check(batch);
    return mean_cross_entropy(forward(batch.inputs), batch.targets);
  }

  at::Tensor token_losses(const Batch& batch) override {
    check(batch);
    auto l = forward(batch.inputs);
    const int64_t classes = l.size(-1);
    return at::nll_loss(at::log_softmax(l.reshape({-1, classes}), -1), batch.targets.reshape({-1}),
                        {}, at::Reduction::None)
        .reshape(batch.targets.sizes());
  }

  at::Tensor logits(const Batch& batch) override {
    check(batch);
    return forward(batch.inputs);
  }

  std::string describe() const override { return ModelConfig("llama", c_).describe(); }

 private:
  struct Linear {
    size_t weight = 0;
    bool bias = false;
  };
  struct Layer {
    Linear q, k, v, o, gate, up, down;
    size_t input_norm = 0, post_norm = 0;
  };

  at::Tensor linear(const at::Tensor& x, const Linear& l) const {
    return at::linear(x, p(l.weight), l.bias ? p(l.weight + 1) : at::Tensor());
  }

  // HF's LlamaRMSNorm: x / sqrt(mean(x²) + eps), times the gain. HF computes the normalisation in
  // float32 whatever the model's dtype; here it runs in the model's dtype, so float64 is exact.
  at::Tensor rms_norm(const at::Tensor& x, size_t gain) const {
    return p(gain) * (x * at::rsqrt(x.pow(2).mean(-1, true) + c_.rms_norm_eps));
  }

  // Rotary embeddings as HF applies them: the two halves of each head are rotated together
  // (rotate_half), angle t · θ^(−2i/d) for position t and frequency i < d/2. The angles are
  // computed in float64 and then cast to the model's dtype.
  static at::Tensor rotate_half(const at::Tensor& x) {
    const int64_t half = x.size(-1) / 2;
    return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  }

  void check(const Batch& batch) const {
    const auto& x = batch.inputs;
    if (x.dim() != 2 || x.scalar_type() != at::kLong) {
      throw ModelError(
          fmt::format("llama: inputs must be int64 tokens of shape (batch, T); got {} of shape {}",
                      x.scalar_type(), x.sizes()));
    }
    if (!batch.targets.sizes().equals(x.sizes()) || batch.targets.scalar_type() != at::kLong) {
      throw ModelError(
          fmt::format("llama: targets must be int64 of the inputs' shape {}; got {} of shape {}",
                      x.sizes(), batch.targets.scalar_type(), batch.targets.sizes()));
    }
    const int64_t T = x.size(1);
    if (T > c_.max_position_embeddings) {
      throw ModelError(fmt::format("llama: sequence length {} exceeds max_position_embeddings {}",
                                   T, c_.max_position_embeddings));
    }
    if (c_.sliding_window > 0 && T > c_.sliding_window) {
      throw ModelError(fmt::format(
          "llama: sequence length {} exceeds the sliding window {}; windowed attention is not "
          "built in, so probe with sequences of at most {} tokens",
          T, c_.sliding_window, c_.sliding_window));
    }
    const int64_t lo = x.min().item<int64_t>(), hi = x.max().item<int64_t>();
    if (lo < 0 || hi >= c_.vocab_size) {
      throw ModelError(fmt::format("llama: token ids span [{}, {}], outside the vocabulary [0, {})",
                                   lo, hi, c_.vocab_size));
    }
  }

  at::Tensor forward(const at::Tensor& tokens) const {
    const int64_t B = tokens.size(0), T = tokens.size(1);
    const int64_t H = c_.num_attention_heads, KV = c_.kv_heads(), D = c_.head_size();
    const int64_t group = H / KV;
    auto x = at::embedding(p(embed_), tokens);
    const auto f64 = at::TensorOptions().dtype(at::kDouble).device(x.device());
    auto inv_freq =
        at::pow(c_.rope_theta, at::arange(0, D, 2, f64) / static_cast<double>(D)).reciprocal();
    auto angles = at::outer(at::arange(T, f64), inv_freq);
    auto emb = at::cat({angles, angles}, -1);
    const auto cos = emb.cos().to(x.scalar_type()), sin = emb.sin().to(x.scalar_type());
    auto rope = [&](const at::Tensor& t) { return t * cos + rotate_half(t) * sin; };
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    for (const auto& l : layers_) {
      auto h = rms_norm(x, l.input_norm);
      auto q = rope(linear(h, l.q).view({B, T, H, D}).transpose(1, 2));
      auto k = rope(linear(h, l.k).view({B, T, KV, D}).transpose(1, 2));
      auto v = linear(h, l.v).view({B, T, KV, D}).transpose(1, 2);
      // Grouped-query attention: query head j reads key/value head j / group (HF's repeat_kv).
      auto repeat = [&](const at::Tensor& t) {
        return group == 1 ? t : t.unsqueeze(2).expand({B, KV, group, T, D}).reshape({B, H, T, D});
      };
      auto att = causal_softmax(at::matmul(q, repeat(k).transpose(-2, -1)), scale);
      auto y = at::matmul(att, repeat(v)).transpose(1, 2).reshape({B, T, H * D});
      x = x + linear(y, l.o);
      h = rms_norm(x, l.post_norm);
      x = x + linear(at::silu(linear(h, l.gate)) * linear(h, l.up), l.down);
    }
    x = rms_norm(x, norm_);
    return at::linear(x, c_.tie_word_embeddings ? p(embed_) : p(head_));
  }

  LlamaConfig c_;
  std::vector<ParamStructure> roles_;
  std::vector<Layer> layers_;
  size_t embed_ = 0, norm_ = 0, head_ = 0;
};

class LlamaArchitecture : public TypedArchitecture<LlamaConfig> {
 public:
  std::string name() const override { return "llama"; }
  std::vector<std::string> keys() const override {
    return {"vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
            "rms_norm_eps",
            "rope_theta",
            "tie_word_embeddings",
            "attention_bias",
            "qkv_bias",
            "mlp_bias",
            "sliding_window"};
  }
  LlamaConfig from_json(const nlohmann::json& j, const std::string&) const override {
    LlamaConfig c;
    c.vocab_size = j.value("vocab_size", c.vocab_size);
    c.hidden_size = j.value("hidden_size", c.hidden_size);
    c.intermediate_size = j.value("intermediate_size", c.intermediate_size);
    c.num_hidden_layers = j.value("num_hidden_layers", c.num_hidden_layers);
    c.num_attention_heads = j.value("num_attention_heads", c.num_attention_heads);
    c.num_key_value_heads = j.value("num_key_value_heads", c.num_key_value_heads);
    c.head_dim = j.value("head_dim", c.head_dim);
    c.max_position_embeddings = j.value("max_position_embeddings", c.max_position_embeddings);
    c.rms_norm_eps = j.value("rms_norm_eps", c.rms_norm_eps);
    c.rope_theta = j.value("rope_theta", c.rope_theta);
    c.tie_word_embeddings = j.value("tie_word_embeddings", c.tie_word_embeddings);
    c.attention_bias = j.value("attention_bias", c.attention_bias);
    c.qkv_bias = j.value("qkv_bias", c.qkv_bias);
    c.mlp_bias = j.value("mlp_bias", c.mlp_bias);
    c.sliding_window = j.value("sliding_window", c.sliding_window);
    return c;
  }
  nlohmann::json to_json_object(const LlamaConfig& c) const override {
    return {{"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.kv_heads()},
            {"head_dim", c.head_size()},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"attention_bias", c.attention_bias},
            {"qkv_bias", c.qkv_bias},
            {"mlp_bias", c.mlp_bias},
            {"sliding_window", c.sliding_window}};
  }
  void validate_config(const LlamaConfig& c) const override {
    auto positive = [](const char* field, double value) {
      if (!(value > 0)) {
        throw InvalidArgument(fmt::format("model config: {} = {} must be > 0", field, value));
      }
    };
    positive("vocab_size", c.vocab_size);
    positive("hidden_size", c.hidden_size);
    positive("intermediate_size", c.intermediate_size);
    positive("num_hidden_layers", c.num_hidden_layers);
    positive("num_attention_heads", c.num_attention_heads);
    positive("max_position_embeddings", c.max_position_embeddings);
    positive("rms_norm_eps", c.rms_norm_eps);
    positive("rope_theta", c.rope_theta);
    if (c.num_key_value_heads < 0 || c.head_dim < 0 || c.sliding_window < 0) {
      throw InvalidArgument(fmt::format(
          "model config: num_key_value_heads = {}, head_dim = {} and sliding_window = {} must "
          "be >= 0",
          c.num_key_value_heads, c.head_dim, c.sliding_window));
    }
    if (c.num_attention_heads % c.kv_heads() != 0) {
      throw InvalidArgument(fmt::format(
          "model config: num_key_value_heads = {} does not divide num_attention_heads = {}",
          c.kv_heads(), c.num_attention_heads));
    }
    if (c.head_dim == 0 && c.hidden_size % c.num_attention_heads != 0) {
      throw InvalidArgument(
          fmt::format("model config: hidden_size = {} is not divisible by num_attention_heads = {} "
                      "(give head_dim)",
                      c.hidden_size, c.num_attention_heads));
    }
    if (c.head_size() % 2 != 0) {
      throw InvalidArgument(
          fmt::format("model config: head_dim = {} must be even (rotary embeddings rotate pairs)",
                      c.head_size()));
    }
  }
  std::string describe_config(const LlamaConfig& c) const override {
    return fmt::format(
        "llama(layers={}, hidden={}, heads={}, kv_heads={}, head_dim={}, intermediate={}, "
        "vocab={}, context={}, tied={}{}{})",
        c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.kv_heads(), c.head_size(),
        c.intermediate_size, c.vocab_size, c.max_position_embeddings, c.tie_word_embeddings,
        c.attention_bias ? ", attention_bias"
        : c.qkv_bias     ? ", qkv_bias"
                         : "",
        c.mlp_bias ? ", mlp_bias" : "");
  }
  std::unique_ptr<Objective> build(const LlamaConfig& c, const ModelInit& init) const override {
    return std::make_unique<Llama>(c, init);
  }
  ModelData data_of(const LlamaConfig& c) const override {
    ModelData d;
    d.kind = ModelData::Kind::kTokens;
    d.vocab_size = c.vocab_size;
    d.context = c.sliding_window > 0 ? std::min(c.sliding_window, c.max_position_embeddings)
                                     : c.max_position_embeddings;
    return d;
  }

  std::vector<std::string> hf_model_types() const override { return {"llama", "mistral", "qwen2"}; }

  std::any parse_hf(const std::string& json, const std::string& origin) const override {
    const auto j = nlohmann::json::parse(json);
    HfConfigReader r(j, origin);
    const std::string type = r.text("model_type", "");
    LlamaConfig c;
    c.vocab_size = r.integer("vocab_size", 32000);
    c.hidden_size = r.integer("hidden_size", 4096);
    c.intermediate_size = r.integer("intermediate_size", 11008);
    c.num_hidden_layers = r.integer("num_hidden_layers", 32);
    c.num_attention_heads = r.integer("num_attention_heads", 32);
    c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads);
    c.head_dim = r.integer("head_dim", 0);
    c.max_position_embeddings = r.integer("max_position_embeddings", 2048);
    c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
    c.rope_theta = r.number("rope_theta", 10000.0);
    c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
    if (type == "qwen2") {
      c.qkv_bias = true;  // Qwen2Attention: q, k, v with biases, o without
    } else {
      c.attention_bias = r.boolean("attention_bias", false);
      c.mlp_bias = r.boolean("mlp_bias", false);
    }
    const std::string act = r.text("hidden_act", "silu");
    if (act != "silu") r.unsupported("hidden_act", "the LLaMA family's MLP is SwiGLU (silu)");
    if (const nlohmann::json* scaling = r.find("rope_scaling")) {
      const bool plain = scaling->is_object() && scaling->size() == 1 &&
                         scaling->value("rope_type", std::string()) == "default";
      if (!plain) r.unsupported("rope_scaling", "only unscaled rotary embeddings are built in");
    }
    if (r.integer("pretraining_tp", 1) < 1) {
      r.unsupported("pretraining_tp", "must be >= 1 (it only splits HF's matmuls)");
    }
    // Sliding-window attention: Mistral applies it to every layer when set; Qwen2 only with
    // use_sliding_window, from layer max_window_layers on.
    const nlohmann::json* window = r.find("sliding_window");
    if (type == "qwen2") {
      const bool use = r.boolean("use_sliding_window", false);
      const int64_t from_layer = r.integer("max_window_layers", c.num_hidden_layers);
      if (use && window && from_layer < c.num_hidden_layers) {
        c.sliding_window = r.integer("sliding_window", 0);
      }
    } else if (window) {
      c.sliding_window = r.integer("sliding_window", 0);
    }
    if (r.find("num_experts") || r.find("num_local_experts")) {
      r.unsupported(r.find("num_experts") ? "num_experts" : "num_local_experts",
                    "mixture-of-experts models are not built in");
    }
    // Dropout does nothing in eval mode, where curvature is measured.
    r.ignore({"attention_dropout", "hidden_dropout", "embd_pdrop", "resid_pdrop"});
    r.finish();
    return c;
  }
};

}  // namespace

std::shared_ptr<const Architecture> llama_architecture() {
  return std::make_shared<LlamaArchitecture>();
}

}  // namespace curv
