// LLaMA forward and backward on the CPU, fp32, one unit at a time.
//
// The caller owns parameters and gradients (one flat buffer per unit, see
// layout.h) and hands them in per call, because under sharding they come from
// an all-gather into a temporary buffer. The model owns the activations of one
// micro-batch, kept from forward for backward.
//
// A micro-batch step is:
//   set_batch(tokens, targets, B, T, grad_scale);
//   for u in 0..num_units-1:       forward(u, params[u]);     // head's forward computes the loss
//   for u in num_units-1..0:       backward(u, params[u], grads[u]);
// backward accumulates (+=) into grads, so micro-batches sum; grad_scale
// multiplies d(loss)/d(logits), so with grad_scale = 1 / (tokens in the whole
// optimizer step) the summed gradients are those of the mean loss.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/layout.h"

namespace amsp::model {

class Llama {
 public:
  // Allocates activations for micro-batches of up to max_batch sequences of up
  // to max_seq_len tokens.
  Llama(const LlamaConfig& config, int64_t max_batch, int64_t max_seq_len);
  ~Llama();
  Llama(const Llama&) = delete;
  Llama& operator=(const Llama&) = delete;

  const LlamaConfig& config() const;
  const std::vector<UnitSpec>& units() const;
  int num_units() const;

  // tokens and targets are [B*T] row-major (sequence-major); a target < 0 is
  // ignored by the loss. Pointers must stay valid until the last backward.
  // Token ids outside [0, vocab_size) are the caller's to reject.
  void set_batch(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                 float grad_scale);

  void forward(int unit, const float* params);
  void backward(int unit, const float* params, float* grads);

  // After the head's forward: sum of per-token cross-entropy over valid
  // targets, and how many targets were valid.
  double loss_sum() const;
  int64_t loss_count() const;
  // After the head's forward: logits [B*T, vocab_size]. Backward overwrites them
  // with d(loss)/d(logits), so read them before.
  const float* logits() const;

  // Model FLOPs of one forward+backward over B*T tokens (matmuls, and attention
  // scores with the causal half), the numerator of MFU. See doc/metrics.md.
  static double flops_per_token(const LlamaConfig& config, int64_t seq_len);

 private:
  struct Impl;
  Impl* impl_;
};

// Deterministic initialisation of one unit's flat buffer from (seed, unit
// index): normal(0, 0.02) for matrices, 1 for norms (as transformers'
// LlamaPreTrainedModel._init_weights does, with initializer_range 0.02).
void init_unit_params(const UnitSpec& unit, int unit_index, uint64_t seed, float* params);

}  // namespace amsp::model
