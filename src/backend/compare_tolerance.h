// The tolerances of the kernel checks (backend/compare.h): how far a device
// backend's output may be from the CPU backend's, in the normwise measure the
// checks use, max |got - want| / max |want|, for the random inputs the checks
// generate (independent normals of mean zero). doc/gpu.md ("Kernel checks")
// derives them; in short:
//
//   elementwise       the same formula per element, possibly contracted into
//                     fused multiply-adds by another compiler: a few fp32 ulp.
//   sums of n terms   another order of summation (tiles, trees, warps, split-K).
//                     Higham & Mary's probabilistic bound: a computed sum of n
//                     terms is within gamma(n) ~ lambda sqrt(n) u of the exact
//                     sum relative to the sum of the terms' magnitudes, with
//                     probability at least 1 - 2 exp(-lambda^2 / 2) under their
//                     model of independent rounding errors. For sums of positive
//                     terms (softmax denominators, sums of squares) that is
//                     relative to the sum itself; for sums of random terms of
//                     both signs (matrix products, attention's P V and
//                     gradients) the same martingale argument over the partial
//                     sums, which here are of the size of the sum and not of the
//                     sum of magnitudes, gives gamma(n) relative to the size of
//                     the output. Two backends: twice that.
//   bf16 storage      a value rounded to bf16 may land on the neighbouring bf16
//                     value when the fp32 values before rounding differ in the
//                     last bits: one bf16 ulp, at most 2^-7 of the value.
//
// Each check also has a floor, the fixed tolerance its kind has always had on
// the small shapes (kElementwise, kReduction, kBf16): a bound below it is
// raised to it, so that only sizes where the bound is larger move.
#pragma once

#include <cstdint>

namespace amsp::backend::tolerance {

// The unit roundoff of fp32, 2^-24.
inline constexpr double kFp32Roundoff = 0x1p-24;
// Higham & Mary's lambda. With lambda = 9 a bound fails with probability at
// most 2 exp(-40.5) = 5e-18 per output element; `--shapes layer` compares fewer
// than 10^9 elements, so a false failure somewhere in it has probability below
// 10^-8 under the model.
inline constexpr double kLambda = 9;

// The fixed tolerances of the small shapes, the floors of the bounds below.
inline constexpr double kElementwise = 1e-6;  // about 8 fp32 ulp
inline constexpr double kReduction = 1e-5;
inline constexpr double kBf16 = 0x1p-7;  // one bf16 ulp is at most 2^-7 of the value

// Higham & Mary's gamma~_n(lambda) = exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1,
// about lambda sqrt(n) u: how far one computed sum of n fp32 terms may be from
// the exact sum, relative to its scale. 0 for n <= 1 (nothing is added).
double gamma(int64_t n);

// Two backends' sums of n terms, in any two orders: 2 gamma(n).
double sum_of(int64_t n);

// An output rounded to bf16 after an fp32 computation whose own bound is
// `fp32_bound`: one bf16 ulp (2^-7) of the rounded value, which is at most
// `rounded_max`, relative to the output's largest magnitude `out_max`, plus
// fp32_bound (rounding is monotone, so the fp32 difference is not amplified).
double bf16_rounded(double fp32_bound, double rounded_max = 1, double out_max = 1);

}  // namespace amsp::backend::tolerance
