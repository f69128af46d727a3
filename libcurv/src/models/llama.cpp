// The built-in LLaMA family: Hugging Face's LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM and Qwen3ForCausalLM forward pass on plain ATen calls (twice differentiable
// everywhere), with HF's parameter names and order, read from the config.json that HF saves beside
// the weights.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/fmt_torch.h"
#include "models/architecture.h"
#include "models/config_schema.h"
#include "models/transformer_parts.h"

namespace curv {

namespace {

class Llama : public RmsNormDecoder {
 public:
  Llama(const LlamaConfig& c, const ModelInit& init)
      : RmsNormDecoder(init, c.pad_token_id, c.rms_norm_eps, c.tie_word_embeddings), c_(c) {
    const int64_t C = c.hidden_size, D = c.head_size(), H = c.num_attention_heads;
    const int64_t KV = c.kv_heads(), F = c.intermediate_size;
    add_embedding(c.vocab_size, C);
    // HF's named_parameters order: self_attn (q, k, v, o), mlp (gate, up, down), then the norms.
    const bool qkv_bias = c.attention_bias || c.qkv_bias;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string h = fmt::format("model.layers.{}.", l);
      layer_ = l;
      Layer layer;
      layer.q = add_linear(h + "self_attn.q_proj", H * D, C, qkv_bias, ParamRole::kAttentionQuery);
      layer.k = add_linear(h + "self_attn.k_proj", KV * D, C, qkv_bias, ParamRole::kAttentionKey);
      layer.v = add_linear(h + "self_attn.v_proj", KV * D, C, qkv_bias, ParamRole::kAttentionValue);
      layer.o = add_linear(h + "self_attn.o_proj", C, H * D, c.attention_bias,
                           ParamRole::kAttentionOutput);
      if (c.qk_norm) {
        layer.q_norm = add_gain(h + "self_attn.q_norm", D);
        layer.k_norm = add_gain(h + "self_attn.k_norm", D);
      }
      layer.gate = add_linear(h + "mlp.gate_proj", F, C, c.mlp_bias, ParamRole::kMlpGate);
      layer.up = add_linear(h + "mlp.up_proj", F, C, c.mlp_bias, ParamRole::kMlpInput);
      layer.down = add_linear(h + "mlp.down_proj", C, F, c.mlp_bias, ParamRole::kMlpOutput);
      layer.input_norm = add_gain(h + "input_layernorm", C);
      layer.post_norm = add_gain(h + "post_attention_layernorm", C);
      layers_.push_back(layer);
    }
    layer_ = -1;
    add_final_norm_and_head(c.vocab_size, C);
    finish();
  }

  ModelStructure structure() const override {
    return decoder_structure(c_.num_attention_heads, c_.kv_heads(), c_.head_size(),
                             c_.tie_word_embeddings);
  }

  std::string describe() const override { return ModelConfig("llama", c_).describe(); }

 private:
  struct Layer {
    Linear q, k, v, o, gate, up, down;
    size_t input_norm = 0, post_norm = 0;
    size_t q_norm = 0, k_norm = 0;  // Qwen3's per-head query and key norms
  };

  // One decoder layer: x plus attention, then plus the gated MLP.
  at::Tensor layer(size_t index, const at::Tensor& input) const override {
    const Layer& l = layers_[index];
    at::Tensor x = input;
    const int64_t B = x.size(0), T = x.size(1);
    const int64_t H = c_.num_attention_heads, KV = c_.kv_heads(), D = c_.head_size();
    // The rotary table again for each layer: a T × D table, next to nothing beside a layer.
    const auto f64 = at::TensorOptions().dtype(at::kDouble).device(x.device());
    const RotaryTable rope = rotary_table(inverse_frequencies(f64), T, x.scalar_type());
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    auto h = norm(x, l.input_norm);
    auto q = linear(h, l.q).view({B, T, H, D});
    auto k = linear(h, l.k).view({B, T, KV, D});
    if (c_.qk_norm) {
      q = norm(q, l.q_norm);
      k = norm(k, l.k_norm);
    }
    q = apply_rotary(q.transpose(1, 2), rope);
    k = apply_rotary(k.transpose(1, 2), rope);
    auto v = linear(h, l.v).view({B, T, KV, D}).transpose(1, 2);
    x = x + linear(causal_attention(q, k, v, scale), l.o);
    h = norm(x, l.post_norm);
    return x + linear(fused_gated_silu(linear(h, l.gate), linear(h, l.up)), l.down);
  }

