// The training loop on every rank: topology, plan, the sharding engine, data,
// evaluation and reporting. A single process is the one-rank case of the same
// code (every group has one member, nothing is communicated).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/checkpoint.h"
#include "core/dtype.h"
#include "engine/optimizer.h"
#include "engine/schedule.h"
#include "engine/straggler.h"
#include "model/config.h"
#include "plan/compression.h"
#include "plan/memory.h"

namespace amsp::engine {

// The convergence guard (doc/compression.md): with compression on, at step 1 and
// every `every` steps after, one micro-batch's gradient is computed exactly and
// with each compressed kind of collective, and their relative error goes into the
// metrics; above `threshold` rank 0 warns, and with kFallback that kind of
// collective goes uncompressed for the rest of the run (a resume keeps it so).
struct CompressionGuard {
  enum Mode { kOff, kWarn, kFallback } mode = kWarn;
  int64_t every = 100;
  double threshold = 0.05;
};

// Where a run starts (--resume): from nothing, from the newest checkpoint in
// checkpoint_dir that verifies (auto), or from a given checkpoint file.
struct ResumeFrom {
  enum Kind { kNone, kNewest, kFile } kind = kNone;
  std::string file;  // kFile
};

struct TrainOptions {
  model::LlamaConfig model;
  DType precision = DType::kF32;  // parameters' dtype: fp32, or bf16 mixed precision (doc/engine.md)
  Device device = Device::kCpu;   // the compute backend: cpu, or cuda (a GPU, or its emulation)
  std::string data_path;
  int64_t steps = 300;
  uint64_t seed = 1337;
  int64_t batch_size = 8;      // sequences per micro-batch per rank
  int64_t seq_len = 128;
  int64_t grad_accum = 1;      // micro-batches per optimizer step
  // --global-batch: tokens per optimizer step over all ranks; each attempt sets
  // batch_size (at most the given one) and grad_accum from its rank count
  // (engine/batch_split.h). 0: batch_size x grad_accum x ranks.
  int64_t global_batch_tokens = 0;
  LrSchedule schedule;         // total_steps is filled from steps
  AdamWOptions adamw;
  double grad_clip = kDefaultGradClip;  // max global gradient norm; 0 disables clipping
  int64_t eval_every = 50;     // 0: only at the start and the end
  int64_t eval_windows = 64;   // held-out windows per evaluation (0: all)
  std::string metrics_path;
  double peak_tflops = 0;      // 0: the backend's peak (cpu: sgemm measured at start; cuda: data sheet)
  int threads = 0;             // 0: OpenMP default
  std::string shard = "auto";  // a plan (plan/shard_plan.h) or "auto": the planner's choice
  plan::Compression compression;  // --compress: block-quantized collectives (doc/compression.md)
  CompressionGuard compress_guard;  // --compress-guard*: how far compression moves the gradient
  std::string bandwidth_path;  // table for --shard auto (comm-bench output); empty: built-in
  int64_t memory_per_rank = 0; // bytes for --shard auto; 0: the least any rank has (GPU free, or host / ranks per node)
  bool overlap = true;         // false: every collective is waited for when issued
  int prefetch_units = plan::kDefaultPrefetch;  // units gathered ahead (EngineOptions::prefetch)
  int reduction_slots = plan::kDefaultReductionSlots;  // reductions in flight (::max_reductions)
  std::string run_info_path;    // rank 0 writes what the run is and how it ended (run_info.h)
  std::string run_id;           // the run's identity in the run record (job scripts give one)
  std::string final_params_path;  // rank 0 writes every parameter here after the last step
  std::string param_trace_path;   // rank 0 appends every parameter here after every step
  std::string init_from;          // Hugging Face model directory the weights start from
  // Activation recomputation, none or full; unset (auto): with --shard auto the
  // planner weighs it, with a given plan none. Gradients are the same bits.
  std::optional<plan::Recompute> recompute;
  std::string data_order_path;    // rank 0 writes each step's training windows here (JSON lines)
  std::string trace_path;      // Chrome trace of a few steps (doc/engine.md)
  int64_t trace_steps = 2;     // steps traced, from the second (the first warms up)
  std::string kernel_profile_path;  // rank 0 writes the time of every backend call by name here
  int64_t profiler_step = 0;        // the step inside the device profiler's capture range; 0: none
  double comm_timeout_s = 0;   // a collective not done after this aborts the job; 0: default
  StragglerOptions straggler;  // naming a persistently slow rank (engine/straggler.h)
  std::string checkpoint_dir;  // where checkpoints go (doc/checkpoints.md); empty: none
  int64_t checkpoint_every = 0;  // steps between checkpoints; 0: only at the end and on a stop signal
  ResumeFrom resume;             // --resume none|auto|FILE
  bool force_resume = false;     // resume even onto another dataset or other model fields
  int keep_last = 0;           // checkpoints kept; 0: all
  ckpt::Transfer checkpoint_io = ckpt::Transfer::kIndependent;  // how shards reach the file
  // Write checkpoints from a host snapshot on a background thread while training
  // goes on (engine/checkpointer.h); false: at the step boundary, training waits.
  bool checkpoint_background = true;
};

// On SIGUSR1 or SIGTERM every rank finishes the current step, the ranks agree
// to stop after the same step, a checkpoint is written (with --checkpoint-dir)
// and train returns with preempted set.
//
// Runs the training (collective over MPI_COMM_WORLD, which must be
// initialised with comm::MpiSession) and returns the final validation loss (NaN
// if the held-out split is too short to evaluate). Rank 0 prints the plan, the
// configuration table and one line per step. Bad input found before training
// throws UsageError on every rank (rank 0's message is the one printed); a
// failure during training aborts the job.
struct TrainResult {
  double val_loss = 0;      // last validation loss (NaN if nothing to evaluate)
  int64_t last_step = 0;    // last optimizer step completed
  bool preempted = false;   // stopped early on SIGUSR1/SIGTERM (exit kExitPreempted)
};
TrainResult train(const TrainOptions& options);

}  // namespace amsp::engine
