#include "backend/compare.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <ostream>

#include "backend/compare_cases.h"
#include "core/error.h"

namespace amsp::backend {
namespace {

using namespace cases;

// ---- the small shapes: sizes of 1, odd sizes, sizes that fit no tile ----------------------

void small_cases(Checker& c) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{40000}})
    for (DType a : {DType::kF32, DType::kBF16})
      for (DType b : {DType::kF32, DType::kBF16}) elementwise_case(c, n, a, b);
  for (auto [rows, dim, vocab] : {std::array<int64_t, 3>{1, 1, 1}, {65, 33, 50}, {300, 8, 7}})
    for (DType t : {DType::kF32, DType::kBF16}) embedding_case(c, rows, dim, vocab, t);
  for (auto [M, in, out] : {std::array<int64_t, 3>{1, 1, 1}, {37, 19, 23}, {65, 130, 257}})
    for (DType w : {DType::kF32, DType::kBF16})
      for (float beta : {0.0f, 1.0f})  // dw always accumulates: once is enough
        linear_cases(c, {M, in, out, w, beta}, beta == 0.0f);
  // bf16 activations in and out, under bf16 compute.
  if (c.compute() == DType::kBF16)
    for (auto [M, in, out] : {std::array<int64_t, 3>{1, 1, 1}, {37, 19, 23}, {65, 130, 257}})
      for (float beta : {0.0f, 1.0f}) linear_cases(c, {M, in, out, DType::kBF16, beta, DType::kBF16}, beta == 0.0f);
  for (auto [rows, dim] : {std::array<int64_t, 2>{1, 1}, {3, 257}, {70, 64}})
    for (DType w : {DType::kF32, DType::kBF16})
      for (DType act : {DType::kF32, DType::kBF16}) rmsnorm_cases(c, {rows, dim, w, act});
  for (auto s : {RopeShape{1, 1, 1, 2, 2}, {2, 37, 3, 8, 40}, {1, 70, 5, 16, 96}})
    for (DType act : {DType::kF32, DType::kBF16}) rope_case(c, s, act);
  for (auto s : {AttentionShape{1, 1, 1, 1, 8}, {2, 37, 4, 4, 16}, {1, 70, 8, 2, 24},
                 {1, 130, 2, 1, 64}})
    for (DType act : {DType::kF32, DType::kBF16}) attention_case(c, s, act);
  for (auto [rows, I] : {std::array<int64_t, 2>{1, 1}, {17, 241}})
    for (DType act : {DType::kF32, DType::kBF16}) swiglu_case(c, rows, I, act);
  for (auto [rows, V] : {std::array<int64_t, 2>{1, 1}, {13, 50}, {33, 1031}})
    for (DType act : {DType::kF32, DType::kBF16}) cross_entropy_case(c, rows, V, act);
  for (int64_t n : {int64_t{1}, int64_t{70001}})
    for (DType g : {DType::kF32, DType::kBF16}) adamw_case(c, n, g);
  // Units of one block, of two odd 4-bit blocks, blocks of one value, one block per chunk.
  quant_case(c, 1000, 4, {8, 256}, DType::kF32, DType::kF32);
  quant_case(c, 1001, 3, {4, 33}, DType::kBF16, DType::kBF16);
  quant_case(c, 37, 2, {8, 1}, DType::kF32, DType::kBF16);
  quant_case(c, 777, 2, {4, int64_t{1} << 40}, DType::kBF16, DType::kF32);
}

// ---- one layer of a real model ------------------------------------------------------------

struct Layer {
  int64_t T, hidden, heads, kv_heads, head_dim, ffn, vocab;
};

// LLaMA-shaped 1B (TinyLlama's layer) and 7B layers at the sequence lengths the
// list below uses them with.
constexpr Layer k1B{4096, 2048, 32, 4, 64, 5632, 32000};
constexpr Layer k7B{2048, 4096, 32, 8, 128, 11008, 32000};

// layer-mini: every size divided by 16, hidden as heads / 4 x head_dim / 4 so
// that the grouped-query ratios stay (8:1 and 4:1).
Layer mini(Layer l) {
  return {l.T / 16, l.hidden / 16, l.heads / 4, l.kv_heads / 4, l.head_dim / 4, l.ffn / 16,
          l.vocab / 16};
}

