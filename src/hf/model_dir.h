// A Hugging Face model directory: config.json plus the weights, either one
// model.safetensors or shards model-0000K-of-0000N.safetensors listed in
// model.safetensors.index.json. What `amsp train --init-from DIR` reads and
// `amsp export --format hf` writes (write_weights, write_config).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hf/safetensors.h"
#include "model/config.h"
#include "model/layout.h"

namespace amsp::hf {

// The file names of a model directory, for the reader and the writer alike.
inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kWeightsFile = "model.safetensors";
inline constexpr const char* kIndexFile = "model.safetensors.index.json";
// "model-00002-of-00003.safetensors" (k counts from 1)
std::string shard_file_name(int k, int n);

// transformers' split of a state dict into files of at most max_bytes: tensors
// in order, a new file when the next one would overflow the current one; a
// tensor larger than max_bytes has a file to itself. The tensors' indices per
// file.
std::vector<std::vector<size_t>> plan_shards(const std::vector<TensorDecl>& tensors, int64_t max_bytes);

// Writes the weights into the existing directory dir: model.safetensors if they
// fit max_shard_bytes, else shards (plan_shards) and model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {tensor: file}}). The
// tensors come one at a time, in declaration order, so only one is in memory.
class WeightsWriter {
 public:
  WeightsWriter(const std::string& dir, std::vector<TensorDecl> tensors, int64_t max_shard_bytes);
  ~WeightsWriter();
  // The next tensor, all of its elements (fp32, row-major; converted to its
  // dtype). Error if the count is not its numel or all were written.
  void write_tensor(const float* data, int64_t count);
  // Closes the last file and writes the index; Error if a tensor is missing.
  // Returns the names of the files written.
  std::vector<std::string> close();

 private:
  std::string dir_;
  std::vector<TensorDecl> tensors_;
  std::vector<std::vector<size_t>> files_;
  size_t next_ = 0;   // next tensor
  size_t file_ = 0;   // file being written
  std::unique_ptr<SafetensorsWriter> writer_;
  std::vector<std::string> names_;
};

// config.json for this config (model::config_to_json) with torch_dtype and,
// when given (>= 0), the tokenizer's bos/eos ids.
void write_config(const std::string& dir, const model::LlamaConfig& config, StoredType dtype,
                  int64_t bos_id = -1, int64_t eos_id = -1);

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
