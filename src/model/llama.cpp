// LLaMA forward and backward on the CPU, unit by unit. The math lives in
// kernels/cpu (see ops.h); this file owns the activation buffers and wires the
// kernels together as transformers' LlamaForCausalLM does.
#include "model/llama.h"

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/ops.h"

namespace amsp::model {

namespace k = amsp::kernels;

namespace {

// Parallel copy: the residual stream is copied twice per layer.
void copy(float* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

void zero(float* dst, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = 0.0f;
}

// Saved activations of one decoder layer (its input is Impl::resid[l]).
struct LayerActs {
  std::vector<float> q, k, v;  // after RoPE: [N, hidden], [N, kv_dim] x2
  std::vector<float> probs;    // [B, heads, T, T]
  std::vector<float> attn;     // attention output before o_proj [N, hidden]
  std::vector<float> h;        // x + o_proj(attn) [N, hidden]
  std::vector<float> gate, up; // [N, intermediate]
  std::vector<float> inv1, inv2;  // RMSNorm 1/rms per row [N]
};

// Offsets of a decoder unit's tensors, in layout order.
enum DecoderTensor { kInNorm, kQ, kK, kV, kO, kPostNorm, kGate, kUp, kDown };

}  // namespace

struct Llama::Impl {
  LlamaConfig cfg;
  std::vector<UnitSpec> units;
  int64_t max_batch, max_seq_len;
  int64_t hidden, kv_dim, inter, vocab, heads, kv_heads, head_dim, layers;
  float eps;

  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  int64_t B = 0, T = 0, N = 0;
  float grad_scale = 1.0f;

  std::vector<float> rope_cos, rope_sin;     // [max_seq_len, head_dim/2]
  std::vector<std::vector<float>> resid;     // L+1 residual streams [N, hidden]
  std::vector<LayerActs> acts;
  std::vector<float> head_inv, logits, lse;  // head: [N], [N, vocab], [N]
  // Scratch, shared by all layers.
  std::vector<float> n, dn, dres, dattn, dq, dk, dv, act, dact;

  double loss_sum = 0.0;
  int64_t loss_count = 0;

  const float* tensor(const float* params, int unit, int index) const {
    return params + units[unit].tensors[index].offset;
  }
  float* tensor(float* grads, int unit, int index) const {
    return grads + units[unit].tensors[index].offset;
  }

