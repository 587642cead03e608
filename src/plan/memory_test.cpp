#include "plan/memory.h"

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "core/error.h"
#include "model/llama.h"

namespace amsp::plan {
namespace {

// A tiny model whose units need padding: embed 7x6 = 42, each layer
// 2*6 + 36 + 2*36 + 36 + 3*5*6 = 246, head 6 + 42 = 48.
model::LlamaConfig odd_config() {
  model::LlamaConfig c;
  c.hidden_size = 6;
  c.intermediate_size = 5;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 3;
  c.vocab_size = 7;
  c.max_position_embeddings = 16;
  return c;
}

Workload odd_workload() {
  Workload w;
  w.model = odd_config();
  w.seq_len = 4;
  w.micro_batch = 1;
  return w;
}

TEST(Memory, UnitsAndPadding) {
  EXPECT_EQ(unit_numels(odd_config()), (std::vector<int64_t>{42, 246, 246, 48}));
  EXPECT_EQ(padded_numel(246, 4), 248);
  EXPECT_EQ(padded_numel(42, 4), 44);
  EXPECT_EQ(padded_numel(48, 4), 48);
  EXPECT_EQ(padded_numel(246, 1), 246);
}

TEST(Memory, BytesPerElement) {
  EXPECT_EQ(state_bytes(Precision::kBf16).p, 2);
  EXPECT_EQ(state_bytes(Precision::kBf16).g, 2);
  EXPECT_EQ(state_bytes(Precision::kBf16).os, 12);
  EXPECT_EQ(state_bytes(Precision::kFp32).p, 4);
  EXPECT_EQ(state_bytes(Precision::kFp32).g, 4);
  EXPECT_EQ(state_bytes(Precision::kFp32).os, 8);
}

TEST(Memory, ModelStatesByHand) {
  const Workload w = odd_workload();
  const MeshShape mesh{2, 2};
  // zero1: os over 4 ranks, units padded to 44 + 248 + 248 + 48 = 588.
  MemoryBreakdown m = memory_per_rank(w, parse_shard_plan("zero1", mesh), 4);
  EXPECT_EQ(m.params, 588 * 2);
  EXPECT_EQ(m.grads, 588 * 2);
  EXPECT_EQ(m.optimizer, 588 / 4 * 12);
  EXPECT_EQ(m.gathered, 0);
  EXPECT_EQ(m.buckets, 0);
  // zero3: everything over 4; two gathered units and two buckets of the
  // largest padded unit (248).
  m = memory_per_rank(w, parse_shard_plan("zero3", mesh), 4);
  EXPECT_EQ(m.params, 147 * 2);
  EXPECT_EQ(m.grads, 147 * 2);
  EXPECT_EQ(m.optimizer, 147 * 12);
  EXPECT_EQ(m.gathered, 2 * 248 * 2);
  EXPECT_EQ(m.buckets, 2 * 248 * 2);
  // ddp: no padding (s_os = 1), 582 elements, 16 bytes each.
  m = memory_per_rank(w, parse_shard_plan("ddp", mesh), 4);
  EXPECT_EQ(m.model_states(), 582 * 16);
  EXPECT_EQ(m.temporaries(), 0);
  // fp32: 4 + 4 + 8 bytes; mics:2 pads to a multiple of 2 (42, 246, 246, 48).
  Workload w32 = w;
  w32.precision = Precision::kFp32;
  m = memory_per_rank(w32, parse_shard_plan("mics:2", mesh), 4);
  EXPECT_EQ(m.params, 291 * 4);
  EXPECT_EQ(m.grads, 291 * 4);
  EXPECT_EQ(m.optimizer, 291 * 8);
  EXPECT_EQ(m.total(), m.model_states() + m.activations + m.gathered + m.buckets);
}

TEST(Memory, Llama7bModelStatesUnsharded) {
  Workload w;
  w.model = model::load_config("llama-7b");
  w.seq_len = 4096;
  const MemoryBreakdown m = memory_per_rank(w, parse_shard_plan("ddp", MeshShape{8, 1}), 8);
  EXPECT_EQ(m.model_states(), 16 * w.model.num_parameters());  // about 108 GB
}

TEST(Memory, GpuActivationsByHand) {
  Workload w = odd_workload();  // 4 tokens, h 6, kv 6, I 5, V 7, 3 heads, 2 layers
  // layer: 4 (72 + 24 + 30 + 8) + 4*4*3 = 584; head: 4 (24 + 42 + 4) = 280.
  EXPECT_EQ(gpu_layer_activation_bytes(w.model, 4), 584);
  EXPECT_EQ(gpu_head_activation_bytes(w.model, 4), 280);
  EXPECT_EQ(activation_bytes(w), 2 * 584 + 280);
  // Full recomputation: 2 layer inputs of 4 x 6 bf16 + one layer's working set
  // without its input + the head.
  w.recompute = Recompute::kFull;
  EXPECT_EQ(activation_bytes(w), 2 * 48 + (584 - 48) + 280);
}

TEST(Memory, CpuActivationsByHand) {
  // B = 1, T = 4 on the odd model: rope 2*4*1 = 8; residual 3*24 = 72; per
  // layer q 24, k 24, v 24, probs 3*16 = 48, attn 24, h 24, gate 20, up 20,
  // 1/rms 8 = 216; head 4 + 28 + 4 = 36; scratch 5*24 + 2*24 + 2*20 = 208;
  // token ids and targets 2*4 = 8.
  EXPECT_EQ(cpu_activation_floats(odd_config(), 1, 4), 8 + 72 + 2 * 216 + 36 + 208 + 8);
}

TEST(Memory, CpuActivationsMatchWhatLlamaAllocates) {
  for (auto [B, T] : {std::pair<int64_t, int64_t>{1, 4}, {3, 16}, {2, 64}}) {
    model::LlamaConfig c = model::load_config("tiny");
    const auto be = backend::make_cpu_backend(DType::kF32);
    model::Llama llama(c, *be, B, T);
    EXPECT_EQ(be->memory().in_use, 4 * cpu_activation_floats(c, B, T)) << B << "x" << T;
  }
}

TEST(Memory, ParseSizes) {
  EXPECT_EQ(parse_memory_size("80GiB", "gpu-memory"), int64_t{80} << 30);
  EXPECT_EQ(parse_memory_size("80G", "gpu-memory"), int64_t{80} << 30);
  EXPECT_EQ(parse_memory_size("80GB", "gpu-memory"), int64_t{80'000'000'000});
  EXPECT_EQ(parse_memory_size("1.5TiB", "gpu-memory"), int64_t{3} << 39);
  EXPECT_EQ(parse_memory_size("1024", "gpu-memory"), 1024);
  for (const char* bad : {"", "GiB", "80 GiB", "80XB", "-1G", "0", "1.5"}) {
    try {
      parse_memory_size(bad, "gpu-memory");
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--gpu-memory"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace amsp::plan
