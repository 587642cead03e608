// LLaMA forward and backward, unit by unit, on a compute backend. This file
// owns the activation buffers and wires the backend's kernels together as
// transformers' LlamaForCausalLM does; the math lives in the backend.
#include "model/llama.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"

namespace amsp::model {

using backend::Buffer;
using backend::View;

namespace {

// Saved activations of one decoder layer (its input is Impl::resid[l]).
struct LayerActs {
  Buffer qkv;          // q, k, v side by side, before RoPE: [N, hidden + 2 kv_dim] (product dtype)
  Buffer saved;        // what attention keeps for backward (the backend says how much)
  Buffer attn;         // attention output before o_proj [N, hidden] (product dtype)
  Buffer h;            // x + o_proj(attn) [N, hidden]
  Buffer gate_up;      // gate and up side by side: [N, 2 intermediate] (product dtype)
  Buffer inv1, inv2;   // RMSNorm 1/rms per row [N]
};

// Offsets of a decoder unit's tensors, in layout order.
enum DecoderTensor { kInNorm, kQ, kK, kV, kO, kPostNorm, kGate, kUp, kDown };

}  // namespace

struct Llama::Impl {
  backend::Backend& be;
  LlamaConfig cfg;
  std::vector<UnitSpec> units;
  int64_t max_batch, max_seq_len;
  bool recompute = false;  // one LayerActs for all layers, rebuilt in backward
  int64_t allocated = 0;   // bytes allocate() took from the backend
  int64_t hidden, kv_dim, inter, vocab, heads, kv_heads, head_dim, layers;
  float eps;

  Buffer tokens, targets;  // int32 [max N]
  bool has_targets = false, has_batch = false;
  int64_t B = 0, T = 0, N = 0;
  float grad_scale = 1.0f;

  Buffer rope_cos, rope_sin;   // [max_seq_len, head_dim/2]
  std::vector<Buffer> resid;   // L+1 residual streams [N, hidden]
  std::vector<LayerActs> acts;
  Buffer head_inv, logits, lse;  // head: [N], [N, vocab], [N]
  // Scratch, shared by all layers. n, dn, dattn, dqkv, act, dgate_up (and
  // each layer's qkv, attn and gate_up, and the logits) are in the products'
  // dtype (`product_dtype`): only matrix products, attention and the norms,
  // RoPE, SwiGLU and loss around them read them, and under bf16 compute the
  // products and attention round what they read, and write, to bf16 anyway.
  // The residual stream (resid, each layer's h, dres) stays fp32; dres_p is
  // dres rounded once for the two products that read it (under bf16 compute),
  // by the RMSNorm backward that last added to dres.
  Buffer n, dn, dres, dres_p, dattn, dqkv, act, dgate_up;
  DType product_dtype = DType::kF32;

  double loss_sum = 0.0;
  int64_t loss_count = 0;
  View loss_acc;  // when set, the head's forward adds its loss here (accumulate_loss_into)

  explicit Impl(backend::Backend& b) : be(b) {}

  Buffer f32(int64_t count) { return be.alloc(DType::kF32, count); }
  Buffer product_side(int64_t count) { return be.alloc(product_dtype, count); }
  // A residual gradient as the products read it: itself, or under bf16
  // compute dres_p, which the RMSNorm backward that last added to it rounded
  // once for both products (which would each round it to bf16 on the way in).
  // Every writer of dres is one of rmsnorm_backward below, each given
  // rounded_dres(dr).
  View product_input(const View& dr) const {
    return product_dtype == DType::kF32 ? dr : dres_p.at(0, dr.count);
  }
  View rounded_dres(const View& dr) const {
    return product_dtype == DType::kF32 ? View{} : dres_p.at(0, dr.count);
  }
  // The first N rows of an activation buffer [rows, width].
  View rows(const Buffer& b, int64_t width) const { return b.at(0, N * width); }
  // The tables attention's backward rotates dq and dk back by.
  backend::RopeTables rope() const { return {rope_cos.view(), rope_sin.view()}; }
  View tensor(const View& flat, int unit, int index) const {
    const TensorSpec& t = units[unit].tensors[index];
    return flat.at(t.offset, t.numel);
  }
  // Tensors first..last of a unit, adjacent in the layout, as one [rows, in]
  // matrix: q, k and v (or gate and up) are one product's weight.
  View tensors(const View& flat, int unit, int first, int last) const {
    const TensorSpec& a = units[unit].tensors[first];
    const TensorSpec& b = units[unit].tensors[last];
    return flat.at(a.offset, b.offset + b.numel - a.offset);
  }

