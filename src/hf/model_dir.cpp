#include "hf/model_dir.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace amsp::hf {
namespace fs = std::filesystem;
namespace {

std::string read_text(const fs::path& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) fail_usage("--init-from ", path.parent_path().string(), ": no ", what, " (expected a Hugging Face "
                      "model directory: config.json and model.safetensors)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The parts of a config.json that amsp's LLaMA cannot represent.
void check_architecture(const nlohmann::json& j, const std::string& source) {
  auto refuse = [&](const std::string& what) {
    fail_usage(source, ": ", what, "; expected a LLaMA model (LlamaForCausalLM)");
  };
  if (j.contains("model_type") && j["model_type"] != "llama")
    refuse(cat("model_type is ", j["model_type"].dump()));
  if (j.contains("architectures") && j["architectures"].is_array() &&
      (j["architectures"].size() != 1 || j["architectures"][0] != "LlamaForCausalLM"))
    refuse(cat("architectures is ", j["architectures"].dump()));
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") refuse(cat("hidden_act is ", j["hidden_act"].dump()));
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (j.contains(bias) && j[bias] == true) refuse(cat(bias, " is true (amsp's projections have no bias)"));
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    refuse(cat("rope_scaling is ", j["rope_scaling"].dump(), " (only plain RoPE is supported)"));
  if (j.contains("head_dim") && j["head_dim"].is_number_integer() && j.contains("hidden_size") &&
      j.contains("num_attention_heads") &&
      j["head_dim"].get<int64_t>() * j["num_attention_heads"].get<int64_t>() != j["hidden_size"].get<int64_t>())
    refuse(cat("head_dim ", j["head_dim"].dump(), " is not hidden_size / num_attention_heads"));
}

// transformers 5 writes RoPE's settings as one object, rope_parameters
// {"rope_type": "default", "rope_theta": ...}, in place of the top-level
// rope_theta and rope_scaling of earlier versions: plain RoPE only, its theta
// moved to where config_from_json reads it.
void take_rope_parameters(nlohmann::json& j, const std::string& source) {
  if (!j.contains("rope_parameters") || j["rope_parameters"].is_null()) return;
  const nlohmann::json& r = j["rope_parameters"];
  if (!r.is_object() || (r.contains("rope_type") && r["rope_type"] != "default"))
    fail_usage(source, ": rope_parameters is ", r.dump(),
               " (only plain RoPE is supported); expected a LLaMA model (LlamaForCausalLM)");
  if (r.contains("rope_theta") && !j.contains("rope_theta")) j["rope_theta"] = r["rope_theta"];
}

// The weight files: the index's shards, else model.safetensors.
std::vector<std::string> weight_files(const fs::path& dir) {
  const fs::path index = dir / kIndexFile;
  if (!fs::exists(index)) {
    if (!fs::exists(dir / kWeightsFile))
      fail_usage("--init-from ", dir.string(), ": no ", kWeightsFile, " or ", kIndexFile);
    return {(dir / kWeightsFile).string()};
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(index, kIndexFile));
  } catch (const nlohmann::json::exception&) {
    fail_usage(index.string(), ": not valid JSON");
  }
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    fail_usage(index.string(), ": no weight_map object");
  std::set<std::string> names;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
      fail_usage(index.string(), ": weight_map entry ", tensor, " is not a file name in the directory");
    names.insert(file.get<std::string>());
  }
  std::vector<std::string> out;
  for (const auto& n : names) out.push_back((dir / n).string());
  return out;
}

}  // namespace

ModelDir::ModelDir(const std::string& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) fail_usage("--init-from ", dir, ": not a directory");
  const fs::path config_path = fs::path(dir) / kConfigFile;
  const std::string text = read_text(config_path, kConfigFile);
  const std::string source = config_path.string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    fail_usage(source, ": not valid JSON");
  }
  check_architecture(j, source);
  take_rope_parameters(j, source);
  config_ = model::config_from_json(j.dump(), source);
  config_.name = dir;
  config_.validate();
  for (const auto& f : weight_files(dir)) files_.push_back(std::make_unique<SafetensorsFile>(f));
}

ModelDir::~ModelDir() = default;

const SafetensorsFile* ModelDir::file_of(const std::string& name) const {
  for (const auto& f : files_)
    if (f->tensors().count(name)) return f.get();
  return nullptr;
}

