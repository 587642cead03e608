// LLaMA forward and backward, one unit at a time, on a compute backend
// (backend/backend.h): the model allocates through it and runs only its kernels.
//
// The caller owns parameters and gradients (one flat buffer per unit, see
// layout.h, fp32 or bf16 on the backend's device) and hands them in per call,
// because under sharding they come from an all-gather into a temporary buffer.
// The model owns the activations of one micro-batch, kept from forward for
// backward.
//
// A micro-batch step is:
//   set_batch(tokens, targets, B, T, grad_scale);
//   for u in 0..num_units-1:       forward(u, params[u]);     // head's forward computes the loss
//   for u in num_units-1..0:       backward(u, params[u], grads[u], Grads::kAdd);
// backward accumulates (+=) into grads, so micro-batches sum, or with
// Grads::kWrite writes them (the first micro-batch: no zeroing pass); grad_scale
// multiplies d(loss)/d(logits), so with grad_scale = 1 / (tokens in the whole
// optimizer step) the summed gradients are those of the mean loss.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/layout.h"

namespace amsp::model {

class Llama {
 public:
  // Allocates activations on `backend` (which must outlive the model) for
  // micro-batches of up to max_batch sequences of up to max_seq_len tokens.
  // With recompute, forward keeps only each decoder layer's input and one
  // layer's working set; backward runs the layer's forward again first (the
  // same kernels on the same inputs: the same bits) and then its backward.
  Llama(const LlamaConfig& config, backend::Backend& backend, int64_t max_batch,
        int64_t max_seq_len, bool recompute = false);
  ~Llama();
  Llama(const Llama&) = delete;
  Llama& operator=(const Llama&) = delete;

  const LlamaConfig& config() const;
  const std::vector<UnitSpec>& units() const;
  int num_units() const;

  // tokens and targets are host arrays [B*T] row-major (sequence-major),
  // copied to the device; targets may be null (inference); a target < 0 is
  // ignored by the loss. A token id outside [0, vocab_size) is an Error (checked
  // on the host, before anything is copied).
  void set_batch(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                 float grad_scale);
  // The same from memory of the backend's alloc_host, copied without waiting:
  // the caller leaves it untouched until the backend next synchronises.
  void set_batch_pinned(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                        float grad_scale);
  // With acc set (fp64 [4] on the backend), the head's forward adds its loss
  // into acc (Backend::cross_entropy_forward_into) and loss_sum() and
  // loss_count() stay 0: nothing is read back. An empty view goes back.
  void accumulate_loss_into(const backend::View& acc);

  // params: the unit's flat buffer; grads: its gradient buffer, which backward
  // adds into (kAdd) or writes whole, never reading what was there (kWrite).
  // Either dtype the backend takes (fp32 or bf16).
  // part: one of the unit's backward parts (layout.h: backward_parts), run
  // in their order (a later part reads what the earlier left in the model's
  // activation gradients), or all of them; the same kernels either way.
  enum class Grads { kAdd, kWrite };
  static constexpr int kAllParts = -1;
  void forward(int unit, const backend::View& params);
  void backward(int unit, const backend::View& params, const backend::View& grads, Grads mode,
                int part = kAllParts);

  // After the head's forward: sum of per-token cross-entropy over valid
  // targets, and how many targets were valid.
  double loss_sum() const;
  int64_t loss_count() const;
  // After the head's forward: logits [B*T, vocab_size] on the device, in the
  // backend's compute dtype (fp32, or bf16: what the bf16 product wrote).
  // Backward overwrites them with d(loss)/d(logits), so read them before.
  backend::View logits() const;

  // Bytes the model allocated on its backend: activations kept for backward,
  // scratch, RoPE tables, token ids (plan::model_activation_bytes counts them).
  int64_t activation_bytes() const;

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
// Elements [begin, end) of the same buffer into out[0, end - begin), drawn
// alone (the generator is counter-based): a rank draws only the shard it
// keeps. Elements past the unit's numel (padding) are left as they are.
void init_unit_params(const UnitSpec& unit, int unit_index, uint64_t seed, int64_t begin, int64_t end,
                      float* out);

}  // namespace amsp::model
