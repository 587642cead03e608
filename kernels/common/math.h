// Per-element math written once for the CPU kernels and the CUDA kernels
// (AMSP_HD: host and device). The CPU tests exercise these functions; the CUDA
// kernels in kernels/cuda call the same functions (on the GPU, and on the CPU
// under the emulation the tests use: doc/gpu.md).
// Everything is fp32 and free of library calls that would not vectorise: the
// CPU loops calling these compile to SIMD code.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/common/hd.h"

namespace amsp::kernels {

// RMSNorm's weight gradient sums each column over the rows in double, in
// chunks of this many rows, then the chunks' sums in order: the order both
// backends use, so that the GPU can spread the rows over its blocks and still
// give the CPU's bits.
constexpr int64_t kRmsnormDwRows = 32;

AMSP_HD float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

AMSP_HD uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// fp32 -> bf16 with round-to-nearest-even, as CUDA's __float2bfloat16_rn and
// torch's .to(torch.bfloat16) do; a NaN stays a (quiet) NaN, infinities stay.
AMSP_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// bf16 -> fp32 is exact: the bf16 bits are the top half of the fp32.
AMSP_HD float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// The fp32 value nearest to f that bf16 can hold.
AMSP_HD float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// A stored element in fp32 (bf16 widened, exactly), and an fp32 value stored in
// a destination's dtype (bf16 rounded to nearest even): the one conversion at
// the edges of every kernel that takes either dtype, on both backends.
AMSP_HD float load(float x) { return x; }
AMSP_HD float load(uint16_t x) { return bf16_to_float(x); }
AMSP_HD void store(float* p, float v) { *p = v; }
AMSP_HD void store(uint16_t* p, float v) { *p = float_to_bf16(v); }

// exp(x) in fp32, within 2 ulp of the correctly rounded value on the normal
// range (Cephes' expf: Cody-Waite reduction by ln 2, degree-6 polynomial, then
// scaling by 2^n through the exponent bits). Returns 0 below -87.3 (where expf
// goes subnormal), saturates at exp(88.37) above. Written branch-free so loops
// over it vectorise.
AMSP_HD float fast_exp(float x) {
  const float kHi = 88.3762626647949f, kLo = -87.3365447504019f;
  const bool underflow = x < kLo;
  x = x > kHi ? kHi : x;
  x = x < kLo ? kLo : x;
  // n = round-to-nearest(x / ln 2) by the 1.5 * 2^23 trick: no floorf call,
  // so the loop vectorises without -ffast-math. |r| <= ln2/2 either way.
  const float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = bits_to_float(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return underflow ? 0.0f : p * scale;
}

// SiLU(x) = x * sigmoid(x), computed as torch does: x / (1 + exp(-x)).
AMSP_HD float silu(float x) { return x / (1.0f + fast_exp(-x)); }

// d SiLU / dx = s * (1 + x * (1 - s)), s = sigmoid(x).
AMSP_HD float silu_grad(float x) {
  const float s = 1.0f / (1.0f + fast_exp(-x));
  return s * (1.0f + x * (1.0f - s));
}

// SwiGLU forward for one element: silu(gate) * up.
AMSP_HD float swiglu(float gate, float up) { return silu(gate) * up; }

// SwiGLU backward for one element, given d(out).
AMSP_HD void swiglu_grad(float gate, float up, float dout, float& dgate, float& dup) {
  const float s = 1.0f / (1.0f + fast_exp(-gate));
  dup = dout * (gate * s);
  dgate = dout * up * (s * (1.0f + gate * (1.0f - s)));
}

// RMSNorm of one row: inv_rms = 1 / sqrt(mean(x^2) + eps) from the row's sum of
// squares (the caller sums, in whatever order its hardware likes).
AMSP_HD float rms_inv(float sum_squares, int64_t dim, float eps) {
  return 1.0f / std::sqrt(sum_squares / static_cast<float>(dim) + eps);
}

// y = w * (x * inv_rms), in the order transformers' LlamaRMSNorm multiplies.
AMSP_HD float rmsnorm_element(float x, float w, float inv_rms) { return w * (x * inv_rms); }

// d x for one element of RMSNorm: with g = w*dy and c = sum_k g_k x_k over the
// row, dx = inv_rms * g - x * inv_rms^3 * c / dim. `coef` is
// inv_rms^3 * c / dim, computed once per row.
AMSP_HD float rmsnorm_dx_element(float x, float w, float dy, float inv_rms, float coef) {
  return inv_rms * (w * dy) - x * coef;
}

// Rotary embedding of one pair (x[i], x[i + D/2]), Hugging Face's rotate_half
// convention: (a, b) -> (a cos - b sin, b cos + a sin). Backward is the same
// rotation by -angle (pass -sin). Each output is one rounded product and one
// fused multiply-add, written out: left to the compiler, a * c - b * s
// contracts into either of two multiply-adds depending on the code around it
// (GCC contracts by default, nvcc too), and attention's rotation of dq and dk
// back would not be the same bits as the separate pass.
AMSP_HD void rope_rotate(float& a, float& b, float cos, float sin) {
  const float a0 = a, b0 = b;
  a = fmaf(a0, cos, -(b0 * sin));
  b = fmaf(b0, cos, a0 * sin);
}

// RoPE tables [positions, D/2] (rope_table) for attention's backward, which
// rotates dq and dk back as it writes them, so that no pass of its own reads
// and writes them (q and k come rotated: the model rotates them in place
// before forward). cos == nullptr: no rotation.
struct Rotary {
  const float* cos = nullptr;
  const float* sin = nullptr;
};

// AdamW for one element with decoupled weight decay, as torch.optim.AdamW
// (non-fused, non-amsgrad) does it:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p)
// with m_hat = m / bc1, v_hat = v / bc2, bc_i = 1 - b_i^step. The operations are
// ordered like torch's: p *= 1 - lr wd; p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
AMSP_HD void adamw_update_element(float& p, float& m, float& v, float g, float lr, float beta1,
                                  float beta2, float eps, float weight_decay,
                                  float bias_correction1, float bias_correction2) {
  p = p * (1.0f - lr * weight_decay);
  m = m + (g - m) * (1.0f - beta1);  // torch: exp_avg.lerp_(grad, 1 - beta1)
  v = v * beta2 + (1.0f - beta2) * g * g;
  const float denom = std::sqrt(v) / std::sqrt(bias_correction2) + eps;
  p = p - (lr / bias_correction1) * (m / denom);
}

}  // namespace amsp::kernels
