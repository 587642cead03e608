// Loss of the current parameters on a split of a token dataset, over all ranks,
// and `amsp eval`: the same for a checkpoint.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "data/dataset.h"
#include "engine/sharded_engine.h"

namespace amsp::engine {

// Mean loss over the first `max_windows` windows of the split (0: all),
// consecutive windows of seq_len + 1 tokens, split over the ranks (collective
// over MPI_COMM_WORLD). NaN if the split holds no window. *windows_used: how
// many windows were evaluated.
double evaluate_loss(ShardedEngine& engine, const data::TokenDataset& data, data::Split split,
                     int64_t max_windows, int64_t batch, int64_t seq_len, int64_t world,
                     int64_t position, double comm_timeout_s, int64_t* windows_used);

struct EvalOptions {
  std::string checkpoint;
  std::string data_path;
  data::Split split = data::Split::kValid;
  int64_t seq_len = 128;
  int64_t batch_size = 8;
  int64_t windows = 0;         // 0: the whole split
  std::string shard = "zero3";
  int threads = 0;
  Device device = Device::kCpu;  // the compute backend (train's --device)
};

// Loads the checkpoint (any plan and world size wrote it) and prints, on rank
// 0, its loss on the split. Returns the loss.
double run_eval(const EvalOptions& options);

}  // namespace amsp::engine