  // The rotary inverse frequencies θ^(−2i/d) in float64, scaled as transformers' rope_init_fn of
  // the config's rope type (modeling_rope_utils.py; transformers computes them in float32).
  at::Tensor inverse_frequencies(const at::TensorOptions& f64) const {
    auto inv = rotary_inverse_frequencies(c_.rope_theta, c_.head_size(), f64);
    if (c_.rope_type == "linear") return inv / c_.rope_factor;
    if (c_.rope_type != "llama3") return inv;
    // Llama 3.1: wavelengths above original_context / low_freq_factor are divided by the factor,
    // those below original_context / high_freq_factor kept, and the band between interpolated.
    const double context = static_cast<double>(c_.rope_original_context);
    const double low = c_.rope_low_freq_factor, high = c_.rope_high_freq_factor;
    auto wavelength = (2.0 * M_PI) / inv;
    auto scaled = at::where(wavelength > context / low, inv / c_.rope_factor, inv);
    auto smooth = (context / wavelength - low) / (high - low);
    auto smoothed = (1.0 - smooth) * scaled / c_.rope_factor + smooth * scaled;
    auto band = (wavelength >= context / high).logical_and(wavelength <= context / low);
    return at::where(band, smoothed, scaled);
  }

  void check(const Batch& batch) const override {
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

  size_t num_layers() const override { return layers_.size(); }

  LlamaConfig c_;
  std::vector<Layer> layers_;
};

class LlamaArchitecture : public DeclaredConfigArchitecture<LlamaConfig> {
 public:
  std::string name() const override { return "llama"; }
  const ConfigFields<LlamaConfig>& fields() const override {
    using C = LlamaConfig;
    // qk_norm, the rotary scaling and pad_token_id are written only where they change the model,
    // so that configs of plain LLaMA models read (and compare, as --resume does) as before these
    // fields existed.
    using Written = bool (*)(const C&);
    const Written scaled = [](const C& c) { return c.rope_type != "default"; };
    const Written llama3 = [](const C& c) { return c.rope_type == "llama3"; };
    static const ConfigFields<C> fields = decoder_fields<C>(
        {{"num_key_value_heads", &C::num_key_value_heads, FieldBound::kNonNegative},
         {"head_dim", &C::head_dim, FieldBound::kNonNegative},
         {"rms_norm_eps", &C::rms_norm_eps, FieldBound::kPositive},
         {"rope_theta", &C::rope_theta, FieldBound::kPositive},
         {"tie_word_embeddings", &C::tie_word_embeddings},
         {"attention_bias", &C::attention_bias},
         {"qkv_bias", &C::qkv_bias},
         {"mlp_bias", &C::mlp_bias},
         {"sliding_window", &C::sliding_window, FieldBound::kNonNegative},
         {"qk_norm", &C::qk_norm, FieldBound::kAny, [](const C& c) { return c.qk_norm; }},
         {"rope_type", &C::rope_type, FieldBound::kAny, scaled},
         {"rope_factor", &C::rope_factor, FieldBound::kPositive, scaled},
         {"rope_low_freq_factor", &C::rope_low_freq_factor, FieldBound::kPositive, llama3},
         {"rope_high_freq_factor", &C::rope_high_freq_factor, FieldBound::kPositive, llama3},
         {"rope_original_context", &C::rope_original_context, FieldBound::kPositive, llama3},
         {"pad_token_id", &C::pad_token_id, FieldBound::kTokenId,
          [](const C& c) { return c.pad_token_id >= 0; }}});
    return fields;
  }
  // The written config states the head counts and sizes it derives.
  LlamaConfig written(const LlamaConfig& config) const override {
    LlamaConfig c = config;
    c.num_key_value_heads = c.kv_heads();
    c.head_dim = c.head_size();
    return c;
  }
  void check_relations(const LlamaConfig& c) const override {
    check_attention_heads(c.num_attention_heads, c.num_key_value_heads, c.hidden_size, c.head_dim,
                          true);
    if (c.rope_type != "default" && c.rope_type != "linear" && c.rope_type != "llama3") {
      throw InvalidArgument(
          fmt::format("model config: rope_type = \"{}\" is not built in (default, linear, llama3)",
                      c.rope_type));
    }
    if (c.rope_type == "llama3" && !(c.rope_high_freq_factor > c.rope_low_freq_factor)) {
      throw InvalidArgument(fmt::format(
          "model config: rope_high_freq_factor = {} must exceed rope_low_freq_factor = {}",
          c.rope_high_freq_factor, c.rope_low_freq_factor));
    }
  }
  std::string describe_config(const LlamaConfig& c) const override {
    return fmt::format(
        "llama(layers={}, hidden={}, heads={}, kv_heads={}, head_dim={}, intermediate={}, "
        "vocab={}, context={}, tied={}{}{}{}{})",
        c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.kv_heads(), c.head_size(),
        c.intermediate_size, c.vocab_size, c.max_position_embeddings, c.tie_word_embeddings,
        c.attention_bias ? ", attention_bias"
        : c.qkv_bias     ? ", qkv_bias"
                         : "",
        c.mlp_bias ? ", mlp_bias" : "", c.qk_norm ? ", qk_norm" : "",
        c.rope_type == "default" ? "" : fmt::format(", rope={} x{}", c.rope_type, c.rope_factor));
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

  std::vector<std::string> hf_model_types() const override {
    return {"llama", "mistral", "qwen2", "qwen3"};
  }

  // Reads config.json as transformers 4.40 to 5.x write it for these families
  // (docs/checkpoints.md#hugging-face-models).
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
    c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
    c.pad_token_id = r.integer("pad_token_id", -1);
    if (type == "qwen2") {
      c.qkv_bias = true;  // Qwen2Attention: q, k, v with biases, o without
    } else {
      c.attention_bias = r.boolean("attention_bias", false);
      c.mlp_bias = r.boolean("mlp_bias", false);
    }
    c.qk_norm = type == "qwen3";
    const std::string act = r.text("hidden_act", "silu");
    if (act != "silu") r.unsupported("hidden_act", "the LLaMA family's MLP is SwiGLU (silu)");
    read_rope(r, c);
    if (r.integer("pretraining_tp", 1) < 1) {
      r.unsupported("pretraining_tp", "must be >= 1 (it only splits HF's matmuls)");
    }
    read_attention_window(r, type, c);
    if (r.find("num_experts") || r.find("num_local_experts")) {
      r.unsupported(r.find("num_experts") ? "num_experts" : "num_local_experts",
                    "mixture-of-experts models are not built in");
    }
    // Dropout does nothing in eval mode, where curvature is measured.
    r.ignore({"attention_dropout", "hidden_dropout", "embd_pdrop", "resid_pdrop"});
    r.finish();
    return c;
  }

