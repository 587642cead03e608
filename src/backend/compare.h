// One backend checked against another, kernel by kernel: every kernel of a
// training step, forward and backward, on awkward shapes (sizes of 1, odd
// sizes, sizes that are not multiples of any tile or block, one head, many
// heads), with fp32 and bf16 parameters and gradients, from the same inputs;
// and, when asked, at the sizes of a real 1B and 7B LLaMA layer.
// The reference is the CPU backend; the other is the CUDA backend, on a GPU
// (`amsp backend-check` in validation/gpu/check.sh) or on the CPU emulation of
// CUDA in the test suite. doc/gpu.md ("Kernel checks") gives the tolerances and
// why they are what they are.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace amsp::backend {

// The measure of every check: max |got - want| over an output divided by
// max |want| (a normwise relative error); infinite for a NaN or a size mismatch.
double normwise_error(const std::vector<float>& got, const std::vector<float>& want);

// One output of one kernel call: its error against its own tolerance
// (backend/compare_tolerance.h).
struct CompareRow {
  std::string kernel;  // "linear_forward"
  std::string shape;   // "M=37 in=19 out=23 w=bf16 beta=1"
  std::string output;  // "y"
  double error = 0;
  double tolerance = 0;
  std::string failure;  // a kernel that threw: its message (the row fails)
  bool ok() const { return failure.empty() && error <= tolerance; }
};

struct CompareReport {
  std::vector<CompareRow> rows;
  bool ok() const;
  int failures() const;
  // The worst error / tolerance ratio per kernel, for notes.
  std::vector<CompareRow> worst_per_kernel() const;
};

// Which cases run:
//   kSmall      the awkward small shapes, in seconds even on the CPU emulation;
//   kLayer      those, then every kernel at the sizes of one layer of a 1B
//               model (hidden 2048, 32 heads on 4 kv heads of 64, ffn 5632) at
//               T = 4096 and of a 7B one (hidden 4096, 32 heads on 8 kv heads of
//               128, ffn 11008) at T = 2048 (attention at 4096 too), vocab
//               32000, batch 1: about 2.9 TFLOP for the CPU reference per
//               compute dtype (doc/gpu.md, "Kernel checks");
//   kLayerMini  the small shapes, then the same layer cases with every size
//               divided by 16 (heads and head_dim by 4 each, so the
//               grouped-query ratios stay): the layer code path in seconds.
enum class Shapes { kSmall, kLayer, kLayerMini };
// "small", "layer", "layer-mini"; nullopt for anything else.
std::optional<Shapes> parse_shapes(const std::string& text);

// Runs the cases on both backends. Both must compute in the same dtype.
CompareReport compare_backends(Backend& reference, Backend& device, Shapes shapes = Shapes::kSmall);

// A table a person can paste into an issue: one line per kernel (its worst
// case), then every failing row in full.
void print_report(const CompareReport& report, std::ostream& out);

}  // namespace amsp::backend
