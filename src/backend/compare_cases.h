// The cases of the kernel checks (backend/compare.h), one function per kernel
// family, each taking its shape, so that the small shapes and the layer-sized
// ones run the same code. Each case runs its kernels on both backends from the
// same inputs and gives every output its own tolerance, derived from the case
// (backend/compare_tolerance.h; doc/gpu.md, "Kernel checks").
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/compare.h"

namespace amsp::backend::cases {

using Floats = std::vector<float>;

// One output of a case: its values on one backend and its tolerance, a bound
// computed from the case and from these values (the reference's are used).
struct Output {
  std::string name;
  Floats values;
  double tolerance = 0;
};
using Outputs = std::vector<Output>;

class Checker {
 public:
  Checker(Backend& reference, Backend& device, CompareReport& report)
      : ref_(reference), dev_(device), report_(report) {}

  // Runs `f` on both backends and adds one row per output to the report, with
  // the tolerance max(floor, the reference output's own). `floor` is the fixed
  // tolerance of the case's kind (compare_tolerance.h).
  void compare(const std::string& kernel, const std::string& shape, double floor,
               const std::function<Outputs(Backend&)>& f);
  DType compute() const { return ref_.compute(); }

 private:
  Backend& ref_;
  Backend& dev_;
  CompareReport& report_;
};

struct LinearShape {
  int64_t M, in, out;
  DType w;     // the weight's (and its gradient's) dtype
  float beta;  // forward and backward input; backward weight always accumulates
  DType act = DType::kF32;  // x, y, dy and dx (bf16 only under bf16 compute)
};
// linear_forward and linear_backward_input, and linear_backward_weight if asked.
void linear_cases(Checker& c, const LinearShape& s, bool weight_gradient);

struct RmsnormShape {
  int64_t rows, dim;
  DType w;                     // the weight's and its gradient's dtype
  DType act = DType::kF32;     // y's and dy's (x and dx are fp32, the residual stream)
};
void rmsnorm_cases(Checker& c, const RmsnormShape& s);

struct RopeShape {
  int64_t B, T, heads, head_dim, stride;
};
void rope_case(Checker& c, const RopeShape& s, DType act = DType::kF32);

struct AttentionShape {
  int64_t B, T, H, KV, D;
};
// q|k|v, out, dout and dqkv in `act` (the saved statistics fp32).
void attention_case(Checker& c, const AttentionShape& s, DType act = DType::kF32);

// gate and up side by side in rows of 2 I, as the model keeps them.
void swiglu_case(Checker& c, int64_t rows, int64_t I, DType act = DType::kF32);
void cross_entropy_case(Checker& c, int64_t rows, int64_t V, DType act = DType::kF32);
void embedding_case(Checker& c, int64_t rows, int64_t dim, int64_t vocab, DType table);
void elementwise_case(Checker& c, int64_t n, DType dst, DType src);
void adamw_case(Checker& c, int64_t n, DType grad);
// quantize, dequantize and dequantize_sum (kernels/common/quant.h): `records`
// chunks of n values from `in` into `out`; the records (as their bytes), values
// and sums must be the same bits (tolerance 0).
void quant_case(Checker& c, int64_t n, int64_t records, const kernels::quant::Spec& spec, DType in,
                DType out);

}  // namespace amsp::backend::cases
