// The sharding engine: one optimizer step of data-parallel training in which
// parameters, gradients and optimizer states are each sharded as a plan says
// (doc/engine.md), with communication overlapping compute.
//
// What a step issues, in which order, is the step's schedule (plan/schedule.h),
// which the engine executes action by action; in outline, per micro-batch, per unit:
//   forward   all-gather the unit over the P group (the next `prefetch` units
//             are already on their way), compute, release the gathered copy;
//   backward  gather again (prefetched; the head keeps its forward copy),
//             compute the unit's full gradient, reduce-scatter it over the P
//             group and then over the G group, issued at once and chained on
//             the communicators, while earlier units compute; the G-shard
//             accumulates across micro-batches.
// Last micro-batch: each unit's G-shard is reduce-scattered over the OS group
// and all-reduced over the replica group as soon as it is ready.
// Then the global gradient norm, clipping, AdamW on the OS-shard, and an
// all-gather over the gather group that rebuilds each P-shard, left in flight
// until the next step needs that unit.
//
// Work in flight is bounded: `prefetch` gathered units and `max_reductions`
// outstanding gradient reductions, so memory stays what the planner predicts.
//
// Precision (doc/engine.md, "Precision"): with fp32 every state is fp32 and the
// OS-shard's parameters are the P-shard's own. With bf16 the P-shard and the
// gathered units are bf16, gradients are computed and communicated as bf16 and
// accumulated in an fp32 G-shard, and the OS-shard keeps an fp32 master copy
// beside Adam's moments; AdamW writes the bf16 copy that the parameter
// all-gather spreads. Everything runs on the backend the engine is given.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "ckpt/checkpoint.h"
#include "comm/communicator.h"
#include "engine/optimizer.h"
#include "engine/plan_groups.h"
#include "engine/trace.h"
#include "model/llama.h"
#include "plan/memory.h"
#include "plan/shards.h"

namespace amsp::engine {

using plan::Range;
using plan::UnitShards;

struct EngineOptions {
  DType precision = DType::kF32;  // the parameters' dtype: kF32, or kBF16 (mixed precision)
  int prefetch = plan::kDefaultPrefetch;  // gathered units in flight ahead of the one computing
  int max_reductions = plan::kDefaultReductionSlots;  // outstanding gradient reductions (slots)
  plan::Compression compression;  // block-quantized collectives (doc/compression.md); off
  bool overlap = true;       // false: wait for every collective as soon as it is issued
  int64_t micro_batches = 1; // per step, to size the page-locked batch buffer at start-up
  bool recompute = false;    // rebuild each layer's activations in backward (model/llama.h)
  AdamWOptions adamw;
  double grad_clip = kDefaultGradClip;  // 0: no clipping
  double comm_timeout_s = 0; // a collective waited on longer ends the job; 0: the comm default
  Trace* trace = nullptr;    // records compute and communication spans when set
};

// The convergence guard's reading of one micro-batch (doc/compression.md): its
// reduced gradient computed with no collective compressed, and with only the
// parameters' or only the gradients' collectives compressed, as sums of
// squares over this rank's OS-shards (the caller sums them over the world; a
// replica counts each shard once more on both sides of the ratio).
struct GuardSums {
  double exact = 0;   // sum of e^2, e the exact gradient
  double p_diff = 0;  // sum of (c - e)^2, c with the P all-gathers compressed (0 if they are not)
  double g_diff = 0;  // the same with the gradient reductions compressed
};

struct StepResult {
  double loss_sum = 0;       // over this rank's tokens
  int64_t loss_count = 0;
  double grad_norm = 0;      // global, before clipping
  double issue_s = 0;        // host seconds from the step's start to its one synchronisation
};

// Fills one micro-batch: (micro index, tokens [B*T], targets [B*T]).
using BatchFn = std::function<void(int64_t, int32_t*, int32_t*)>;

class ShardedEngine {
 public:
  // Allocates this rank's shards on `backend` (which must outlive the engine
  // and compute in options.precision) and initialises its parameters from
  // `seed` (the same values a single process would have).
  ShardedEngine(const model::LlamaConfig& config, backend::Backend& backend, int64_t batch,
                int64_t seq_len, PlanGroups& groups, uint64_t seed, const EngineOptions& options);
  ~ShardedEngine();

  const std::vector<model::UnitSpec>& units() const { return model_.units(); }
  const std::vector<UnitShards>& shards() const { return shards_; }

  // One optimizer step of `micro_batches` micro-batches; grad_scale is
  // 1 / (tokens of the step over all ranks).
  StepResult step(int64_t step, int64_t micro_batches, float grad_scale, double lr,
                  const BatchFn& batch);

  // The guard's measurement on micro-batch 0 of `batch` (collective): one
  // forward and backward with nothing compressed, then one per compressed kind
  // of collective, each reduced as the step reduces it but applied to
  // nothing. The parameters, the optimizer and the next step are untouched.
  GuardSums guard_sums(float grad_scale, const BatchFn& batch);
  // The collectives compressed from the next step on (the guard's fallback, a
  // resume that keeps it). Only as much as the engine was built with: the
  // record buffers were sized for that.
  void set_compression(const plan::Compression& c);
  const plan::Compression& compression() const;

