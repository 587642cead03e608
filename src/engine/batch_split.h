// --global-batch: the same tokens per optimizer step on any allocation. A run
// states the step's tokens over all ranks; each attempt splits them for the
// ranks it got into micro-batches of at most --batch-size sequences and the
// micro-batches per step, so that a run requeued on fewer or more nodes trains
// what it would have trained (the sampler draws the step's rows by global row
// number, wherever they land: engine/trainer.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace amsp::engine {

struct BatchSplit {
  int64_t micro_batch = 1;   // sequences per micro-batch per rank
  int64_t micro_batches = 1; // per optimizer step (--grad-accum)
  int64_t per_rank = 1;      // sequences per rank per step
};

// Splits `tokens` per step over `ranks` ranks in sequences of `seq_len`: the
// largest micro-batch up to `max_micro` that divides each rank's sequences.
// Throws UsageError naming --global-batch, with the nearest global batches
// that split evenly, when the tokens are not a whole number of sequences per
// rank.
BatchSplit split_global_batch(int64_t tokens, int64_t seq_len, int64_t ranks, int64_t max_micro);

// "65536 tokens = 4 ranks x 2 micro-batches x 4 sequences x 2048 tokens".
std::string describe(const BatchSplit& s, int64_t tokens, int64_t seq_len, int64_t ranks);

}  // namespace amsp::engine