  void forward_decoder(int u, const float* p);
  void backward_decoder(int u, const float* p, float* g);
  void forward_head(int u, const float* p);
  void backward_head(int u, const float* p, float* g);
};

Llama::Llama(const LlamaConfig& config, int64_t max_batch, int64_t max_seq_len)
    : impl_(new Impl) {
  Impl& m = *impl_;
  config.validate();
  if (max_batch <= 0 || max_seq_len <= 0)
    fail_usage("model: batch size ", max_batch, " and sequence length ", max_seq_len,
               " must be positive");
  m.cfg = config;
  m.units = build_layout(config);
  m.max_batch = max_batch;
  m.max_seq_len = max_seq_len;
  m.hidden = config.hidden_size;
  m.kv_dim = config.kv_dim();
  m.inter = config.intermediate_size;
  m.vocab = config.vocab_size;
  m.heads = config.num_attention_heads;
  m.kv_heads = config.num_key_value_heads;
  m.head_dim = config.head_dim();
  m.layers = config.num_hidden_layers;
  m.eps = static_cast<float>(config.rms_norm_eps);

  const int64_t N = max_batch * max_seq_len;
  m.rope_cos.resize(max_seq_len * m.head_dim / 2);
  m.rope_sin.resize(max_seq_len * m.head_dim / 2);
  k::rope_table(m.rope_cos.data(), m.rope_sin.data(), max_seq_len, m.head_dim, config.rope_theta);

  m.resid.resize(m.layers + 1);
  for (auto& r : m.resid) r.resize(N * m.hidden);
  m.acts.resize(m.layers);
  for (auto& a : m.acts) {
    a.q.resize(N * m.hidden);
    a.k.resize(N * m.kv_dim);
    a.v.resize(N * m.kv_dim);
    a.probs.resize(max_batch * m.heads * max_seq_len * max_seq_len);
    a.attn.resize(N * m.hidden);
    a.h.resize(N * m.hidden);
    a.gate.resize(N * m.inter);
    a.up.resize(N * m.inter);
    a.inv1.resize(N);
    a.inv2.resize(N);
  }
  m.head_inv.resize(N);
  m.logits.resize(N * m.vocab);
  m.lse.resize(N);
  for (auto* s : {&m.n, &m.dn, &m.dres, &m.dattn, &m.dq}) s->resize(N * m.hidden);
  m.dk.resize(N * m.kv_dim);
  m.dv.resize(N * m.kv_dim);
  m.act.resize(N * m.inter);
  m.dact.resize(N * m.inter);
}

Llama::~Llama() { delete impl_; }

const LlamaConfig& Llama::config() const { return impl_->cfg; }
const std::vector<UnitSpec>& Llama::units() const { return impl_->units; }
int Llama::num_units() const { return static_cast<int>(impl_->units.size()); }

void Llama::set_batch(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                      float grad_scale) {
  Impl& m = *impl_;
  if (B <= 0 || T <= 0 || B > m.max_batch || T > m.max_seq_len)
    fail("model: micro-batch ", B, " x ", T, " does not fit the allocated ", m.max_batch, " x ",
         m.max_seq_len);
  m.tokens = tokens;
  m.targets = targets;
  m.B = B;
  m.T = T;
  m.N = B * T;
  m.grad_scale = grad_scale;
  m.loss_sum = 0.0;
  m.loss_count = 0;
}

void Llama::forward(int unit, const float* params) {
  Impl& m = *impl_;
  if (m.tokens == nullptr) fail("model: forward before set_batch");
  if (unit < 0 || unit >= num_units()) fail("model: no unit ", unit);
  switch (m.units[unit].kind) {
    case UnitKind::kEmbedding:
      k::embedding_forward(m.tokens, params, m.resid[0].data(), m.N, m.hidden);
      break;
    case UnitKind::kDecoder:
      m.forward_decoder(unit, params);
      break;
    case UnitKind::kHead:
      m.forward_head(unit, params);
      break;
  }
}

void Llama::backward(int unit, const float* params, float* grads) {
  Impl& m = *impl_;
  if (m.tokens == nullptr) fail("model: backward before set_batch");
  if (unit < 0 || unit >= num_units()) fail("model: no unit ", unit);
  switch (m.units[unit].kind) {
    case UnitKind::kEmbedding:
      k::embedding_backward(m.tokens, m.dres.data(), grads, m.N, m.hidden);
      break;
    case UnitKind::kDecoder:
      m.backward_decoder(unit, params, grads);
      break;
    case UnitKind::kHead:
      m.backward_head(unit, params, grads);
      break;
  }
}

void Llama::Impl::forward_decoder(int u, const float* p) {
  const int l = units[u].layer;
  LayerActs& a = acts[l];
  const float* x = resid[l].data();
  float* out = resid[l + 1].data();

  // Attention block: h = x + o_proj(attn(rope(q), rope(k), v)) of input_layernorm(x).
  k::rmsnorm_forward(x, tensor(p, u, kInNorm), n.data(), a.inv1.data(), N, hidden, eps);
  k::linear_forward(n.data(), tensor(p, u, kQ), a.q.data(), N, hidden, hidden);
  k::linear_forward(n.data(), tensor(p, u, kK), a.k.data(), N, hidden, kv_dim);
  k::linear_forward(n.data(), tensor(p, u, kV), a.v.data(), N, hidden, kv_dim);
  k::rope_forward(a.q.data(), rope_cos.data(), rope_sin.data(), B, T, heads, head_dim, hidden);
  k::rope_forward(a.k.data(), rope_cos.data(), rope_sin.data(), B, T, kv_heads, head_dim, kv_dim);
  k::attention_forward(a.q.data(), a.k.data(), a.v.data(), a.probs.data(), a.attn.data(), B, T,
                       heads, kv_heads, head_dim);
  copy(a.h.data(), x, N * hidden);
  k::linear_forward(a.attn.data(), tensor(p, u, kO), a.h.data(), N, hidden, hidden, 1.0f);

  // MLP block: out = h + down_proj(silu(gate_proj(n)) * up_proj(n)), n = post_attention_layernorm(h).
  k::rmsnorm_forward(a.h.data(), tensor(p, u, kPostNorm), n.data(), a.inv2.data(), N, hidden, eps);
  k::linear_forward(n.data(), tensor(p, u, kGate), a.gate.data(), N, hidden, inter);
  k::linear_forward(n.data(), tensor(p, u, kUp), a.up.data(), N, hidden, inter);
  k::swiglu_forward(a.gate.data(), a.up.data(), act.data(), N * inter);
  copy(out, a.h.data(), N * hidden);
  k::linear_forward(act.data(), tensor(p, u, kDown), out, N, inter, hidden, 1.0f);
}

void Llama::Impl::backward_decoder(int u, const float* p, float* g) {
  const int l = units[u].layer;
  LayerActs& a = acts[l];
  const float* x = resid[l].data();
  // dres holds d(out) on entry and d(x) on exit.

  // MLP block.
  k::swiglu_forward(a.gate.data(), a.up.data(), act.data(), N * inter);
  k::linear_backward_weight(dres.data(), act.data(), tensor(g, u, kDown), N, inter, hidden);
  k::linear_backward_input(dres.data(), tensor(p, u, kDown), dact.data(), N, inter, hidden);
  // d(gate) into act (no longer needed), d(up) over d(act) in place.
  k::swiglu_backward(a.gate.data(), a.up.data(), dact.data(), act.data(), dact.data(), N * inter);
  k::rmsnorm_apply(a.h.data(), tensor(p, u, kPostNorm), a.inv2.data(), n.data(), N, hidden);
  k::linear_backward_weight(act.data(), n.data(), tensor(g, u, kGate), N, hidden, inter);
  k::linear_backward_weight(dact.data(), n.data(), tensor(g, u, kUp), N, hidden, inter);
  k::linear_backward_input(act.data(), tensor(p, u, kGate), dn.data(), N, hidden, inter);
  k::linear_backward_input(dact.data(), tensor(p, u, kUp), dn.data(), N, hidden, inter, 1.0f);
  k::rmsnorm_backward(dn.data(), a.h.data(), tensor(p, u, kPostNorm), a.inv2.data(), dres.data(),
                      tensor(g, u, kPostNorm), N, hidden);

  // Attention block; dres is now d(h).
  k::linear_backward_weight(dres.data(), a.attn.data(), tensor(g, u, kO), N, hidden, hidden);
  k::linear_backward_input(dres.data(), tensor(p, u, kO), dattn.data(), N, hidden, hidden);
  k::attention_backward(a.q.data(), a.k.data(), a.v.data(), a.probs.data(), dattn.data(),
                        dq.data(), dk.data(), dv.data(), B, T, heads, kv_heads, head_dim);
  k::rope_backward(dq.data(), rope_cos.data(), rope_sin.data(), B, T, heads, head_dim, hidden);
  k::rope_backward(dk.data(), rope_cos.data(), rope_sin.data(), B, T, kv_heads, head_dim, kv_dim);
  k::rmsnorm_apply(x, tensor(p, u, kInNorm), a.inv1.data(), n.data(), N, hidden);
  k::linear_backward_weight(dq.data(), n.data(), tensor(g, u, kQ), N, hidden, hidden);
  k::linear_backward_weight(dk.data(), n.data(), tensor(g, u, kK), N, hidden, kv_dim);
  k::linear_backward_weight(dv.data(), n.data(), tensor(g, u, kV), N, hidden, kv_dim);
  k::linear_backward_input(dq.data(), tensor(p, u, kQ), dn.data(), N, hidden, hidden);
  k::linear_backward_input(dk.data(), tensor(p, u, kK), dn.data(), N, hidden, kv_dim, 1.0f);
  k::linear_backward_input(dv.data(), tensor(p, u, kV), dn.data(), N, hidden, kv_dim, 1.0f);
  k::rmsnorm_backward(dn.data(), x, tensor(p, u, kInNorm), a.inv1.data(), dres.data(),
                      tensor(g, u, kInNorm), N, hidden);
}

void Llama::Impl::forward_head(int u, const float* p) {
  const float* x = resid[layers].data();
  k::rmsnorm_forward(x, tensor(p, u, 0), n.data(), head_inv.data(), N, hidden, eps);
  k::linear_forward(n.data(), tensor(p, u, 1), logits.data(), N, hidden, vocab);
  // Without targets (inference), logits only.
  loss_sum = 0.0;
  loss_count = 0;
  if (targets != nullptr)
    loss_sum = k::cross_entropy_forward(logits.data(), targets, lse.data(), N, vocab, &loss_count);
}

void Llama::Impl::backward_head(int u, const float* p, float* g) {
  if (targets == nullptr) fail("model: backward of a batch without targets");
  const float* x = resid[layers].data();
  k::cross_entropy_backward(logits.data(), targets, lse.data(), N, vocab, grad_scale);
  k::rmsnorm_apply(x, tensor(p, u, 0), head_inv.data(), n.data(), N, hidden);
  k::linear_backward_weight(logits.data(), n.data(), tensor(g, u, 1), N, hidden, vocab);
  k::linear_backward_input(logits.data(), tensor(p, u, 1), dn.data(), N, hidden, vocab);
  zero(dres.data(), N * hidden);
  k::rmsnorm_backward(dn.data(), x, tensor(p, u, 0), head_inv.data(), dres.data(), tensor(g, u, 0),
                      N, hidden);
}

double Llama::loss_sum() const { return impl_->loss_sum; }
int64_t Llama::loss_count() const { return impl_->loss_count; }
const float* Llama::logits() const { return impl_->logits.data(); }

// FLOPs per token of one forward + backward, T = sequence length:
//
//   6 * N_matmul + 6 * L * hidden * T
//
// N_matmul counts the parameters that take part in matrix products: every
// weight except the token embedding (a lookup) and the RMSNorm weights, with
// the untied lm_head included. Each such weight costs 2 FLOPs per token forward
// and 4 backward (input and weight gradients).
//
// Attention scores: per layer and token, QK^T and PV each cost 2 * T * hidden
// forward over the full T x T matrix, 4 * T * hidden together, and three times
// that forward + backward: 12 * L * hidden * T, the PaLM/Megatron figure. We
// halve it for the causal mask (only the lower triangle is meaningful, and the
// kernels skip most of the upper one), giving 6 * L * hidden * T. With grouped-
// query attention the score work is still per query head, so hidden (= heads *
// head_dim) is the right width. Softmax, norms and elementwise ops are not counted.
double Llama::flops_per_token(const LlamaConfig& c, int64_t seq_len) {
  const double h = static_cast<double>(c.hidden_size), kv = static_cast<double>(c.kv_dim()),
               inter = static_cast<double>(c.intermediate_size),
               L = static_cast<double>(c.num_hidden_layers), V = static_cast<double>(c.vocab_size);
  const double matmul_params = L * (2 * h * h + 2 * kv * h + 3 * h * inter) + V * h;
  return 6.0 * matmul_params + 6.0 * L * h * static_cast<double>(seq_len);
}

void init_unit_params(const UnitSpec& unit, int unit_index, uint64_t seed, float* params) {
  for (const TensorSpec& t : unit.tensors) {
    float* dst = params + t.offset;
    if (t.is_norm) {
      for (int64_t i = 0; i < t.numel; ++i) dst[i] = 1.0f;
      continue;
    }
    const uint64_t base = static_cast<uint64_t>(t.offset);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < t.numel; ++i)
      dst[i] = static_cast<float>(0.02 * random_normal(seed, static_cast<uint64_t>(unit_index),
                                                      base + static_cast<uint64_t>(i)));
  }
}

}  // namespace amsp::model
