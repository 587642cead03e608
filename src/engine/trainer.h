// The training loop. Today: one process holds the whole model; the sharded,
// multi-rank schedule replaces the inner step without changing this interface.
#pragma once

#include <cstdint>
#include <string>

#include "engine/optimizer.h"
#include "engine/schedule.h"
#include "model/config.h"

namespace amsp::engine {

struct TrainOptions {
  model::LlamaConfig model;
  std::string data_path;
  int64_t steps = 300;
  uint64_t seed = 1337;
  int64_t batch_size = 8;      // sequences per micro-batch per rank
  int64_t seq_len = 128;
  int64_t grad_accum = 1;      // micro-batches per optimizer step
  LrSchedule schedule;         // total_steps is filled from steps
  AdamWOptions adamw;
  double grad_clip = 1.0;      // max global gradient norm; 0 disables clipping
  int64_t eval_every = 50;     // 0: only at the start and the end
  int64_t eval_windows = 64;   // held-out windows per evaluation (0: all)
  std::string metrics_path;
  double peak_tflops = 0;      // 0: measure the sgemm peak at start
  int threads = 0;             // 0: OpenMP default
};

// Runs the training and returns the final validation loss (NaN if the held-out
// split is too short to evaluate). Prints the configuration table and one line
// per step to stdout.
double train(const TrainOptions& options);

}  // namespace amsp::engine
