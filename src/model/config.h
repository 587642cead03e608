// LLaMA model configuration, with the field names of Hugging Face's LlamaConfig so
// that a config.json from the Hub loads as it is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace amsp::model {

struct LlamaConfig {
  std::string name = "custom";  // preset name or file it came from
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t kv_dim() const { return head_dim() * num_key_value_heads; }

  // Throws UsageError naming the first field that is missing or contradicts
  // another (heads not dividing hidden_size, kv heads not dividing heads, ...).
  void validate() const;

  // Parameters of the whole model (embedding, layers, final norm, untied head).
  int64_t num_parameters() const;
  int64_t num_parameters_per_layer() const;
};

// Names of the integer and floating-point fields, in the order they print.
const std::vector<std::string>& config_field_names();

// Loads a preset by name (inputs/models/NAME.json) or a JSON file by path. An
// unknown name lists the presets; unknown JSON keys are ignored, as in
// transformers, so that a Hub config.json loads.
LlamaConfig load_config(const std::string& name_or_path);

// Parses a Hugging Face config.json text; errors name `source`.
LlamaConfig config_from_json(const std::string& text, const std::string& source);

// Sets one field from text ("hidden_size", "256"); bad names and values throw
// UsageError naming the field.
void set_config_field(LlamaConfig& config, const std::string& field, const std::string& value);

// The config as a Hugging Face config.json object (model_type "llama").
std::string config_to_json(const LlamaConfig& config);

// Directory holding models/, clusters/ and corpus/: $AMSP_INPUTS, else the
// source tree's inputs/ (compiled in).
std::string inputs_dir();

// Preset names found in inputs/models, sorted.
std::vector<std::string> preset_names();

}  // namespace amsp::model
