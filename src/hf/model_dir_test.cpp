#include "hf/model_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/test_temp_dir.h"
#include "model/layout.h"

namespace amsp::hf {
namespace {

namespace fs = std::filesystem;

model::LlamaConfig small_config() {
  model::LlamaConfig c;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.vocab_size = 10;
  c.max_position_embeddings = 16;
  return c;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = test::process_temp_dir().path() / "model_dir" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Element k of tensor i: differs between tensors and along each, exact in bf16
// (i + 1 < 256 has at most 8 significant bits).
float value(size_t i, int64_t k) {
  return static_cast<float>(i + 1) * std::ldexp(k % 2 ? -1.0f : 1.0f, static_cast<int>(k % 20) - 10);
}

// The layout of `config` written by WeightsWriter, then read by ModelDir.
void write_and_read_back(const fs::path& dir, StoredType dtype, int64_t max_shard,
                         size_t expect_files) {
  const auto config = small_config();
  const auto units = model::build_layout(config);
  std::vector<TensorDecl> decls;
  for (const auto& u : units)
    for (const auto& t : u.tensors) decls.push_back({t.name, dtype, t.shape});
  write_config(dir.string(), config, dtype);
  WeightsWriter w(dir.string(), decls, max_shard);
  for (size_t i = 0; i < decls.size(); ++i) {
    std::vector<float> x(static_cast<size_t>(decls[i].numel()));
    for (size_t k = 0; k < x.size(); ++k) x[k] = value(i, static_cast<int64_t>(k));
    w.write_tensor(x.data(), static_cast<int64_t>(x.size()));
  }
  const auto files = w.close();
  EXPECT_EQ(files.size(), expect_files);
  ModelDir md(dir.string());
  EXPECT_EQ(md.config().hidden_size, config.hidden_size);
  EXPECT_EQ(md.config().num_key_value_heads, config.num_key_value_heads);
  md.check(units);  // every tensor present with its shape, nothing else
  for (size_t i = 0; i < decls.size(); ++i) {
    std::vector<float> x(static_cast<size_t>(decls[i].numel()));
    md.read(decls[i].name, 0, decls[i].numel(), x.data());
    for (size_t k = 0; k < x.size(); ++k) ASSERT_EQ(x[k], value(i, static_cast<int64_t>(k))) << decls[i].name;
  }
}

TEST(ModelDirWriterTest, OneFileBelowTheLimit) {
  const fs::path d = fresh_dir("one");
  write_and_read_back(d, StoredType::kF32, 5'000'000'000, 1);
  EXPECT_TRUE(fs::exists(d / kWeightsFile));
  EXPECT_FALSE(fs::exists(d / kIndexFile));
  const auto cfg = nlohmann::json::parse(std::ifstream(d / kConfigFile));
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  EXPECT_EQ(cfg["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
}

TEST(ModelDirWriterTest, ShardsAndIndexAboveTheLimit) {
  const fs::path d = fresh_dir("sharded");
  // bf16: a decoder layer is 2*8 + (8+4+4+8)*8 + 3*12*8 = 496 elements, 992 bytes.
  // Per tensor, in order: embed .. layers.0 up_proj (960 bytes), layers.0 down_proj ..
  // layers.1 up_proj (992), layers.1 down_proj .. lm_head: three files and the index.
  write_and_read_back(d, StoredType::kBF16, 1000, 4);
  const auto index = nlohmann::json::parse(std::ifstream(d / kIndexFile));
  EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["model.layers.0.mlp.down_proj.weight"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["lm_head.weight"], "model-00003-of-00003.safetensors");
  // 2 * (10*8 embed + 2 * 496 + 8 norm + 10*8 head) bytes.
  EXPECT_EQ(index["metadata"]["total_size"], 2 * (80 + 2 * 496 + 8 + 80));
}

TEST(ModelDirWriterTest, PlanShardsAsTransformers) {
  auto decl = [](int64_t n) { return TensorDecl{"t" + std::to_string(n), StoredType::kF32, {n}}; };
  // 4-byte elements, limit 40 bytes (10 elements).
  const auto plan = plan_shards({decl(4), decl(6), decl(1), decl(20), decl(3), decl(7)}, 40);
  const std::vector<std::vector<size_t>> expect = {{0, 1}, {2}, {3}, {4, 5}};
  EXPECT_EQ(plan, expect);
  EXPECT_EQ(shard_file_name(2, 13), "model-00002-of-00013.safetensors");
}

// transformers 5 writes rope_parameters in place of rope_theta: its theta is
// read, and anything but plain RoPE is refused in one line.
TEST(ModelDirTest, ReadsTransformers5RopeParameters) {
  const fs::path dir = fresh_dir("rope5");
  write_and_read_back(dir, StoredType::kF32, 5'000'000'000, 1);
  auto rewrite = [&](const nlohmann::json& rope) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    j.erase("rope_theta");
    j.erase("rope_scaling");
    j["rope_parameters"] = rope;
    std::ofstream(dir / "config.json") << j.dump();
  };
  rewrite({{"rope_type", "default"}, {"rope_theta", 500000.0}});
  EXPECT_EQ(ModelDir(dir.string()).config().rope_theta, 500000.0);
  rewrite({{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0}});
  try {
    ModelDir md(dir.string());
    FAIL() << "llama3 RoPE scaling accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("rope_parameters is"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace amsp::hf
