// Whole-model checks: layout, gradients against finite differences, gradient
// accumulation, ignored targets, determinism, initialisation, FLOPs.
#include "model/llama.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"

namespace amsp::model {
namespace {

// The fp32 CPU backend every test model runs on (one for the whole test binary).
backend::Backend* cpu() {
  static const auto be = backend::make_cpu_backend(DType::kF32);
  return be.get();
}

backend::View hv(std::vector<float>& v) {
  return backend::host_view(v.data(), static_cast<int64_t>(v.size()));
}
backend::View hv(const std::vector<float>& v) {
  return backend::host_view(v.data(), static_cast<int64_t>(v.size()));
}

LlamaConfig micro_config() {
  LlamaConfig c;
  c.name = "micro";
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 11;
  c.max_position_embeddings = 32;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  return c;
}

using Buffers = std::vector<std::vector<float>>;

// Parameters with larger-than-default spread so that every gradient is well
// above the fp32 noise of a finite difference.
Buffers make_params(const Llama& model, uint64_t seed, float matrix_scale = 15.0f) {
  Buffers p;
  for (int u = 0; u < model.num_units(); ++u) {
    const UnitSpec& unit = model.units()[u];
    p.emplace_back(unit.numel);
    init_unit_params(unit, u, seed, p.back().data());
    for (const TensorSpec& t : unit.tensors)
      for (int64_t i = 0; i < t.numel; ++i) {
        float& v = p.back()[t.offset + i];
        v = t.is_norm ? 1.0f + 0.2f * static_cast<float>(random_normal(seed + 1, u, t.offset + i))
                      : v * matrix_scale;
      }
  }
  return p;
}

Buffers zeros_like(const Buffers& b) {
  Buffers z;
  for (const auto& v : b) z.emplace_back(v.size(), 0.0f);
  return z;
}

double run_forward(Llama& m, const Buffers& p, const std::vector<int32_t>& tok,
                   const std::vector<int32_t>& tgt, int64_t B, int64_t T, float scale = 1.0f) {
  m.set_batch(tok.data(), tgt.data(), B, T, scale);
  for (int u = 0; u < m.num_units(); ++u) m.forward(u, hv(p[u]));
  return m.loss_sum();
}

void run_step(Llama& m, const Buffers& p, Buffers& g, const std::vector<int32_t>& tok,
              const std::vector<int32_t>& tgt, int64_t B, int64_t T, float scale = 1.0f) {
  run_forward(m, p, tok, tgt, B, T, scale);
  for (int u = m.num_units() - 1; u >= 0; --u)
    m.backward(u, hv(p[u]), hv(g[u]), model::Llama::Grads::kAdd);
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t stream) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(random_below(3, stream, i, vocab));
  return t;
}

TEST(Layout, MatchesConfigAndHuggingFaceNames) {
  LlamaConfig c = micro_config();
  const auto units = build_layout(c);
  ASSERT_EQ(units.size(), 4u);
  EXPECT_EQ(units[0].kind, UnitKind::kEmbedding);
  EXPECT_EQ(units[0].name, "embed");
  EXPECT_EQ(units[1].kind, UnitKind::kDecoder);
  EXPECT_EQ(units[1].layer, 0);
  EXPECT_EQ(units[2].name, "layers.1");
  EXPECT_EQ(units[3].kind, UnitKind::kHead);
  EXPECT_EQ(units[3].name, "head");

  int64_t total = 0;
  std::set<std::string> names;
  for (const auto& u : units) {
    int64_t off = 0;
    for (const auto& t : u.tensors) {
      EXPECT_EQ(t.offset, off) << t.name;
      int64_t n = 1;
      for (auto d : t.shape) n *= d;
      EXPECT_EQ(t.numel, n) << t.name;
      off += t.numel;
      EXPECT_TRUE(names.insert(t.name).second) << t.name;
    }
    EXPECT_EQ(u.numel, off);
    total += u.numel;
  }
  EXPECT_EQ(total, c.num_parameters());
  EXPECT_EQ(units[1].numel, c.num_parameters_per_layer());

  ASSERT_EQ(units[0].tensors.size(), 1u);
  EXPECT_EQ(units[0].tensors[0].name, "model.embed_tokens.weight");
  EXPECT_TRUE(units[0].tensors[0].is_embedding);
  EXPECT_EQ(units[0].tensors[0].shape, (std::vector<int64_t>{11, 16}));
  const std::vector<std::string> layer_names = {
      "input_layernorm.weight",      "self_attn.q_proj.weight", "self_attn.k_proj.weight",
      "self_attn.v_proj.weight",     "self_attn.o_proj.weight", "post_attention_layernorm.weight",
      "mlp.gate_proj.weight",        "mlp.up_proj.weight",      "mlp.down_proj.weight"};
  const std::vector<std::vector<int64_t>> layer_shapes = {{16},     {16, 16}, {8, 16},
                                                          {8, 16},  {16, 16}, {16},
                                                          {24, 16}, {24, 16}, {16, 24}};
  ASSERT_EQ(units[2].tensors.size(), layer_names.size());
  for (size_t i = 0; i < layer_names.size(); ++i) {
    EXPECT_EQ(units[2].tensors[i].name, "model.layers.1." + layer_names[i]);
    EXPECT_EQ(units[2].tensors[i].shape, layer_shapes[i]);
    EXPECT_EQ(units[2].tensors[i].is_norm, layer_shapes[i].size() == 1);
  }
  ASSERT_EQ(units[3].tensors.size(), 2u);
  EXPECT_EQ(units[3].tensors[0].name, "model.norm.weight");
  EXPECT_TRUE(units[3].tensors[0].is_norm);
  EXPECT_EQ(units[3].tensors[1].name, "lm_head.weight");
  EXPECT_EQ(units[3].tensors[1].shape, (std::vector<int64_t>{11, 16}));
}

TEST(Llama, GradientsMatchFiniteDifferences) {
  const LlamaConfig c = micro_config();
  const int64_t B = 2, T = 5;
  Llama model(c, *cpu(), B, T);
  Buffers p = make_params(model, 11);
  Buffers g = zeros_like(p);
  const auto tok = random_tokens(B * T, c.vocab_size, 1);
  auto tgt = random_tokens(B * T, c.vocab_size, 2);
  tgt[3] = -100;  // ignored
  tgt[7] = -1;
  run_step(model, p, g, tok, tgt, B, T);
  EXPECT_EQ(model.loss_count(), B * T - 2);

  const float h = 1e-2f;
  int checked = 0;
  double worst = 0;
  for (int u = 0; u < model.num_units(); ++u) {
    for (const TensorSpec& t : model.units()[u].tensors) {
      double gmax = 0;
      int64_t imax = 0;
      for (int64_t i = 0; i < t.numel; ++i) {
        const double a = std::fabs(g[u][t.offset + i]);
        if (a > gmax) gmax = a, imax = i;
      }
      EXPECT_GT(gmax, 1e-3) << t.name << " has no gradient";
      std::vector<int64_t> sample = {imax};
      for (int s = 0; s < 6; ++s)
        sample.push_back(static_cast<int64_t>(random_below(5, u * 100 + checked, s, t.numel)));
      for (int64_t i : sample) {
        float& x = p[u][t.offset + i];
        const float old = x;
        x = old + h;
        const float up = x;
        const double fp = run_forward(model, p, tok, tgt, B, T);
        x = old - h;
        const float down = x;
        const double fm = run_forward(model, p, tok, tgt, B, T);
        x = old;
        const double num = (fp - fm) / (static_cast<double>(up) - down);
        const double ana = g[u][t.offset + i];
        EXPECT_NEAR(ana, num, 2e-3 * std::max(1.0, gmax) + 3e-2 * std::fabs(num))
            << t.name << "[" << i << "]";
        worst = std::max(worst, std::fabs(ana - num) / (1e-3 + std::fabs(num)));
        ++checked;
      }
    }
  }
  std::printf("worst relative error %.2e over %d samples\n", worst, checked);
  EXPECT_EQ(checked, 7 * (1 + 2 * 9 + 2));  // every tensor of every unit
}

TEST(Llama, GradientsAccumulateAndScale) {
  const LlamaConfig c = micro_config();
  const int64_t B = 2, T = 5;
  Llama model(c, *cpu(), B, T);
  const Buffers p = make_params(model, 5, 1.0f);
  const auto tok1 = random_tokens(B * T, c.vocab_size, 10), tgt1 = random_tokens(B * T, c.vocab_size, 11);
  const auto tok2 = random_tokens(B * T, c.vocab_size, 12), tgt2 = random_tokens(B * T, c.vocab_size, 13);
  Buffers g1 = zeros_like(p), g2 = zeros_like(p), g12 = zeros_like(p), g1s = zeros_like(p);
  run_step(model, p, g1, tok1, tgt1, B, T);
  run_step(model, p, g2, tok2, tgt2, B, T);
  run_step(model, p, g12, tok1, tgt1, B, T);
  run_step(model, p, g12, tok2, tgt2, B, T);
  run_step(model, p, g1s, tok1, tgt1, B, T, 0.25f);
  for (size_t u = 0; u < p.size(); ++u)
    for (size_t i = 0; i < p[u].size(); ++i) {
      const float s = g1[u][i] + g2[u][i];
      ASSERT_NEAR(g12[u][i], s, 1e-5f * (1 + std::fabs(s))) << u << " " << i;
      ASSERT_NEAR(g1s[u][i], 0.25f * g1[u][i], 1e-6f * (1 + std::fabs(g1[u][i]))) << u << " " << i;
    }
}

// Full recomputation runs each layer's forward again in backward: the same
// kernels on the same inputs, so the same loss and the same gradients, bit
// for bit, while one layer's activations are kept instead of every layer's.
TEST(Llama, RecomputationGivesTheSameBits) {
  LlamaConfig c = micro_config();
  c.num_hidden_layers = 3;
  const int64_t B = 2, T = 5;
  backend::Backend* be = cpu();
  const int64_t before = be->memory().in_use;
  Llama keep(c, *be, B, T);
  const int64_t kept = be->memory().in_use - before;
  Llama rebuild(c, *be, B, T, /*recompute=*/true);
  const int64_t rebuilt = be->memory().in_use - before - kept;
  EXPECT_LT(rebuilt, kept);  // two layers' activations fewer
  const Buffers p = make_params(keep, 7, 1.0f);
  const auto tok = random_tokens(B * T, c.vocab_size, 30), tgt = random_tokens(B * T, c.vocab_size, 31);
  Buffers g_keep = zeros_like(p), g_rebuild = zeros_like(p);
  for (int step = 0; step < 2; ++step) {  // accumulation too
    run_step(keep, p, g_keep, tok, tgt, B, T);
    run_step(rebuild, p, g_rebuild, tok, tgt, B, T);
    EXPECT_EQ(keep.loss_sum(), rebuild.loss_sum());
  }
  for (size_t u = 0; u < p.size(); ++u)
    ASSERT_EQ(0, std::memcmp(g_keep[u].data(), g_rebuild[u].data(), g_keep[u].size() * sizeof(float)))
        << "unit " << u;
}

// Backward in parts (layout.h: backward_parts), as the engine runs a layer
// that reduces in buckets: the same kernels, the same bits, with and without
// recomputation; each part writes exactly its range of the unit's gradient
// (Grads::kWrite over NaN: the rest stays NaN), and a part it does not have is
// refused.
TEST(Llama, BackwardInPartsGivesTheSameBits) {
  const LlamaConfig c = micro_config();
  const int64_t B = 2, T = 5;
  const auto tok = random_tokens(B * T, c.vocab_size, 60),
             tgt = random_tokens(B * T, c.vocab_size, 61);
  for (bool recompute : {false, true}) {
    Llama model(c, *cpu(), B, T, recompute);
    const Buffers p = make_params(model, 13, 1.0f);
    Buffers whole = zeros_like(p), parts = zeros_like(p);
    run_step(model, p, whole, tok, tgt, B, T);
    run_forward(model, p, tok, tgt, B, T);
    for (int u = model.num_units() - 1; u >= 0; --u) {
      const auto ranges = backward_parts(model.units()[static_cast<size_t>(u)]);
      for (size_t k = 0; k < ranges.size(); ++k) {
        std::fill(parts[u].begin(), parts[u].end(), std::nanf(""));
        model.backward(u, hv(p[u]), hv(parts[u]), model::Llama::Grads::kWrite, static_cast<int>(k));
        for (int64_t i = 0; i < static_cast<int64_t>(parts[u].size()); ++i) {
          const bool inside = i >= ranges[k].begin && i < ranges[k].end;
          ASSERT_EQ(inside, !std::isnan(parts[u][i]))
              << "unit " << u << " part " << k << " element " << i;
          if (inside) ASSERT_EQ(parts[u][i], whole[u][i]) << "unit " << u << " element " << i;
        }
      }
    }
  }
  Llama model(c, *cpu(), B, T);
  const Buffers p = make_params(model, 13, 1.0f);
  Buffers g = zeros_like(p);
  run_forward(model, p, tok, tgt, B, T);
  ASSERT_EQ(backward_parts(model.units()[1]).size(), 2u);
  try {
    model.backward(1, hv(p[1]), hv(g[1]), model::Llama::Grads::kAdd, 2);
    FAIL() << "part 2 of a decoder layer accepted";
  } catch (const amsp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has 2 parts, not part 2"), std::string::npos) << e.what();
  }
}

TEST(Llama, IgnoredTargetsContributeNothing) {
  const LlamaConfig c = micro_config();
  const int64_t B = 2, T = 5;
  Llama model(c, *cpu(), B, T);
  const Buffers p = make_params(model, 6, 1.0f);
  const auto tok = random_tokens(B * T, c.vocab_size, 20);
  auto tgt = random_tokens(B * T, c.vocab_size, 21);

  // All ignored: zero loss, zero count, zero gradient everywhere.
  std::vector<int32_t> none(B * T, -100);
  Buffers g = zeros_like(p);
  run_step(model, p, g, tok, none, B, T);
  EXPECT_EQ(model.loss_sum(), 0.0);
  EXPECT_EQ(model.loss_count(), 0);
  for (const auto& v : g)
    for (float x : v) ASSERT_EQ(x, 0.0f);

  // Some ignored: the loss is the sum over the others, from the logits.
  tgt[0] = -1;
  tgt[6] = -100;
  const double loss = run_forward(model, p, tok, tgt, B, T);
  EXPECT_EQ(model.loss_count(), B * T - 2);
  double ref = 0;
  for (int64_t r = 0; r < B * T; ++r) {
    if (tgt[r] < 0) continue;
    const float* z = model.logits().f32() + r * c.vocab_size;
    double s = 0;
    for (int64_t j = 0; j < c.vocab_size; ++j) s += std::exp(static_cast<double>(z[j]));
    ref += std::log(s) - z[tgt[r]];
  }
  EXPECT_NEAR(loss, ref, 1e-5 * ref);

  // Changing an ignored position's target id changes nothing.
  Buffers ga = zeros_like(p), gb = zeros_like(p);
  run_step(model, p, ga, tok, tgt, B, T);
  tgt[0] = -7;
  run_step(model, p, gb, tok, tgt, B, T);
  EXPECT_EQ(ga, gb);
}

TEST(Llama, ForwardWithoutTargetsGivesTheSameLogits) {
  const LlamaConfig c = micro_config();
  const int64_t B = 2, T = 5;
  Llama model(c, *cpu(), B, T);
  const Buffers p = make_params(model, 12, 1.0f);
  const auto tok = random_tokens(B * T, c.vocab_size, 50), tgt = random_tokens(B * T, c.vocab_size, 51);
  run_forward(model, p, tok, tgt, B, T);
  const std::vector<float> with(model.logits().f32(), model.logits().f32() + B * T * c.vocab_size);
  model.set_batch(tok.data(), nullptr, B, T, 1.0f);
  for (int u = 0; u < model.num_units(); ++u) model.forward(u, hv(p[u]));
  EXPECT_EQ(std::vector<float>(model.logits().f32(), model.logits().f32() + B * T * c.vocab_size), with);
  EXPECT_EQ(model.loss_count(), 0);
  Buffers g = zeros_like(p);
  EXPECT_ANY_THROW(
      model.backward(model.num_units() - 1, hv(p.back()), hv(g.back()), model::Llama::Grads::kAdd));
}

TEST(Llama, BitIdenticalAcrossRuns) {
  // Big enough for OpenMP and OpenBLAS to split work, and for attention to
  // span several query blocks.
  LlamaConfig c = micro_config();
  c.hidden_size = 64;
  c.intermediate_size = 160;
  c.vocab_size = 97;
  c.max_position_embeddings = 128;
  const int64_t B = 3, T = 80;
  const auto tok = random_tokens(B * T, c.vocab_size, 30), tgt = random_tokens(B * T, c.vocab_size, 31);
  auto once = [&](Buffers& g, std::vector<float>& logits) {
    Llama model(c, *cpu(), B, T);
    const Buffers p = make_params(model, 8, 1.0f);
    g = zeros_like(p);
    const double loss = run_forward(model, p, tok, tgt, B, T, 1.0f / (B * T));
    logits.assign(model.logits().f32(), model.logits().f32() + B * T * c.vocab_size);
    for (int u = model.num_units() - 1; u >= 0; --u)
      model.backward(u, hv(p[u]), hv(g[u]), model::Llama::Grads::kAdd);
    return loss;
  };
  Buffers g1, g2;
  std::vector<float> l1, l2;
  const double a = once(g1, l1), b = once(g2, l2);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(std::isfinite(a));
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(g1, g2);
}

TEST(Llama, ShorterBatchThanAllocated) {
  // A micro-batch smaller than the allocation gives the same result as a
  // model allocated exactly for it.
  const LlamaConfig c = micro_config();
  const auto tok = random_tokens(2 * 4, c.vocab_size, 40), tgt = random_tokens(2 * 4, c.vocab_size, 41);
  Llama big(c, *cpu(), 3, 7), exact(c, *cpu(), 2, 4);
  const Buffers p = make_params(big, 9, 1.0f);
  Buffers gb = zeros_like(p), ge = zeros_like(p);
  run_step(big, p, gb, tok, tgt, 2, 4);
  run_step(exact, p, ge, tok, tgt, 2, 4);
  EXPECT_EQ(big.loss_sum(), exact.loss_sum());
  EXPECT_EQ(gb, ge);
  EXPECT_ANY_THROW(big.set_batch(tok.data(), tgt.data(), 4, 2, 1.0f));
  EXPECT_ANY_THROW(big.set_batch(tok.data(), tgt.data(), 1, 8, 1.0f));
}

TEST(Llama, InitUnitParams) {
  const LlamaConfig c = micro_config();
  const auto units = build_layout(c);
  std::vector<float> a(units[1].numel), b(units[1].numel), d(units[2].numel);
  init_unit_params(units[1], 1, 42, a.data());
  init_unit_params(units[1], 1, 42, b.data());
  init_unit_params(units[2], 2, 42, d.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(std::vector<float>(a.begin() + 16, a.begin() + 32),
            std::vector<float>(d.begin() + 16, d.begin() + 32));
  double s = 0, s2 = 0;
  int64_t n = 0;
  for (const auto& t : units[1].tensors)
    for (int64_t i = 0; i < t.numel; ++i) {
      const float v = a[t.offset + i];
      if (t.is_norm) {
        ASSERT_EQ(v, 1.0f);
      } else {
        s += v, s2 += double(v) * v, ++n;
      }
    }
  EXPECT_NEAR(s / n, 0.0, 0.003);
  EXPECT_NEAR(std::sqrt(s2 / n), 0.02, 0.002);
}

// A rank draws only its shard: any range drawn alone is the same slice of the
// whole unit, across tensor boundaries, and padding past the unit's end is
// left alone.
TEST(Llama, InitUnitParamsRangeIsTheWholeUnitsSlice) {
  const LlamaConfig c = micro_config();
  const auto units = build_layout(c);
  const UnitSpec& unit = units[1];
  std::vector<float> whole(unit.numel);
  init_unit_params(unit, 1, 42, whole.data());
  const int64_t n = unit.numel;
  for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
           {0, n}, {0, 7}, {5, 300}, {unit.tensors[1].offset - 3, unit.tensors[2].offset + 3}, {n - 9, n}}) {
    std::vector<float> part(end - begin, -7.0f);
    init_unit_params(unit, 1, 42, begin, end, part.data());
    EXPECT_EQ(part, std::vector<float>(whole.begin() + begin, whole.begin() + end)) << "[" << begin << ", " << end << ")";
  }
  std::vector<float> padded(12, -7.0f);
  init_unit_params(unit, 1, 42, n - 4, n + 8, padded.data());
  EXPECT_EQ(std::vector<float>(padded.begin(), padded.begin() + 4), std::vector<float>(whole.end() - 4, whole.end()));
  EXPECT_EQ(std::vector<float>(padded.begin() + 4, padded.end()), std::vector<float>(8, -7.0f));
}

TEST(Llama, FlopsPerToken) {
  LlamaConfig c = micro_config();
  const double h = 16, kv = 8, i = 24, L = 2, V = 11, T = 5;
  const double matmul = L * (2 * h * h + 2 * kv * h + 3 * h * i) + V * h;
  EXPECT_DOUBLE_EQ(Llama::flops_per_token(c, 5), 6 * matmul + 6 * L * h * T);
  // Matmul parameters are all but embedding and norms.
  EXPECT_DOUBLE_EQ(matmul, c.num_parameters() - V * h - (2 * L + 1) * h);
}

}  // namespace
}  // namespace amsp::model
