// The convergence guard of compressed collectives (doc/compression.md): how far
// block-quantized collectives move the gradient, measured while the job runs.
//
// At step 1 and every `every` steps after, the engine computes one micro-batch's
// reduced gradient exactly and then with each compressed kind of collective on
// alone (ShardedEngine::guard_sums). The relative error |c - e| / |e| of each
// kind goes into that step's metrics (compress_err_p, compress_err_g). Above
// the threshold rank 0 warns in one line; with fallback, that kind of
// collective goes uncompressed from the next step on, and a checkpoint carries
// the switch, so a resume keeps it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/sharded_engine.h"
#include "engine/trainer.h"
#include "plan/compression.h"

namespace amsp::engine {

struct GuardReading {
  std::optional<double> p_err;  // parameters' all-gathers compressed alone
  std::optional<double> g_err;  // gradients' reductions compressed alone
};

// Whether step (1-based) is one the guard measures with `active` compression.
bool guard_due(const CompressionGuard& g, const plan::Compression& active, int64_t step);

// The world's reading from every rank's sums (collective over MPI_COMM_WORLD).
GuardReading measure_guard(ShardedEngine& engine, float grad_scale, const BatchFn& batch,
                           double timeout_s);

// What the reading asks for: the warning lines (one per kind over the
// threshold; empty if none) and, with fallback, the compression from the next
// step on. Pure, the same on every rank.
struct GuardVerdict {
  std::vector<std::string> warnings;
  std::optional<plan::Compression> next;
};
GuardVerdict judge_guard(const CompressionGuard& g, const GuardReading& r, const plan::Compression& active,
                         int64_t step);

// The compression a run resumed from a checkpoint continues with: the one the
// guard left ("compress_active" in the checkpoint's options) when the
// checkpoint's run asked for the same --compress as this one; else nullopt.
std::optional<plan::Compression> resumed_compression(const std::string& checkpoint_options,
                                                     const plan::Compression& requested);

}  // namespace amsp::engine
