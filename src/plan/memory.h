// The memory model: what one rank holds for a shard plan (doc/planner.md).
//
//   model states  = sum over units u of  Φu·bP/s_p + Φu·bG/s_g + Φu·bOS/s_os
//   activations   = what forward keeps for backward (precision, recompute)
//   temporaries   = gathered units in flight + reduction slots
//
// Φu is unit u's numel padded up to a multiple of s_os, exactly what the
// sharding engine allocates, so every shard level splits evenly. Model states
// and temporaries are exactly the engine's allocations; memory_per_rank says
// term by term which buffer each one is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "plan/compression.h"
#include "plan/shard_plan.h"

namespace amsp::plan {

// bf16 mixed precision (bf16 parameters and gradients on the wire, fp32 master
// weights and moments) or fp32 throughout, on either device (--precision).
enum class Precision { kBf16, kFp32 };
enum class Recompute { kNone, kFull };

const char* precision_name(Precision p);  // "bf16", "fp32"
const char* recompute_name(Recompute r);  // "none", "full"

// The sharding engine's bounds on work in flight, by default (its options
// `prefetch` and `max_reductions`; amsp train and plan's --prefetch-units and
// --reduction-slots): units gathered ahead of the one computing, and gradient
// reductions outstanding, each in a slot of its own. Four slots, not two: with
// two, a unit's backward waited for the reduction two units back whenever the
// communication ran late (doc/engine.md, "Reduction slots").
inline constexpr int kDefaultPrefetch = 2;
inline constexpr int kDefaultReductionSlots = 4;

// What attention keeps for backward, per layer, in fp32 elements
// (Backend::attention_saved_count): the CPU backend keeps the softmax
// probabilities (B·H·T²), the CUDA backend's fused kernels one log-sum-exp per
// row and head (B·H·T).
enum class AttentionSaved { kProbabilities, kLogSumExp };
int64_t attention_saved_count(AttentionSaved saved, int64_t B, int64_t T, int64_t heads);

// What one rank computes: the model and its micro-batch.
struct Workload {
  model::LlamaConfig model;
  int64_t seq_len = 0;
  int64_t micro_batch = 1;  // sequences per micro-batch
  Precision precision = Precision::kBf16;
  Recompute recompute = Recompute::kNone;
  // The sharding engine's bounds on work in flight (above); they size the
  // temporaries.
  int prefetch = kDefaultPrefetch;
  int max_reductions = kDefaultReductionSlots;
  // Which collectives travel block-quantized (plan/compression.h; off by default).
  Compression compression;
  // What attention keeps; unset: what the backend the precision trains on
  // keeps (bf16: the CUDA kernels' log-sum-exp, fp32: the CPU's
  // probabilities). amsp train sets it from its backend.
  std::optional<AttentionSaved> attention;
  int64_t tokens_per_micro_batch() const { return seq_len * micro_batch; }
};

// Bytes per element of each state. fp32 (4, 4, 8): fp32 parameters and
// gradients, Adam m + v. bf16 (2, 4, 12): bf16 parameters, an fp32 gradient
// accumulator (gradients travel as bf16 but accumulate across micro-batches in
// fp32, as Megatron and DeepSpeed do by default: doc/engine.md, "Precision"),
// fp32 master parameters + Adam m + v. The AMSP paper counts G at 2 bytes.
struct StateBytes {
  int64_t p = 0, g = 0, os = 0;
};
StateBytes state_bytes(Precision precision);

// The units' numel in forward order (embed, layers.0.., head), unpadded.
std::vector<int64_t> unit_numels(const model::LlamaConfig& config);
// Φu: numel rounded up to a multiple of s_os.
int64_t padded_numel(int64_t numel, int64_t s_os);

struct MemoryBreakdown {
  int64_t params = 0, grads = 0, optimizer = 0;  // model states
  int64_t activations = 0;
  int64_t gathered = 0;  // all-gathered units: the one computing + `prefetch` in flight
  int64_t buckets = 0;   // reduction slots of `max_reductions` outstanding reductions
  int64_t model_states() const { return params + grads + optimizer; }
  int64_t temporaries() const { return gathered + buckets; }
  int64_t total() const { return model_states() + activations + temporaries(); }
};

// Bytes the model (model::Llama) allocates for micro-batches of B sequences of
// T tokens on a backend computing in `compute` whose attention keeps `saved`
// fp32 elements a layer (attention_saved_count): activations kept for backward,
// scratch and RoPE tables, fp32 but for the buffers only matrix products and
// the kernels around them read (the normed input, q|k|v, attention's output,
// gate|up, SwiGLU's output, the logits and their gradients), which are in the
// compute dtype (the residual stream stays fp32); with recompute, one
// layer's working set instead of every layer's. Kept in step with
// src/model/llama.cpp; a test compares it with the allocation Llama makes.
int64_t model_activation_bytes(const model::LlamaConfig& config, int64_t B, int64_t T,
                               bool recompute, DType compute, int64_t saved);

// Activation bytes per rank for one micro-batch in flight: what the model
// allocates on the backend the precision trains on (bf16: the CUDA backend's
// fused attention; fp32: the CPU backend's).
int64_t activation_bytes(const Workload& w);

// The whole per-rank breakdown for a plan on `shape` (compression limited to
// the groups that cross nodes depends on the nodes), or on a world of `world`
// ranks on one node.
MemoryBreakdown memory_per_rank(const Workload& w, const ShardPlan& plan, const MeshShape& shape);
MemoryBreakdown memory_per_rank(const Workload& w, const ShardPlan& plan, int64_t world);

// "80GiB", "80GB" (10^9), "80G" (= GiB), "1.5TiB", "85899345920" -> bytes.
// Throws UsageError naming `option` on anything else.
int64_t parse_memory_size(const std::string& text, const std::string& option);

// "80.0 GiB", "18.5 MiB", "3.0 KiB", "512 bytes": the largest unit under which
// the size is at least 1.
std::string format_memory(int64_t bytes);
// "%.*f": a number for a message.
std::string format_fixed(double v, int digits);

}  // namespace amsp::plan