  void allocate();
  LayerActs& layer_acts(int layer) { return acts[recompute ? 0 : static_cast<size_t>(layer)]; }
  void forward_decoder(int u, const View& p);
  void backward_mlp(int u, const View& p, const View& g, float beta);
  void backward_attention(int u, const View& p, const View& g, float beta);
  void set_batch(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                 float grad_scale, bool pinned);
  void forward_head(int u, const View& p);
  void backward_head(int u, const View& p, const View& g, float beta);
};

void Llama::Impl::allocate() {
  const int64_t before = be.memory().in_use;
  const int64_t Nmax = max_batch * max_seq_len;
  tokens = be.alloc(DType::kI32, Nmax);
  targets = be.alloc(DType::kI32, Nmax);
  rope_cos = f32(max_seq_len * head_dim / 2);
  rope_sin = f32(max_seq_len * head_dim / 2);
  be.rope_table(rope_cos.view(), rope_sin.view(), max_seq_len, head_dim, cfg.rope_theta);
  for (int64_t l = 0; l <= layers; ++l) resid.push_back(f32(Nmax * hidden));
  acts.resize(static_cast<size_t>(recompute ? 1 : layers));
  for (auto& a : acts) {
    a.qkv = product_side(Nmax * (hidden + 2 * kv_dim));
    a.saved = f32(be.attention_saved_count(max_batch, max_seq_len, heads));
    a.attn = product_side(Nmax * hidden);
    a.h = f32(Nmax * hidden);
    a.gate_up = product_side(Nmax * 2 * inter);
    a.inv1 = f32(Nmax);
    a.inv2 = f32(Nmax);
  }
  head_inv = f32(Nmax);
  logits = product_side(Nmax * vocab);
  lse = f32(Nmax);
  for (Buffer* b : {&n, &dn}) *b = product_side(Nmax * hidden);
  dres = f32(Nmax * hidden);
  if (product_dtype != DType::kF32) dres_p = product_side(Nmax * hidden);
  dattn = product_side(Nmax * hidden);
  dqkv = product_side(Nmax * (hidden + 2 * kv_dim));
  act = product_side(Nmax * inter);
  dgate_up = product_side(Nmax * 2 * inter);
  allocated = be.memory().in_use - before;
}

Llama::Llama(const LlamaConfig& config, backend::Backend& backend, int64_t max_batch,
             int64_t max_seq_len, bool recompute)
    : impl_(new Impl(backend)) {
  Impl& m = *impl_;
  config.validate();
  if (max_batch <= 0 || max_seq_len <= 0)
    fail_usage("model: batch size ", max_batch, " and sequence length ", max_seq_len,
               " must be positive");
  m.cfg = config;
  m.units = build_layout(config);
  m.max_batch = max_batch;
  m.max_seq_len = max_seq_len;
  m.recompute = recompute;
  m.hidden = config.hidden_size;
  m.kv_dim = config.kv_dim();
  m.inter = config.intermediate_size;
  m.vocab = config.vocab_size;
  m.heads = config.num_attention_heads;
  m.kv_heads = config.num_key_value_heads;
  m.head_dim = config.head_dim();
  m.layers = config.num_hidden_layers;
  m.eps = static_cast<float>(config.rms_norm_eps);
  m.product_dtype = backend.compute();
  m.allocate();
}

Llama::~Llama() { delete impl_; }

const LlamaConfig& Llama::config() const { return impl_->cfg; }
const std::vector<UnitSpec>& Llama::units() const { return impl_->units; }
int Llama::num_units() const { return static_cast<int>(impl_->units.size()); }
int64_t Llama::activation_bytes() const { return impl_->allocated; }

void Llama::set_batch(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                      float grad_scale) {
  impl_->set_batch(tokens, targets, B, T, grad_scale, false);
}

void Llama::set_batch_pinned(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                             float grad_scale) {
  impl_->set_batch(tokens, targets, B, T, grad_scale, true);
}

void Llama::accumulate_loss_into(const View& acc) { impl_->loss_acc = acc; }

void Llama::Impl::set_batch(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                            float grad_scale, bool pinned) {
  Impl& m = *this;
  if (B <= 0 || T <= 0 || B > m.max_batch || T > m.max_seq_len)
    fail("model: micro-batch ", B, " x ", T, " does not fit the allocated ", m.max_batch, " x ",
         m.max_seq_len);
  m.B = B;
  m.T = T;
  m.N = B * T;
  // Checked here, on the host: a device backend's embedding kernels do not
  // read the ids back to check them.
  for (int64_t i = 0; i < m.N; ++i)
    if (tokens[i] < 0 || tokens[i] >= m.vocab)
      fail("model: token ", tokens[i], " at position ", i, " of the micro-batch is outside the vocabulary of ",
           m.vocab);
  auto upload = [&](const int32_t* src, const View& dst) {
    if (pinned)
      m.be.from_host_async(src, dst);
    else
      m.be.from_host(src, dst);
  };
  upload(tokens, m.tokens.at(0, m.N));
  m.has_targets = targets != nullptr;
  if (m.has_targets) upload(targets, m.targets.at(0, m.N));
  m.has_batch = true;
  m.grad_scale = grad_scale;
  m.loss_sum = 0.0;
  m.loss_count = 0;
}

void Llama::forward(int unit, const View& params) {
  Impl& m = *impl_;
  if (!m.has_batch) fail("model: forward before set_batch");
  if (unit < 0 || unit >= num_units()) fail("model: no unit ", unit);
  switch (m.units[unit].kind) {
    case UnitKind::kEmbedding:
      m.be.embedding_forward(m.tokens.at(0, m.N), params.at(0, m.units[unit].numel),
                             m.rows(m.resid[0], m.hidden), m.N, m.hidden);
      break;
    case UnitKind::kDecoder:
      m.forward_decoder(unit, params);
      break;
    case UnitKind::kHead:
      m.forward_head(unit, params);
      break;
  }
}

void Llama::backward(int unit, const View& params, const View& grads, Grads mode, int part) {
  Impl& m = *impl_;
  if (!m.has_batch) fail("model: backward before set_batch");
  if (unit < 0 || unit >= num_units()) fail("model: no unit ", unit);
  if (part != kAllParts) {
    const int parts = static_cast<int>(backward_parts(m.units[unit]).size());
    if (part < 0 || part >= parts)
      fail("model: backward of ", m.units[unit].name, " has ", parts, " parts, not part ", part);
  }
  // Every gradient of a unit but the embedding's is one product or one norm's
  // sum, written by it (beta 0) or added (beta 1); the embedding adds rows.
  const float beta = mode == Grads::kAdd ? 1.0f : 0.0f;
  switch (m.units[unit].kind) {
    case UnitKind::kEmbedding: {
      const View table = grads.at(0, m.units[unit].numel);
      if (mode == Grads::kWrite) m.be.fill_zero(table);
      m.be.embedding_backward(m.tokens.at(0, m.N), m.rows(m.dres, m.hidden), table, m.N, m.hidden);
      break;
    }
    case UnitKind::kDecoder:
      // Its parts (layout.h: backward_parts): 0 the MLP block, 1 the attention block.
      if (part == kAllParts || part == 0) m.backward_mlp(unit, params, grads, beta);
      if (part == kAllParts || part == 1) m.backward_attention(unit, params, grads, beta);
      break;
    case UnitKind::kHead:
      m.backward_head(unit, params, grads, beta);
      break;
  }
}

void Llama::Impl::forward_decoder(int u, const View& p) {
  const int l = units[u].layer;
  LayerActs& a = layer_acts(l);
  const View x = rows(resid[l], hidden), out = rows(resid[l + 1], hidden);
  const int64_t qkv_dim = hidden + 2 * kv_dim;
  const View nn = rows(n, hidden), qkv = rows(a.qkv, qkv_dim), attn = rows(a.attn, hidden),
             h = rows(a.h, hidden), gate_up = rows(a.gate_up, 2 * inter), ac = rows(act, inter);
  const View inv1 = a.inv1.at(0, N), inv2 = a.inv2.at(0, N);

  // Attention block: h = x + o_proj(attn(rope(q), rope(k), v)) of input_layernorm(x).
  be.rmsnorm_forward(x, tensor(p, u, kInNorm), nn, inv1, N, hidden, eps);
  // One product over the adjacent q, k and v weights: each row of qkv is [q | k | v].
  be.linear_forward(nn, tensors(p, u, kQ, kV), qkv, N, hidden, qkv_dim, 0.0f);
  // q and k rotated in place, once, in one pass over their adjacent heads
  // (attention's backward rotates dq and dk back itself; doc/gpu.md says why
  // attention does not rotate them as it reads them).
  be.rope_forward(qkv, rope_cos.view(), rope_sin.view(), B, T, heads + kv_heads, head_dim, qkv_dim);
  be.attention_forward(qkv, a.saved.view(), attn, B, T, heads, kv_heads, head_dim);
  be.linear_forward_residual(attn, tensor(p, u, kO), x, h, N, hidden, hidden);

  // MLP block: out = h + down_proj(silu(gate_proj(n)) * up_proj(n)), n = post_attention_layernorm(h).
  be.rmsnorm_forward(h, tensor(p, u, kPostNorm), nn, inv2, N, hidden, eps);
  // One product over the adjacent gate and up weights: each row of gate_up is [gate | up].
  be.linear_forward(nn, tensors(p, u, kGate, kUp), gate_up, N, hidden, 2 * inter, 0.0f);
  be.swiglu_forward(gate_up, ac, N, inter);
  be.linear_forward_residual(ac, tensor(p, u, kDown), h, out, N, inter, hidden);
}

// The MLP block's backward, the first of a decoder layer's two parts
// (layout.h: backward_parts); dres holds d(out) on entry and d(h) on exit.
void Llama::Impl::backward_mlp(int u, const View& p, const View& g, float beta) {
  // Recomputation: rebuild the layer's activations from its kept input. It
  // also rewrites resid[l + 1] with the same bits, which no later backward reads.
  if (recompute) forward_decoder(u, p);
  LayerActs& a = layer_acts(units[u].layer);
  const View nn = rows(n, hidden), dnn = rows(dn, hidden), dr = rows(dres, hidden),
             h = rows(a.h, hidden), gate_up = rows(a.gate_up, 2 * inter),
             dgu = rows(dgate_up, 2 * inter), ac = rows(act, inter), inv2 = a.inv2.at(0, N);
  be.swiglu_forward(gate_up, ac, N, inter);
  const View dout = product_input(dr);
  be.linear_backward_weight(dout, ac, tensor(g, u, kDown), N, inter, hidden, beta);
  // act is no longer needed: d(act) goes into it.
  be.linear_backward_input(dout, tensor(p, u, kDown), ac, N, inter, hidden, 0.0f);
  be.swiglu_backward(gate_up, ac, dgu, N, inter);
  be.rmsnorm_apply(h, tensor(p, u, kPostNorm), inv2, nn, N, hidden);
  be.linear_backward_weight(dgu, nn, tensors(g, u, kGate, kUp), N, hidden, 2 * inter, beta);
  be.linear_backward_input(dgu, tensors(p, u, kGate, kUp), dnn, N, hidden, 2 * inter, 0.0f);
  be.rmsnorm_backward(dnn, h, tensor(p, u, kPostNorm), inv2, dr, tensor(g, u, kPostNorm), N, hidden,
                      rounded_dres(dr), beta);
}

// The attention block's backward, the second part: dres holds d(h) on entry
// and d(x) on exit.
void Llama::Impl::backward_attention(int u, const View& p, const View& g, float beta) {
  const int l = units[u].layer;
  LayerActs& a = layer_acts(l);
  const int64_t qkv_dim = hidden + 2 * kv_dim;
  const View x = rows(resid[l], hidden), nn = rows(n, hidden), dnn = rows(dn, hidden),
             dr = rows(dres, hidden), attn = rows(a.attn, hidden), da = rows(dattn, hidden),
             qkv = rows(a.qkv, qkv_dim), dq = rows(dqkv, qkv_dim), inv1 = a.inv1.at(0, N);
  const View dh = product_input(dr);
  be.linear_backward_weight(dh, attn, tensor(g, u, kO), N, hidden, hidden, beta);
  be.linear_backward_input(dh, tensor(p, u, kO), da, N, hidden, hidden, 0.0f);
  be.attention_backward(qkv, rope(), a.saved.view(), attn, da, dq, B, T, heads, kv_heads, head_dim);
  be.rmsnorm_apply(x, tensor(p, u, kInNorm), inv1, nn, N, hidden);
  be.linear_backward_weight(dq, nn, tensors(g, u, kQ, kV), N, hidden, qkv_dim, beta);
  be.linear_backward_input(dq, tensors(p, u, kQ, kV), dnn, N, hidden, qkv_dim, 0.0f);
  // d(x) of the first layer goes to the embedding, which reads it in fp32.
  be.rmsnorm_backward(dnn, x, tensor(p, u, kInNorm), inv1, dr, tensor(g, u, kInNorm), N, hidden,
                      l > 0 ? rounded_dres(dr) : View{}, beta);
}

void Llama::Impl::forward_head(int u, const View& p) {
  const View x = rows(resid[layers], hidden), nn = rows(n, hidden), lg = rows(logits, vocab);
  be.rmsnorm_forward(x, tensor(p, u, 0), nn, head_inv.at(0, N), N, hidden, eps);
  be.linear_forward(nn, tensor(p, u, 1), lg, N, hidden, vocab, 0.0f);
  // Without targets (inference), logits only.
  loss_sum = 0.0;
  loss_count = 0;
  if (has_targets && !loss_acc.empty()) {
    be.cross_entropy_forward_into(lg, targets.at(0, N), lse.at(0, N), N, vocab, loss_acc);
  } else if (has_targets) {
    const backend::LossSum l = be.cross_entropy_forward(lg, targets.at(0, N), lse.at(0, N), N, vocab);
    loss_sum = l.sum;
    loss_count = l.count;
  }
}

void Llama::Impl::backward_head(int u, const View& p, const View& g, float beta) {
  if (!has_targets) fail("model: backward of a batch without targets");
  const View x = rows(resid[layers], hidden), nn = rows(n, hidden), dnn = rows(dn, hidden),
             dr = rows(dres, hidden), lg = rows(logits, vocab);
  be.cross_entropy_backward(lg, targets.at(0, N), lse.at(0, N), N, vocab, grad_scale);
  be.rmsnorm_apply(x, tensor(p, u, 0), head_inv.at(0, N), nn, N, hidden);
  be.linear_backward_weight(lg, nn, tensor(g, u, 1), N, hidden, vocab, beta);
  be.linear_backward_input(lg, tensor(p, u, 1), dnn, N, hidden, vocab, 0.0f);
  be.fill_zero(dr);
  be.rmsnorm_backward(dnn, x, tensor(p, u, 0), head_inv.at(0, N), dr, tensor(g, u, 0), N, hidden,
                      rounded_dres(dr), beta);
}

double Llama::loss_sum() const { return impl_->loss_sum; }
int64_t Llama::loss_count() const { return impl_->loss_count; }
backend::View Llama::logits() const { return impl_->rows(impl_->logits, impl_->vocab); }

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
  init_unit_params(unit, unit_index, seed, 0, unit.numel, params);
}

void init_unit_params(const UnitSpec& unit, int unit_index, uint64_t seed, int64_t begin, int64_t end,
                      float* out) {
  for (const TensorSpec& t : unit.tensors) {
    // The part of [begin, end) that falls in this tensor, as element indices of the unit.
    const int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo >= hi) continue;
    float* dst = out + (lo - begin);
    if (t.is_norm) {
      std::fill(dst, dst + (hi - lo), 1.0f);
      continue;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = lo; i < hi; ++i)
      dst[i - lo] = static_cast<float>(0.02 * random_normal(seed, static_cast<uint64_t>(unit_index),
                                                            static_cast<uint64_t>(i)));
  }
}

}  // namespace amsp::model