// Every kernel of a layer once, at its sizes, in fp32 parameters: the four
// shapes of linear (q and o, k and v, gate and up, down), each forward,
// backward input and backward weight, beta as the model uses it somewhere.
void layer_cases(Checker& c, const Layer& l) {
  const int64_t T = l.T, h = l.hidden, kv = l.kv_heads * l.head_dim;
  const DType f32 = DType::kF32;
  linear_cases(c, {T, h, h, f32, 0}, true);
  linear_cases(c, {T, h, kv, f32, 1}, true);
  linear_cases(c, {T, h, l.ffn, f32, 0}, true);
  linear_cases(c, {T, l.ffn, h, f32, 1}, true);
  rmsnorm_cases(c, {T, h, f32});
  rope_case(c, {1, T, l.heads, l.head_dim, h});
  attention_case(c, {1, T, l.heads, l.kv_heads, l.head_dim});
  swiglu_case(c, T, l.ffn);
  cross_entropy_case(c, T, l.vocab);
  embedding_case(c, T, h, l.vocab, f32);
  adamw_case(c, h * h, DType::kBF16);
  quant_case(c, h * h / 4, 4, {8, 2048}, DType::kBF16, DType::kBF16);
}

// CPU reference cost per compute dtype, 2 M in out FLOP per product and
// attention's causal half: the 1B layer's linears 0.68 TFLOP and attention
// 0.21, the 7B layer's linears 1.37 and attention 0.10 at T 2048 and 0.41 at
// 4096, the bf16-weight q 0.10: about 2.9 TFLOP, 100 s on 2 cores here, some 15
// to 30 s on 16 (doc/gpu.md, "Kernel checks").
void layer_list(Checker& c, bool divided) {
  const Layer small = divided ? mini(k1B) : k1B, large = divided ? mini(k7B) : k7B;
  layer_cases(c, small);
  // The one bf16-weight variant: bf16 w and dw, converted on the way in and out.
  linear_cases(c, {small.T, small.hidden, small.hidden, DType::kBF16, 0}, true);
  layer_cases(c, large);
  attention_case(c, {1, 2 * large.T, large.heads, large.kv_heads, large.head_dim});
}

}  // namespace

double normwise_error(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return diff == 0 ? 0 : diff / std::max(scale, 1e-30);
}

std::optional<Shapes> parse_shapes(const std::string& text) {
  if (text == "small") return Shapes::kSmall;
  if (text == "layer") return Shapes::kLayer;
  if (text == "layer-mini") return Shapes::kLayerMini;
  return std::nullopt;
}

bool CompareReport::ok() const { return failures() == 0; }

int CompareReport::failures() const {
  return static_cast<int>(std::count_if(rows.begin(), rows.end(), [](auto& r) { return !r.ok(); }));
}

std::vector<CompareRow> CompareReport::worst_per_kernel() const {
  std::vector<CompareRow> worst;
  std::map<std::string, size_t> at;
  auto badness = [](const CompareRow& r) { return r.failure.empty() ? r.error / r.tolerance : INFINITY; };
  for (const CompareRow& r : rows) {
    auto [it, fresh] = at.emplace(r.kernel, worst.size());
    if (fresh)
      worst.push_back(r);
    else if (badness(r) > badness(worst[it->second]))
      worst[it->second] = r;
  }
  return worst;
}

CompareReport compare_backends(Backend& reference, Backend& device, Shapes shapes) {
  if (reference.compute() != device.compute())
    fail("compare_backends: the reference computes in ", dtype_name(reference.compute()),
         ", the device backend in ", dtype_name(device.compute()));
  CompareReport report;
  Checker c(reference, device, report);
  small_cases(c);
  if (shapes != Shapes::kSmall) layer_list(c, shapes == Shapes::kLayerMini);
  return report;
}

void print_report(const CompareReport& report, std::ostream& out) {
  char line[512];
  std::snprintf(line, sizeof line, "%-36s %-44s %-18s %10s %10s  %s\n", "kernel (worst case)",
                "shape", "output", "error", "tolerance", "");
  out << line;
  auto print = [&](const CompareRow& r) {
    std::snprintf(line, sizeof line, "%-36s %-44s %-18s %10.2e %10.2e  %s\n", r.kernel.c_str(),
                  r.shape.c_str(), r.output.c_str(), r.error, r.tolerance,
                  r.ok() ? "ok" : r.failure.empty() ? "FAIL" : ("FAIL: " + r.failure).c_str());
    out << line;
  };
  for (const CompareRow& r : report.worst_per_kernel()) print(r);
  if (report.ok()) {
    out << report.rows.size() << " outputs compared, all within tolerance\n";
    return;
  }
  out << "failing:\n";
  for (const CompareRow& r : report.rows)
    if (!r.ok()) print(r);
  out << report.failures() << " of " << report.rows.size() << " outputs outside tolerance\n";
}

}  // namespace amsp::backend
