#include "model/config.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/parse.h"

namespace amsp::model {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct IntField {
  const char* name;
  int64_t LlamaConfig::*member;
};
struct RealField {
  const char* name;
  double LlamaConfig::*member;
};

constexpr IntField kIntFields[] = {
    {"hidden_size", &LlamaConfig::hidden_size},
    {"intermediate_size", &LlamaConfig::intermediate_size},
    {"num_hidden_layers", &LlamaConfig::num_hidden_layers},
    {"num_attention_heads", &LlamaConfig::num_attention_heads},
    {"num_key_value_heads", &LlamaConfig::num_key_value_heads},
    {"vocab_size", &LlamaConfig::vocab_size},
    {"max_position_embeddings", &LlamaConfig::max_position_embeddings},
};
constexpr RealField kRealFields[] = {
    {"rms_norm_eps", &LlamaConfig::rms_norm_eps},
    {"rope_theta", &LlamaConfig::rope_theta},
};

}  // namespace

const std::vector<std::string>& config_field_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& f : kIntFields) v.push_back(f.name);
    for (const auto& f : kRealFields) v.push_back(f.name);
    return v;
  }();
  return names;
}

void LlamaConfig::validate() const {
  for (const auto& f : kIntFields) {
    if (this->*f.member <= 0)
      fail_usage("model field ", f.name, " = ", this->*f.member, ": expected a positive integer");
  }
  if (!(rms_norm_eps > 0)) fail_usage("model field rms_norm_eps = ", rms_norm_eps, ": expected > 0");
  if (!(rope_theta > 0)) fail_usage("model field rope_theta = ", rope_theta, ": expected > 0");
  if (hidden_size % num_attention_heads != 0)
    fail_usage("model fields contradict: num_attention_heads = ", num_attention_heads,
               " does not divide hidden_size = ", hidden_size);
  if (num_attention_heads % num_key_value_heads != 0)
    fail_usage("model fields contradict: num_key_value_heads = ", num_key_value_heads,
               " does not divide num_attention_heads = ", num_attention_heads);
  if (head_dim() % 2 != 0)
    fail_usage("model fields contradict: head dimension hidden_size/num_attention_heads = ",
               head_dim(), " must be even for rotary embeddings");
}

int64_t LlamaConfig::num_parameters_per_layer() const {
  const int64_t h = hidden_size, kv = kv_dim(), i = intermediate_size;
  return 2 * h                  // input and post-attention RMSNorm
         + h * h + 2 * kv * h   // q, k, v projections
         + h * h                // o projection
         + 3 * i * h;           // gate, up, down
}

int64_t LlamaConfig::num_parameters() const {
  return 2 * vocab_size * hidden_size + hidden_size + num_hidden_layers * num_parameters_per_layer();
}

std::string inputs_dir() {
  if (const char* env = std::getenv("AMSP_INPUTS"); env && *env) return env;
  return AMSP_INPUTS_DIR;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  const fs::path dir = fs::path(inputs_dir()) / "models";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

LlamaConfig config_from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail_usage(source, ": not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail_usage(source, ": expected a JSON object");
  LlamaConfig c;
  c.name = source;
  for (const auto& f : kIntFields) {
    if (!j.contains(f.name)) continue;
    if (!j[f.name].is_number_integer())
      fail_usage("model field ", f.name, " in ", source, ": expected an integer");
    c.*f.member = j[f.name].get<int64_t>();
  }
  for (const auto& f : kRealFields) {
    if (!j.contains(f.name)) continue;
    if (!j[f.name].is_number())
      fail_usage("model field ", f.name, " in ", source, ": expected a number");
    c.*f.member = j[f.name].get<double>();
  }
  // Hugging Face's default: no num_key_value_heads means multi-head attention.
  if (!j.contains("num_key_value_heads")) c.num_key_value_heads = c.num_attention_heads;
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean() &&
      j["tie_word_embeddings"].get<bool>())
    fail_usage(source, ": tie_word_embeddings = true is not supported; "
               "amsp trains LLaMA with an untied LM head");
  return c;
}

LlamaConfig load_config(const std::string& name_or_path) {
  fs::path path = name_or_path;
  const bool looks_like_path =
      name_or_path.find('/') != std::string::npos || path.extension() == ".json";
  if (!looks_like_path) path = fs::path(inputs_dir()) / "models" / (name_or_path + ".json");
  std::ifstream in(path);
  if (!in) {
    if (looks_like_path) fail_usage("--model ", name_or_path, ": cannot open the file");
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    fail_usage("--model ", name_or_path, ": no such preset; expected one of ", known,
               " or a config.json path");
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LlamaConfig c = config_from_json(text, "--model " + path.string());
  c.name = looks_like_path ? path.string() : name_or_path;
  return c;
}

void set_config_field(LlamaConfig& config, const std::string& field, const std::string& value) {
  for (const auto& f : kIntFields) {
    if (field != f.name) continue;
    const auto v = parse_int(value);
    if (!v) fail_usage("--model.", field, " = '", value, "': expected an integer");
    config.*f.member = *v;
    return;
  }
  for (const auto& f : kRealFields) {
    if (field != f.name) continue;
    const auto v = parse_double(value);
    if (!v) fail_usage("--model.", field, " = '", value, "': expected a number");
    config.*f.member = *v;
    return;
  }
  fail_usage("--model.", field, ": unknown model field");
}

std::string config_to_json(const LlamaConfig& c) {
  json j;
  j["model_type"] = "llama";
  j["architectures"] = {"LlamaForCausalLM"};
  for (const auto& f : kIntFields) j[f.name] = c.*f.member;
  for (const auto& f : kRealFields) j[f.name] = c.*f.member;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = false;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  return j.dump(2);
}

}  // namespace amsp::model
