// One backend checked against another, kernel by kernel: every kernel of a
// training step, forward and backward, on awkward shapes (sizes of 1, odd
// sizes, sizes that are not multiples of any tile or block, one head, many
// heads), with fp32 and bf16 parameters and gradients, from the same inputs.
// The reference is the CPU backend; the other is the CUDA backend, on a GPU
// (`amsp backend-check` in validation/gpu/check.sh) or on the CPU emulation of
// CUDA in the test suite. doc/gpu.md ("Kernel checks") gives the tolerances and
// why they are what they are.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace amsp::backend {

// One output of one kernel call: its error, max |got - want| over the output
// divided by max |want| (a normwise relative error), against its tolerance.
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

// Runs every case on both backends. Both must compute in the same dtype.
CompareReport compare_backends(Backend& reference, Backend& device);

// A table a person can paste into an issue: one line per kernel (its worst
// case), then every failing row in full.
void print_report(const CompareReport& report, std::ostream& out);

}  // namespace amsp::backend
