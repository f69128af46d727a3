// Reading Hugging Face config.json files strictly: a key the architecture neither maps nor knows
// to be inert is an error, so a model whose forward pass we would get wrong is never read.

#include <fmt/format.h>

#include "models/architecture.h"

namespace curv {

namespace {

// Keys every PretrainedConfig may carry that do not change the eval-mode forward pass of a
// causal language model (generation settings, token ids, labels, bookkeeping, dropout).
constexpr const char* kInertKeys[] = {"_name_or_path",
                                      "architectures",
                                      "model_type",
                                      "torch_dtype",
                                      "dtype",
                                      "transformers_version",
                                      "bos_token_id",
                                      "eos_token_id",
                                      "pad_token_id",
                                      "sep_token_id",
                                      "decoder_start_token_id",
                                      "initializer_range",
                                      "use_cache",
                                      "return_dict",
                                      "output_hidden_states",
                                      "output_attentions",
                                      "torchscript",
                                      "use_bfloat16",
                                      "tie_encoder_decoder",
                                      "is_decoder",
                                      "is_encoder_decoder",
                                      "add_cross_attention",
                                      "cross_attention_hidden_size",
                                      "pruned_heads",
                                      "chunk_size_feed_forward",
                                      "id2label",
                                      "label2id",
                                      "problem_type",
                                      "tokenizer_class",
                                      "prefix",
                                      "task_specific_params",
                                      "finetuning_task",
                                      "max_length",
                                      "min_length",
                                      "do_sample",
                                      "early_stopping",
                                      "num_beams",
                                      "num_beam_groups",
                                      "diversity_penalty",
                                      "temperature",
                                      "top_k",
                                      "top_p",
                                      "typical_p",
                                      "repetition_penalty",
                                      "length_penalty",
                                      "no_repeat_ngram_size",
                                      "encoder_no_repeat_ngram_size",
                                      "bad_words_ids",
                                      "num_return_sequences",
                                      "output_scores",
                                      "return_dict_in_generate",
                                      "forced_bos_token_id",
                                      "forced_eos_token_id",
                                      "remove_invalid_values",
                                      "exponential_decay_length_penalty",
                                      "suppress_tokens",
                                      "begin_suppress_tokens",
                                      "tf_legacy_loss",
                                      "_attn_implementation_autoset",
                                      "attn_implementation",
                                      "_attn_implementation",
                                      "gradient_checkpointing",
                                      "quantization_config"};

}  // namespace

HfConfigReader::HfConfigReader(const nlohmann::json& config, std::string origin, bool inert)
    : config_(config), origin_(std::move(origin)) {
  if (!inert) return;
  for (const char* key : kInertKeys) taken_.insert(key);
}

const nlohmann::json* HfConfigReader::find(const std::string& key) {
  taken_.insert(key);
  auto it = config_.find(key);
  if (it == config_.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t HfConfigReader::integer(const std::string& key, int64_t fallback) {
  const nlohmann::json* v = find(key);
  if (!v) return fallback;
  if (!v->is_number_integer()) {
    throw FormatError(
        fmt::format("{}: \"{}\" is {}, expected an integer", origin_, key, v->dump()));
  }
  return v->get<int64_t>();
}

double HfConfigReader::number(const std::string& key, double fallback) {
  const nlohmann::json* v = find(key);
  if (!v) return fallback;
  if (!v->is_number()) {
    throw FormatError(fmt::format("{}: \"{}\" is {}, expected a number", origin_, key, v->dump()));
  }
  return v->get<double>();
}

bool HfConfigReader::boolean(const std::string& key, bool fallback) {
  const nlohmann::json* v = find(key);
  if (!v) return fallback;
  if (!v->is_boolean()) {
    throw FormatError(
        fmt::format("{}: \"{}\" is {}, expected true or false", origin_, key, v->dump()));
  }
  return v->get<bool>();
}

std::string HfConfigReader::text(const std::string& key, const std::string& fallback) {
  const nlohmann::json* v = find(key);
  if (!v) return fallback;
  if (!v->is_string()) {
    throw FormatError(fmt::format("{}: \"{}\" is {}, expected a string", origin_, key, v->dump()));
  }
  return v->get<std::string>();
}

void HfConfigReader::unsupported(const std::string& key, const std::string& why) const {
  auto it = config_.find(key);
  throw FormatError(fmt::format("{}: \"{}\" = {} is not supported: {}", origin_, key,
                                it == config_.end() ? "(absent)" : it->dump(), why));
}

void HfConfigReader::ignore(std::initializer_list<const char*> keys) {
  for (const char* key : keys) taken_.insert(key);
}

void HfConfigReader::finish() const {
  for (const auto& item : config_.items()) {
    if (!taken_.count(item.key())) {
      throw FormatError(fmt::format(
          "{}: field \"{}\" = {} is not supported (it may change the model's forward pass; "
          "libcurv reads only the fields listed in docs/checkpoints.md)",
          origin_, item.key(), item.value().dump()));
    }
  }
}

void read_default_rope(HfConfigReader& r, const char* family, double& theta, double* partial) {
  theta = r.number("rope_theta", theta);
  if (partial) *partial = r.number("partial_rotary_factor", *partial);
  if (r.find("rope_scaling")) r.unsupported("rope_scaling", "no rotary scaling is built in");
  const nlohmann::json* rope = r.find("rope_parameters");
  if (!rope) return;
  if (!rope->is_object()) r.unsupported("rope_parameters", "expected an object");
  HfConfigReader p(*rope, fmt::format("{}: \"rope_parameters\"", r.origin()), false);
  theta = p.number("rope_theta", theta);
  if (partial) *partial = p.number("partial_rotary_factor", *partial);
  if (p.text("rope_type", "default") != "default") {
    p.unsupported("rope_type", fmt::format("{}'s rotary type built in is default", family));
  }
  p.finish();
}

}  // namespace curv
