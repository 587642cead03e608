#include "engine/batch_split.h"

#include <algorithm>

#include "core/error.h"

namespace amsp::engine {

BatchSplit split_global_batch(int64_t tokens, int64_t seq_len, int64_t ranks, int64_t max_micro) {
  const int64_t unit = seq_len * ranks;  // one sequence on every rank
  if (tokens < 1 || tokens % unit != 0) {
    const int64_t below = tokens / unit * unit, above = below + unit;
    fail_usage("--global-batch ", tokens, ": not a whole number of sequences of ", seq_len, " tokens on each of ",
               ranks, " ranks; the nearest that are: ",
               below > 0 ? cat(below, " or ", above) : cat(above), " tokens");
  }
  BatchSplit s;
  s.per_rank = tokens / unit;
  s.micro_batch = 1;
  for (int64_t m = std::min(max_micro, s.per_rank); m >= 1; --m)
    if (s.per_rank % m == 0) {
      s.micro_batch = m;
      break;
    }
  s.micro_batches = s.per_rank / s.micro_batch;
  return s;
}

std::string describe(const BatchSplit& s, int64_t tokens, int64_t seq_len, int64_t ranks) {
  return cat(tokens, " tokens = ", ranks, " ranks x ", s.micro_batches, " micro-batches x ", s.micro_batch,
             " sequences x ", seq_len, " tokens");
}

}  // namespace amsp::engine