 private:
  // The rotary embedding: transformers 5's rope_parameters {rope_theta, rope_type, ...}, or 4.x's
  // top-level rope_theta beside an optional rope_scaling {rope_type (or type), factor, ...}.
  static void read_rope(HfConfigReader& r, LlamaConfig& c) {
    c.rope_theta = r.number("rope_theta", 10000.0);
    const char* key = r.find("rope_parameters") ? "rope_parameters" : "rope_scaling";
    const nlohmann::json* rope = r.find(key);
    if (r.find("rope_parameters") && r.find("rope_scaling")) {
      r.unsupported("rope_scaling", "rope_parameters is given too; a config has one of the two");
    }
    if (!rope) return;
    if (!rope->is_object()) r.unsupported(key, "expected an object");
    HfConfigReader p(*rope, fmt::format("{}: \"{}\"", r.origin(), key), /*inert=*/false);
    c.rope_theta = p.number("rope_theta", c.rope_theta);
    c.rope_type = p.text("rope_type", p.text("type", "default"));
    if (c.rope_type == "linear" || c.rope_type == "llama3") {
      c.rope_factor = p.number("factor", 1.0);
    }
    if (c.rope_type == "llama3") {
      c.rope_low_freq_factor = p.number("low_freq_factor", 1.0);
      c.rope_high_freq_factor = p.number("high_freq_factor", 4.0);
      c.rope_original_context =
          p.integer("original_max_position_embeddings", c.max_position_embeddings);
    } else if (c.rope_type != "default" && c.rope_type != "linear") {
      p.unsupported(p.find("rope_type") ? "rope_type" : "type",
                    "the rotary types built in are default, linear and llama3");
    }
    if (p.number("partial_rotary_factor", 1.0) != 1.0) {
      p.unsupported("partial_rotary_factor", "these families rotate the whole head");
    }
    p.finish();
  }

  // Sliding-window attention. transformers 5 lists every layer's kind in layer_types; 4.x has
  // Mistral apply sliding_window to every layer when set, and Qwen2/Qwen3 only with
  // use_sliding_window, from layer max_window_layers on. A windowed layer is read as plain causal
  // attention, with longer probe sequences refused (check()).
  static void read_attention_window(HfConfigReader& r, const std::string& type, LlamaConfig& c) {
    const bool qwen = type == "qwen2" || type == "qwen3";
    bool windowed = false;
    if (const nlohmann::json* kinds = r.find("layer_types")) {
      const bool listed =
          kinds->is_array() && static_cast<int64_t>(kinds->size()) == c.num_hidden_layers;
      if (!listed) r.unsupported("layer_types", "expected one entry per hidden layer");
      for (const auto& kind : *kinds) {
        if (kind == "sliding_attention") {
          windowed = true;
        } else if (kind != "full_attention") {
          r.unsupported("layer_types",
                        "the layer kinds built in are full_attention and "
                        "sliding_attention");
        }
      }
      // layer_types is what transformers 5 derives from these two: it decides.
      if (qwen) r.ignore({"use_sliding_window", "max_window_layers"});
    } else if (qwen) {
      const bool use = r.boolean("use_sliding_window", false);
      const int64_t from_layer = r.integer("max_window_layers", c.num_hidden_layers);
      windowed = use && from_layer < c.num_hidden_layers;
    } else {
      windowed = r.find("sliding_window") != nullptr;
    }
    if (!windowed) {
      r.ignore({"sliding_window"});
      return;
    }
    c.sliding_window = r.integer("sliding_window", 0);
    if (c.sliding_window <= 0) {
      r.unsupported("sliding_window", "sliding-window layers need a window of at least 1 token");
    }
  }
};

}  // namespace

std::shared_ptr<const Architecture> llama_architecture() {
  return std::make_shared<LlamaArchitecture>();
}

}  // namespace curv