  // Forward only over `batches` micro-batches (same count on every rank):
  // summed loss and count of valid targets on this rank. Nothing compressed:
  // the loss of the weights being trained.
  std::pair<double, int64_t> evaluate(int64_t batches, const BatchFn& batch);

  // Every unit's true parameters, gathered (collective; meaningful on all ranks).
  std::vector<std::vector<float>> full_parameters();

  // This rank's model states as fp32 host memory, for checkpoints, per unit:
  // the P-shard parameters (range shards()[u].p; the OS part is the master
  // copy) and the OS-shard Adam moments (range shards()[u].os), in the padded
  // unit's coordinates. Waits for parameter all-gathers in flight first.
  // Writing through the views (a resume) is allowed between steps: the next
  // step, evaluation or full_parameters() takes what they hold (in bf16, the
  // master from the OS part and the bf16 parameters rounded from the P range).
  // On a device backend every view is such a host copy, taken back alike.
  std::vector<ckpt::StateView> state_views();
  // What a checkpoint writes of this rank, copied into host memory from the
  // backend's alloc_host (Backend::begin_snapshot): per unit, dst[u].params
  // receives the OS range of the parameters (in bf16 the fp32 master) and
  // dst[u].exp_avg, exp_avg_sq the moments, shards()[u].os.size floats each,
  // as the step that ended left them. Returns without waiting for the copies,
  // which on a device run beside the next step's compute; the next step's
  // optimizer updates are ordered after them (fence_snapshot), and the caller
  // reads dst after Backend::wait_snapshot. Unlike state_views() nothing is
  // staged: the next step has nothing to take back.
  void begin_os_snapshot(const std::vector<ckpt::StateView>& dst);
  // Snapshots that overlap the next step (doc/checkpoints.md, "Background
  // saves"). Between steps the states are final once the views a resume wrote
  // are taken back, which settle_states() does. After that, and only where the
  // states are host memory (states_on_host()), copy_os_state may copy unit u
  // as begin_os_snapshot would, from any thread, while the engine computes: the
  // optimizer alone writes what it reads (the OS range of the parameters, or
  // the fp32 master, and the moments), and the gate set here is called on the
  // training thread before each update(u), so a caller holds it until unit
  // u's copy is taken. Where the states are host memory (states_exchangeable())
  // the gate may instead hand the update three buffers of the shard's size:
  // the update then writes its results into them and exchanges them with the
  // engine's, so the caller holds the states as they were, without a copy.
  // Where the master is not a buffer of its own (fp32: it is the P-shard's OS
  // range; !master_exchangeable()) the master is updated in place and only
  // the moments are exchanged: the gate copies the master's old values into
  // its master buffer first (copy_os_master, a third of the bytes). nullptr
  // removes the gate.
  bool states_on_host() const;
  bool states_exchangeable() const;
  bool master_exchangeable() const;
  void copy_os_master(int u, float* dst) const;
  void settle_states();
  void copy_os_state(int u, const ckpt::StateView& dst) const;
  struct OsBuffers {
    backend::Buffer *master, *exp_avg, *exp_avg_sq;
  };
  class UpdateGate {
   public:
    virtual ~UpdateGate() = default;
    // Before update(u): nullopt to update in place, or buffers to exchange.
    virtual std::optional<OsBuffers> before_update(int u) = 0;
    // After an exchanging update(u): the buffers hold the states from before it.
    virtual void after_exchange(int u) = 0;
  };
  void set_update_gate(UpdateGate* gate);
  // Which replica this rank belongs to (0 .. replicas-1): one replica, the 0th,
  // holds every OS-shard once and is the one that writes checkpoints.
  int64_t replica_index() const;

  // Bytes of model states this rank allocated (P-, G- and OS-shards, counted
  // from the buffers), and of its temporaries (gathered units, reduction slots).
  int64_t model_state_bytes() const;
  int64_t temporary_bytes() const;
  int64_t activation_bytes() const { return model_.activation_bytes(); }
  // The bytes this rank was predicted to hold at its peak, which the backend
  // set aside before anything was allocated (Backend::reserve): the planner's
  // model states and temporaries (plan/memory.h) and the activations as the
  // model allocates them.
  int64_t predicted_peak_bytes() const { return predicted_peak_; }
  // Fails naming the unit unless the gradient's padding in this rank's OS
  // ranges is zero (after a step; the trainer checks at the end of a run).
  void check_gradient_padding();

  // Per group (those with more than one rank), plus "world" for the norm.
  std::vector<comm::Stats> comm_stats() const;
  // Host waits on this engine's communicators so far (comm::Communicator::host_waits).
  int64_t comm_host_waits() const;
  void reset_comm_stats();

 private:
  struct Impl;
  int64_t batch_, seq_len_;
  std::vector<int32_t> tokens_, targets_;
  int64_t predicted_peak_;  // before model_: reserved before the model allocates
  model::Llama model_;
  std::vector<UnitShards> shards_;
  std::unique_ptr<Impl> impl_;
  void init_parameters(uint64_t seed);
  std::vector<float> reduced_gradient(float grad_scale, const int32_t* data);
};

}  // namespace amsp::engine
