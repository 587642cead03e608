#include "engine/evaluate.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "backend/backend.h"
#include "backend/factory.h"
#include "ckpt/checkpoint.h"
#include "comm/timed.h"
#include "core/error.h"
#include "data/mixture.h"
#include "engine/plan_groups.h"
#include "model/config.h"
#include "topology/topology.h"

namespace amsp::engine {

double evaluate_loss(ShardedEngine& engine, const data::TokenDataset& data, data::Split split,
                     int64_t max_windows, int64_t batch, int64_t seq_len, int64_t world,
                     int64_t position, double comm_timeout_s, int64_t* windows_used) {
  int64_t windows = data::num_eval_windows(data, seq_len, split);
  if (max_windows > 0) windows = std::min(windows, max_windows);
  *windows_used = windows;
  if (windows == 0) return std::numeric_limits<double>::quiet_NaN();
  // Every rank runs the same number of batches (the gathers are collective);
  // rows past the last window are ignored by the loss.
  const int64_t batches = (windows + world * batch - 1) / (world * batch);
  auto [loss, count] = engine.evaluate(batches, [&](int64_t b, int32_t* tokens, int32_t* targets) {
    const int64_t first = (b * world + position) * batch;
    data::eval_batch(data, first, batch, seq_len, tokens, targets, split);
    for (int64_t r = 0; r < batch; ++r)
      if (first + r >= windows) std::fill_n(targets + r * seq_len, seq_len, -1);
  });
  double sums[2] = {loss, static_cast<double>(count)};
  comm::allreduce_sum(sums, 2, MPI_COMM_WORLD, "evaluation loss", comm_timeout_s);
  return sums[0] / std::max(1.0, sums[1]);
}

double run_eval(const EvalOptions& o) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const topology::Topology topo = topology::discover(MPI_COMM_WORLD);
  ckpt::require_sound(o.checkpoint, MPI_COMM_WORLD);
  const ckpt::Metadata meta = ckpt::read_metadata(o.checkpoint);
  model::LlamaConfig config = model::config_from_json(meta.model_json, "--checkpoint " + o.checkpoint);
  config.name = o.checkpoint;
  config.validate();
  const data::Mixture mixture(o.data_path);
  // Ids are checked against the dataset's vocab_size as they are read.
  for (size_t i = 0; i < mixture.size(); ++i)
    if (mixture.dataset(i).vocab_size() > config.vocab_size)
      fail_usage("--data ", mixture.path(i), ": its tokenizer has ", mixture.dataset(i).vocab_size(),
                 " ids but the checkpoint's vocab_size is ", config.vocab_size,
                 "; expected a dataset prepared with the checkpoint's tokenizer");
  if (o.seq_len > config.max_position_embeddings)
    fail_usage("--seq-len ", o.seq_len, ": expected at most max_position_embeddings = ",
               config.max_position_embeddings);
  PlanGroups pg = make_plan_groups(MPI_COMM_WORLD, topo, o.shard);
  // The checkpoint's fp32 master weights, evaluated in fp32.
  const auto be = backend::make_backend(
      o.device, DType::kF32,
      o.device == Device::kCuda ? backend::cuda_device_for(topo.gpu.device, topo.local_rank) : 0);
  ShardedEngine engine(config, *be, o.batch_size, o.seq_len, pg, 0, EngineOptions{});
  ckpt::load(o.checkpoint, config, engine.units(), engine.shards(), engine.state_views(), MPI_COMM_WORLD);
  // A mixture: one line per source, then their mean weighted as the mixture
  // draws them (over the sources that have a window), as amsp train's val_loss.
  double sum = 0, weights = 0;
  for (size_t i = 0; i < mixture.size(); ++i) {
    int64_t windows = 0;
    const double loss = evaluate_loss(engine, mixture.dataset(i), o.split, o.windows, o.batch_size, o.seq_len,
                                      topo.world_size, pg.position, 0, &windows);
    if (windows > 0) sum += mixture.weight(i) * loss, weights += mixture.weight(i);
    if (topo.rank == 0) {
      std::printf("checkpoint %s (step %lld, %lld tokens) on %s, %s split: loss %.6f over %lld windows "
                  "of %lld tokens (perplexity %.3f), %d rank(s), plan %s\n",
                  o.checkpoint.c_str(), static_cast<long long>(meta.step), static_cast<long long>(meta.tokens),
                  mixture.path(i).c_str(), o.split == data::Split::kValid ? "validation" : "train", loss,
                  static_cast<long long>(windows), static_cast<long long>(o.seq_len), std::exp(loss),
                  topo.world_size, plan::to_string(pg.mesh.plan()).c_str());
      std::fflush(stdout);
    }
  }
  const double loss = weights > 0 ? sum / weights : std::numeric_limits<double>::quiet_NaN();
  if (topo.rank == 0 && !mixture.single()) {
    std::printf("mixture %s, %s split: loss %.6f (the sources' losses weighted by the mixture)\n",
                mixture.describe().c_str(), o.split == data::Split::kValid ? "validation" : "train", loss);
    std::fflush(stdout);
  }
  return loss;
}

}  // namespace amsp::engine
