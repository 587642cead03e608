// A Hugging Face model directory: config.json plus the weights, either one
// model.safetensors or shards model-0000K-of-0000N.safetensors listed in
// model.safetensors.index.json. What `amsp train --init-from DIR` reads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hf/safetensors.h"
#include "model/config.h"
#include "model/layout.h"

namespace amsp::hf {

class ModelDir {
 public:
  // Reads config.json and the safetensors headers. Throws UsageError with one
  // line naming the file and what is wrong: no config.json, an architecture
  // other than LLaMA (model_type, architectures, hidden_act, biases, rope
  // scaling), no weights, a damaged header.
  explicit ModelDir(const std::string& dir);
  ~ModelDir();

  const std::string& dir() const { return dir_; }
  const model::LlamaConfig& config() const { return config_; }

  // Every tensor the layout names is present with its shape; nothing else is in
  // the files. Throws UsageError naming the first tensor that is missing,
  // misshapen or unexpected.
  void check(const std::vector<model::UnitSpec>& units) const;

  // Elements [first, first + count) of tensor `name`, as fp32.
  void read(const std::string& name, int64_t first, int64_t count, float* out) const;

 private:
  const SafetensorsFile* file_of(const std::string& name) const;
  std::string dir_;
  model::LlamaConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
};

}  // namespace amsp::hf
