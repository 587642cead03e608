// Block quantization (kernels/cuda/ops.h): the CPU kernels' bits
// (kernels/cpu/quant.cpp), from the same per-element arithmetic
// (kernels/common/quant.h).
//
// quantize: a thread block per unit of one or two quantization blocks, grid
// stride over the units. amax is a block reduction of abs_bits, an integer max,
// so its order does not matter; thread 0 stores the scales, every thread codes
// its share of the unit's values (of its bytes, for 4-bit codes, whose units
// never share a byte). dequantize and dequantize_sum: a thread per value, or per
// byte of 4-bit codes. Products and sums go through __fmul_rn and __fadd_rn,
// which nvcc never contracts into a fused multiply-add (it would by default);
// the emulation defines them out of line, so the host compiler cannot either.
#include <algorithm>

#include "kernels/common/math.h"
#include "kernels/common/quant.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

using quant::Quantizer;
using quant::Spec;

AMSP_DEVICE_INLINE int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
AMSP_DEVICE_INLINE int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

AMSP_DEVICE_INLINE const uint8_t* codes_of(const int32_t* record, int64_t n, const Spec& s) {
  return reinterpret_cast<const uint8_t*>(record) + quant::codes_offset(n, s);
}

// The dequantized value of element i of a record with codes of kBits bits, in fp32.
template <int kBits>
AMSP_DEVICE_INLINE float value(const int32_t* record, const uint8_t* codes, int64_t i, const Spec& s) {
  return __fmul_rn(static_cast<float>(quant::code_at<kBits>(codes, i)), quant::scale_at(record, i / s.block));
}

template <typename T>
__global__ void quantize_kernel(const T* x, int64_t n, int64_t records, Spec s, int32_t* words) {
  const int64_t nb = quant::blocks(n, s), per = quant::blocks_per_unit(s);
  const int64_t per_record = quant::units(n, s), rw = quant::record_words(n, s);
  const int64_t used = quant::codes_offset(n, s) + quant::code_bytes(n, s);
  for (int64_t t = blockIdx.x; t < records * per_record; t += gridDim.x) {
    const int64_t r = t / per_record, b0 = t % per_record * per;
    const T* xr = x + r * n;
    int32_t* record = words + r * rw;
    const bool two = per == 2 && b0 + 1 < nb;  // the same in every thread of the block
    const int64_t lo = b0 * s.block, mid = quant::block_end(b0, n, s);
    const int64_t hi = two ? quant::block_end(b0 + 1, n, s) : mid;
    uint32_t m0 = 0, m1 = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      const uint32_t a = quant::abs_bits(load(xr[i]));
      if (i < mid)
        m0 = a > m0 ? a : m0;
      else
        m1 = a > m1 ? a : m1;
    }
    const Quantizer z0 = quant::make_quantizer(block_reduce(m0, MaxOp{}, 0u), s);
    const Quantizer z1 = two ? quant::make_quantizer(block_reduce(m1, MaxOp{}, 0u), s) : z0;
    if (threadIdx.x == 0) {
      record[b0] = static_cast<int32_t>(float_to_bits(z0.scale));
      if (two) record[b0 + 1] = static_cast<int32_t>(float_to_bits(z1.scale));
    }
    uint8_t* codes = reinterpret_cast<uint8_t*>(record) + quant::codes_offset(n, s);
    if (s.bits == 8) {
      for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
        codes[i] = static_cast<uint8_t>(quant::code(load(xr[i]), z0));
    } else {
      // lo is even: the unit's bytes are its own.
      for (int64_t j = lo / 2 + threadIdx.x; j < (hi + 1) / 2; j += blockDim.x) {
        const int64_t e = 2 * j;
        const int32_t q0 = quant::code(load(xr[e]), e < mid ? z0 : z1);
        const int32_t q1 = e + 1 < hi ? quant::code(load(xr[e + 1]), e + 1 < mid ? z0 : z1) : 0;
        codes[j] = quant::pack_nibbles(q0, q1);
      }
    }
    // The record's last unit zeroes its padding.
    if (t % per_record == per_record - 1 && threadIdx.x == 0)
      for (int64_t p = used; p < 4 * rw; ++p) reinterpret_cast<uint8_t*>(record)[p] = 0;
  }
}

// What a dequantizing kernel is compiled for: its output type and its codes' bits
// (one type, because AMSP_LAUNCH's template arguments must hold no comma).
template <typename T, int Bits>
struct Out {
  using Type = T;
  static constexpr int kBits = Bits;
};

template <typename O>
__global__ void dequantize_kernel(const int32_t* words, int64_t n, int64_t records, Spec s,
                                  typename O::Type* y) {
  constexpr int kBits = O::kBits;
  const int64_t per = quant::code_bytes(n, s), rw = quant::record_words(n, s);
  for (int64_t t = first_index(); t < records * per; t += grid_stride()) {
    const int64_t r = t / per, j = t % per;
    const int32_t* record = words + r * rw;
    const uint8_t* codes = codes_of(record, n, s);
    typename O::Type* out = y + r * n;
    if (kBits == 8) {
      store(out + j, value<8>(record, codes, j, s));
    } else {
      store(out + 2 * j, value<4>(record, codes, 2 * j, s));
      if (2 * j + 1 < n) store(out + 2 * j + 1, value<4>(record, codes, 2 * j + 1, s));
    }
  }
}

