// The small model the planner's tests share: its units need padding on 4 ranks
// (embed 7x6 = 42, each layer 2*6 + 36 + 2*36 + 36 + 3*5*6 = 246, head 6 + 42
// = 48), so every rounding in the plan shows.
#pragma once

#include "plan/memory.h"

namespace amsp::plan::testing {

inline model::LlamaConfig odd_config() {
  model::LlamaConfig c;
  c.hidden_size = 6;
  c.intermediate_size = 5;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 3;
  c.vocab_size = 7;
  c.max_position_embeddings = 16;
  return c;
}

// Sequence 4, one sequence per micro-batch.
inline Workload odd_workload(Precision precision = Precision::kBf16) {
  Workload w;
  w.model = odd_config();
  w.seq_len = 4;
  w.micro_batch = 1;
  w.precision = precision;
  return w;
}

}  // namespace amsp::plan::testing
