#include "plan/memory.h"
#include "plan/test_workload.h"

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "core/error.h"
#include "model/llama.h"

namespace amsp::plan {
namespace {

using testing::odd_config;
using testing::odd_workload;

TEST(Memory, UnitsAndPadding) {
  EXPECT_EQ(unit_numels(odd_config()), (std::vector<int64_t>{42, 246, 246, 48}));
  EXPECT_EQ(padded_numel(246, 4), 248);
  EXPECT_EQ(padded_numel(42, 4), 44);
  EXPECT_EQ(padded_numel(48, 4), 48);
  EXPECT_EQ(padded_numel(246, 1), 246);
}

TEST(Memory, BytesPerElement) {
  // bf16: bf16 parameters, an fp32 gradient accumulator, fp32 master + m + v.
  EXPECT_EQ(state_bytes(Precision::kBf16).p, 2);
  EXPECT_EQ(state_bytes(Precision::kBf16).g, 4);
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
  EXPECT_EQ(m.grads, 588 * 4);
  EXPECT_EQ(m.optimizer, 588 / 4 * 12);
  // zero3: everything over 4, 147 elements per rank.
  m = memory_per_rank(w, parse_shard_plan("zero3", mesh), 4);
  EXPECT_EQ(m.params, 147 * 2);
  EXPECT_EQ(m.grads, 147 * 4);
  EXPECT_EQ(m.optimizer, 147 * 12);
  // ddp: no padding (s_os = 1), 582 elements, 2 + 4 + 12 bytes each.
  m = memory_per_rank(w, parse_shard_plan("ddp", mesh), 4);
  EXPECT_EQ(m.model_states(), 582 * 18);
  // fp32: 4 + 4 + 8 bytes; mics:2 pads to a multiple of 2 (42, 246, 246, 48).
  Workload w32 = w;
  w32.precision = Precision::kFp32;
  m = memory_per_rank(w32, parse_shard_plan("mics:2", mesh), 4);
  EXPECT_EQ(m.params, 291 * 4);
  EXPECT_EQ(m.grads, 291 * 4);
  EXPECT_EQ(m.optimizer, 291 * 8);
  EXPECT_EQ(m.total(), m.model_states() + m.activations + m.gathered + m.buckets);
  m = memory_per_rank(w32, parse_shard_plan("ddp", mesh), 4);
  EXPECT_EQ(m.model_states(), 582 * 16);
}

// The temporaries the sharding engine allocates, on 2 nodes x 2 ranks (world
// 4), the engine's defaults (prefetch 2, 4 reduction slots), worked out by hand. maxΦ is the
// largest padded unit: 248 when s_os = 4, 246 when s_os is 1 or 2. Replica
// group R = 4 / s_os. Per slot, in elements:
//   full = maxΦ         unless s_p = s_g = 1
//   p    = maxΦ/s_p     if s_p > 1 and s_g > s_p
//   g    = maxΦ/s_g     if s_p > 1 or s_g > 1 (bf16: or s_os > s_g or R > 1)
//   os   = maxΦ/s_os    if s_os > s_g (bf16: or R > 1)
// gathered = 3 maxΦ if s_p > 1; everything in the compute dtype (2 or 4 bytes).
TEST(Memory, TemporariesByHand) {
  const MeshShape mesh{2, 2};
  Workload bf16 = odd_workload();
  Workload fp32 = bf16;
  fp32.precision = Precision::kFp32;
  struct Case {
    const char* plan;
    int64_t gathered_bf16, buckets_bf16, gathered_fp32, buckets_fp32;
  };
  ASSERT_EQ(bf16.prefetch, 2);
  ASSERT_EQ(bf16.max_reductions, 4);
  const Case cases[] = {
      // ddp, R = 4: fp32 all-reduces the G-shard in place, nothing; bf16
      // needs os = 246, the bf16 copy the all-reduce sums in place.
      {"ddp", 0, 4 * 246 * 2, 0, 0},
      // zero1, R = 1: os = 62 (the OS reduce-scatter's output); bf16 adds
      // g = 248, the bf16 copy of the fp32 accumulator it scatters.
      {"zero1", 0, 4 * (248 + 62) * 2, 0, 4 * 62 * 4},
      // p=1, g=1, os=2x1, R = 2: os = 123; bf16 g = 246.
      {"p=1x1,g=1x1,os=2x1", 0, 4 * (246 + 123) * 2, 0, 4 * 123 * 4},
      // zero2: full 248, g 62; os = 0 (s_os = s_g, R = 1).
      {"zero2", 0, 4 * (248 + 62) * 2, 0, 4 * (248 + 62) * 4},
      // zero3: three gathered units of 248; full 248, g 62.
      {"zero3", 3 * 248 * 2, 4 * (248 + 62) * 2, 3 * 248 * 4, 4 * (248 + 62) * 4},
      // mics:2 (2x1 everywhere), R = 2: gathered 3 x 246; full 246, g 123; bf16
      // os = 123 for the replica all-reduce.
      {"mics:2", 3 * 246 * 2, 4 * (246 + 123 + 123) * 2, 3 * 246 * 4, 4 * (246 + 123) * 4},
      // p=2x1, g=2x2, os=2x2, R = 1: full 248, p 124, g 62.
      {"p=2x1,g=2x2,os=2x2", 3 * 248 * 2, 4 * (248 + 124 + 62) * 2, 3 * 248 * 4,
       4 * (248 + 124 + 62) * 4},
      // AMSP-style p=1, g=2x1, os=2x2, R = 1: full 248, g 124, os 62.
      {"p=1x1,g=2x1,os=2x2", 0, 4 * (248 + 124 + 62) * 2, 0, 4 * (248 + 124 + 62) * 4},
  };
  for (const Case& c : cases) {
    const ShardPlan plan = parse_shard_plan(c.plan, mesh);
    const MemoryBreakdown b = memory_per_rank(bf16, plan, 4), f = memory_per_rank(fp32, plan, 4);
    EXPECT_EQ(b.gathered, c.gathered_bf16) << c.plan;
    EXPECT_EQ(b.buckets, c.buckets_bf16) << c.plan;
    EXPECT_EQ(f.gathered, c.gathered_fp32) << c.plan;
    EXPECT_EQ(f.buckets, c.buckets_fp32) << c.plan;
    EXPECT_EQ(b.temporaries(), b.gathered + b.buckets) << c.plan;
  }
  // The engine's options: prefetch 1 keeps two gathered units, 3 reduction
  // slots three sets of buffers (zero3, bf16: full 248 + g 62).
  bf16.prefetch = 1;
  bf16.max_reductions = 3;
  const MemoryBreakdown m = memory_per_rank(bf16, parse_shard_plan("zero3", mesh), 4);
  EXPECT_EQ(m.gathered, 2 * 248 * 2);
  EXPECT_EQ(m.buckets, 3 * (248 + 62) * 2);
  // One rank: nothing to gather or reduce, in either precision.
  for (const Workload& w : {odd_workload(), fp32})
    EXPECT_EQ(memory_per_rank(w, parse_shard_plan("ddp", MeshShape{1, 1}), 1).temporaries(), 0);
}

TEST(Memory, Llama7bModelStatesUnsharded) {
  Workload w;
  w.model = model::load_config("llama-7b");
  w.seq_len = 4096;
  const MemoryBreakdown m = memory_per_rank(w, parse_shard_plan("ddp", MeshShape{8, 1}), 8);
  EXPECT_EQ(m.model_states(), 18 * w.model.num_parameters());  // 2 + 4 + 12: about 121 GB
}

// The planner's activations are the model's own allocation on the backend the
// precision trains on: bf16 on the CUDA backend, whose attention keeps a
// log-sum-exp per row and head; fp32 on the CPU backend, which keeps the
// softmax probabilities.
TEST(Memory, PlannedActivationsAreTheModelsOnItsBackend) {
  Workload w = odd_workload();  // bf16, 1 x 4 tokens, 3 heads
  for (Recompute r : {Recompute::kNone, Recompute::kFull}) {
    w.recompute = r;
    const bool full = r == Recompute::kFull;
    w.precision = Precision::kBf16;
    EXPECT_EQ(activation_bytes(w),
              model_activation_bytes(w.model, 1, 4, full, DType::kBF16, 3 * 4));
    w.precision = Precision::kFp32;
    EXPECT_EQ(activation_bytes(w),
              model_activation_bytes(w.model, 1, 4, full, DType::kF32, 3 * 16));
    // bf16 on the CPU backend (amsp train says which backend): its probabilities.
    w.precision = Precision::kBf16;
    w.attention = AttentionSaved::kProbabilities;
    EXPECT_EQ(activation_bytes(w),
              model_activation_bytes(w.model, 1, 4, full, DType::kBF16, 3 * 16));
    w.attention.reset();
  }
}

TEST(Memory, CpuActivationsByHand) {
  // B = 1, T = 4 on the odd model: rope 2*4*1 = 8; residual 3*24 = 72; per
  // layer q, k, v 24 + 24 + 24, probs 3*16 = 48, attn 24, h 24, gate and up
  // 2*20, 1/rms 8 = 216; head 4 + 28 + 4 = 36; scratch n, dn, dres, dattn
  // 4*24, dqkv 72, act 20, dgate_up 40 = 228; token ids and targets 2*4 = 8.
  const model::LlamaConfig c = odd_config();
  const int64_t probs =
      attention_saved_count(AttentionSaved::kProbabilities, 1, 4, c.num_attention_heads);
  EXPECT_EQ(probs, 3 * 16);
  EXPECT_EQ(model_activation_bytes(c, 1, 4, false, DType::kF32, probs),
            4 * (8 + 72 + 2 * 216 + 36 + 228 + 8));
  // Under bf16 compute n, dn, dattn (3 * 24), dqkv (72), act (20), dgate_up
  // (40), each layer's q, k, v (72), attn (24), gate and up (40), and the
  // logits (28) take 2 bytes, not 4, and dres has a bf16 copy (24).
  EXPECT_EQ(model_activation_bytes(c, 1, 4, false, DType::kBF16, probs),
            4 * (8 + 72 + 2 * 216 + 36 + 228 + 8) -
                2 * (72 + 72 + 20 + 40 + 2 * (72 + 24 + 40) + 28) + 2 * 24);
  // A fused attention keeps one log-sum-exp per row and head, 3 * 4 a layer.
  const int64_t lse =
      attention_saved_count(AttentionSaved::kLogSumExp, 1, 4, c.num_attention_heads);
  EXPECT_EQ(lse, 3 * 4);
  EXPECT_EQ(model_activation_bytes(c, 1, 4, false, DType::kBF16, lse),
            model_activation_bytes(c, 1, 4, false, DType::kBF16, probs) - 2 * 4 * (48 - 12));
}

// On both backends, with what each one's attention keeps: the CPU's
// probabilities, the CUDA kernels' log-sum-exp (the emulated device's
// allocator rounds each buffer up to 512 bytes).
TEST(Memory, ActivationsMatchWhatLlamaAllocates) {
  for (auto [B, T] : {std::pair<int64_t, int64_t>{1, 4}, {3, 16}, {2, 64}}) {
    model::LlamaConfig c = model::load_config("tiny");
    for (Device device : {Device::kCpu, Device::kCuda}) {
      for (DType compute : {DType::kF32, DType::kBF16}) {
        const auto be = device == Device::kCpu ? backend::make_cpu_backend(compute)
                                               : backend::make_cuda_backend(compute, 0);
        const AttentionSaved kind =
            device == Device::kCpu ? AttentionSaved::kProbabilities : AttentionSaved::kLogSumExp;
        const int64_t saved = attention_saved_count(kind, B, T, c.num_attention_heads);
        EXPECT_EQ(be->attention_saved_count(B, T, c.num_attention_heads), saved);
        for (bool recompute : {false, true}) {
          const int64_t before = be->memory().in_use;
          model::Llama llama(c, *be, B, T, recompute);
          const int64_t allocated = be->memory().in_use - before;
          const int64_t predicted = model_activation_bytes(c, B, T, recompute, compute, saved);
          const int64_t rounding =
              device == Device::kCpu ? 0 : 512 * (40 + 30 * c.num_hidden_layers);
          EXPECT_LE(predicted, allocated);
          EXPECT_LE(allocated, predicted + rounding)
              << device_name(device) << " " << B << "x" << T << (recompute ? " recompute " : " ")
              << dtype_name(compute);
        }
      }
    }
  }
}

// Sizes in messages: the largest unit under which the figure is at least 1,
// so that a small model's plan does not read "needs 0.0 GiB".
TEST(Memory, FormatsSizesInTheirOwnUnit) {
  EXPECT_EQ(format_memory(int64_t{80} << 30), "80.0 GiB");
  EXPECT_EQ(format_memory(int64_t{3} << 39), "1.5 TiB");
  EXPECT_EQ(format_memory(int64_t{37} << 19), "18.5 MiB");
  EXPECT_EQ(format_memory(3072), "3.0 KiB");
  EXPECT_EQ(format_memory(1023), "1023 bytes");
  EXPECT_EQ(format_memory(0), "0 bytes");
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