// Element i summed over the records in order, the first record's value the start:
// acc + q * scale, which a compiler fuses where it is written so.
template <int kBits>
AMSP_DEVICE_INLINE float sum_element(const int32_t* words, int64_t rw, int64_t n, int64_t records,
                                     const Spec& s, int64_t i) {
  if (records == 0) return 0.0f;
  float acc = value<kBits>(words, codes_of(words, n, s), i, s);
  for (int64_t r = 1; r < records; ++r) {
    const int32_t* record = words + r * rw;
    acc = __fadd_rn(acc, value<kBits>(record, codes_of(record, n, s), i, s));
  }
  return acc;
}

template <typename O>
__global__ void dequantize_sum_kernel(const int32_t* words, int64_t n, int64_t records, Spec s,
                                      typename O::Type* y) {
  constexpr int kBits = O::kBits;
  const int64_t per = quant::code_bytes(n, s), rw = quant::record_words(n, s);
  for (int64_t j = first_index(); j < per; j += grid_stride()) {
    if (kBits == 8) {
      store(y + j, sum_element<8>(words, rw, n, records, s, j));
    } else {
      store(y + 2 * j, sum_element<4>(words, rw, n, records, s, 2 * j));
      if (2 * j + 1 < n) store(y + 2 * j + 1, sum_element<4>(words, rw, n, records, s, 2 * j + 1));
    }
  }
}

template <typename T>
void quantize_impl(const T* x, int64_t n, int64_t records, const Spec& spec, int32_t* words,
                   cudaStream_t s) {
  if (n == 0 || records == 0) return;
  // Threads to cover a unit's values once, in whole warps, up to kBlockThreads.
  const int64_t unit_values =
      spec.block >= n ? n : std::min(n, quant::blocks_per_unit(spec) * spec.block);
  const int threads = static_cast<int>(std::min<int64_t>(kBlockThreads, (unit_values + 31) / 32 * 32));
  AMSP_LAUNCH(quantize_kernel<T>, grid_for(records * quant::units(n, spec), 1), threads, 0, s)(
      x, n, records, spec, words);
}

template <typename T>
void dequantize_impl(const int32_t* words, int64_t n, int64_t records, const Spec& spec, T* y,
                     cudaStream_t s) {
  const int64_t total = records * quant::code_bytes(n, spec);
  if (total == 0) return;
  using Out8 = Out<T, 8>;
  using Out4 = Out<T, 4>;
  if (spec.bits == 8)
    AMSP_LAUNCH(dequantize_kernel<Out8>, grid_for(total), kBlockThreads, 0, s)(words, n, records, spec, y);
  else
    AMSP_LAUNCH(dequantize_kernel<Out4>, grid_for(total), kBlockThreads, 0, s)(words, n, records, spec, y);
}

template <typename T>
void dequantize_sum_impl(const int32_t* words, int64_t n, int64_t records, const Spec& spec, T* y,
                         cudaStream_t s) {
  const int64_t total = quant::code_bytes(n, spec);
  if (total == 0) return;
  using Out8 = Out<T, 8>;
  using Out4 = Out<T, 4>;
  if (spec.bits == 8)
    AMSP_LAUNCH(dequantize_sum_kernel<Out8>, grid_for(total), kBlockThreads, 0, s)(words, n, records, spec, y);
  else
    AMSP_LAUNCH(dequantize_sum_kernel<Out4>, grid_for(total), kBlockThreads, 0, s)(words, n, records, spec, y);
}

}  // namespace

void quantize(const float* x, int64_t n, int64_t records, const quant::Spec& spec, int32_t* words,
              cudaStream_t s) {
  quantize_impl(x, n, records, spec, words, s);
}

void quantize(const bf16* x, int64_t n, int64_t records, const quant::Spec& spec, int32_t* words,
              cudaStream_t s) {
  quantize_impl(x, n, records, spec, words, s);
}

void dequantize(const int32_t* words, int64_t n, int64_t records, const quant::Spec& spec, float* y,
                cudaStream_t s) {
  dequantize_impl(words, n, records, spec, y, s);
}

void dequantize(const int32_t* words, int64_t n, int64_t records, const quant::Spec& spec, bf16* y,
                cudaStream_t s) {
  dequantize_impl(words, n, records, spec, y, s);
}

void dequantize_sum(const int32_t* words, int64_t n, int64_t records, const quant::Spec& spec,
                    float* y, cudaStream_t s) {
  dequantize_sum_impl(words, n, records, spec, y, s);
}

void dequantize_sum(const int32_t* words, int64_t n, int64_t records, const quant::Spec& spec,
                    bf16* y, cudaStream_t s) {
  dequantize_sum_impl(words, n, records, spec, y, s);
}

}  // namespace amsp::kernels::cuda