void ModelDir::check(const std::vector<model::UnitSpec>& units) const {
  std::set<std::string> expected;
  for (const auto& u : units)
    for (const auto& t : u.tensors) {
      expected.insert(t.name);
      const SafetensorsFile* f = file_of(t.name);
      if (!f) fail_usage("--init-from ", dir_, ": no tensor ", t.name, " in the weights");
      const TensorInfo& info = f->tensors().at(t.name);
      if (info.shape != t.shape) {
        auto dims = [](const std::vector<int64_t>& s) {
          std::string out;
          for (int64_t d : s) {
            if (!out.empty()) out += 'x';
            out += std::to_string(d);
          }
          return out;
        };
        fail_usage("--init-from ", dir_, ": tensor ", t.name, " in ", f->path(), " has shape ", dims(info.shape),
                   "; config.json implies ", dims(t.shape));
      }
    }
  for (const auto& f : files_)
    for (const auto& [name, info] : f->tensors())
      if (!expected.count(name))
        fail_usage("--init-from ", dir_, ": ", f->path(), " holds ", name,
                   ", which a LLaMA model of this config.json does not have");
}

void ModelDir::read(const std::string& name, int64_t first, int64_t count, float* out) const {
  const SafetensorsFile* f = file_of(name);
  if (!f) fail_usage("--init-from ", dir_, ": no tensor ", name, " in the weights");
  f->read(name, first, count, out);
}

// ------------------------------------------------------------------ writing

std::string shard_file_name(int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", k, n);
  return buf;
}

std::vector<std::vector<size_t>> plan_shards(const std::vector<TensorDecl>& tensors, int64_t max_bytes) {
  std::vector<std::vector<size_t>> files;
  int64_t used = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t b = tensors[i].bytes();
    if (files.empty() || (!files.back().empty() && used + b > max_bytes)) {
      files.emplace_back();
      used = 0;
    }
    files.back().push_back(i);
    used += b;
  }
  return files;
}

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) fail(path.string(), ": write failed");
}

}  // namespace

WeightsWriter::WeightsWriter(const std::string& dir, std::vector<TensorDecl> tensors, int64_t max_shard_bytes)
    : dir_(dir), tensors_(std::move(tensors)), files_(plan_shards(tensors_, max_shard_bytes)) {
  const int n = static_cast<int>(files_.size());
  for (int k = 0; k < n; ++k) names_.push_back(n == 1 ? kWeightsFile : shard_file_name(k + 1, n));
}

WeightsWriter::~WeightsWriter() = default;

void WeightsWriter::write_tensor(const float* data, int64_t count) {
  if (next_ >= tensors_.size()) fail(dir_, ": a tensor more than the ", tensors_.size(), " declared");
  const TensorDecl& t = tensors_[next_];
  if (count != t.numel()) fail(dir_, ": tensor ", t.name, " came with ", count, " elements, not ", t.numel());
  if (!writer_) {
    std::vector<TensorDecl> decls;
    for (size_t i : files_[file_]) decls.push_back(tensors_[i]);
    writer_ = std::make_unique<SafetensorsWriter>((fs::path(dir_) / names_[file_]).string(), std::move(decls));
  }
  writer_->write(data, count);
  ++next_;
  if (next_ == files_[file_].back() + 1) {  // the file is complete
    writer_->close();
    writer_.reset();
    ++file_;
  }
}

std::vector<std::string> WeightsWriter::close() {
  if (next_ < tensors_.size()) fail(dir_, ": tensor ", tensors_[next_].name, " was not written");
  if (files_.size() > 1) {
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    int64_t total = 0;
    for (size_t k = 0; k < files_.size(); ++k)
      for (size_t i : files_[k]) {
        weight_map[tensors_[i].name] = names_[k];
        total += tensors_[i].bytes();
      }
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    write_text(fs::path(dir_) / kIndexFile, index.dump(2) + "\n");
    names_.push_back(kIndexFile);
  }
  return names_;
}

void write_config(const std::string& dir, const model::LlamaConfig& config, StoredType dtype,
                  int64_t bos_id, int64_t eos_id) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(model::config_to_json(config));
  j["torch_dtype"] = dtype == StoredType::kF32    ? "float32"
                     : dtype == StoredType::kBF16 ? "bfloat16"
                                                  : "float16";
  j["rope_scaling"] = nullptr;
  if (bos_id >= 0) j["bos_token_id"] = bos_id;
  if (eos_id >= 0) j["eos_token_id"] = eos_id;
  write_text(fs::path(dir) / kConfigFile, j.dump(2) + "\n");
}

}  // namespace amsp::hf
