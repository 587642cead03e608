// Block quantization on the CPU: kernels/common/quant.h holds the format and the
// arithmetic, shared with kernels/cuda/quant.cu.
//
// This file is compiled with -ffp-contract=off (CMakeLists.txt): GCC would
// otherwise fuse dequantize_sum's q * scale and the addition that follows into
// one fused multiply-add, one rounding instead of two, and the sum would no
// longer be the bits of the CUDA kernel and of the NumPy reference. The test
// quant_cpu_no_fma looks for fused multiply-adds in the object.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/common/math.h"
#include "kernels/common/quant.h"
#include "kernels/cpu/ops.h"

namespace amsp::kernels {
namespace {

using quant::Quantizer;
using quant::Spec;

// Values per task of the dequantizing loops, and per piece of a unit split over
// the threads (even: 4-bit codes start on a byte).
constexpr int64_t kTile = 4096;

inline uint8_t* codes_of(int32_t* record, int64_t n, const Spec& s) {
  return reinterpret_cast<uint8_t*>(record) + quant::codes_offset(n, s);
}
inline const uint8_t* codes_of(const int32_t* record, int64_t n, const Spec& s) {
  return reinterpret_cast<const uint8_t*>(record) + quant::codes_offset(n, s);
}

// max abs_bits over x[lo, hi): amax with a NaN winning; exact in any order, so
// it may be split over lanes and threads.
template <typename T>
uint32_t amax_bits(const T* x, int64_t lo, int64_t hi) {
  uint32_t m = 0;
#pragma omp simd reduction(max : m)
  for (int64_t i = lo; i < hi; ++i) m = std::max(m, quant::abs_bits(load(x[i])));
  return m;
}

// Codes of the values [a, b) of one block: a is even; b is even, or the chunk's
// end, whose last byte then holds one nibble.
template <typename T>
void code_run(const T* x, int64_t a, int64_t b, const Quantizer& block, const Spec& s, uint8_t* codes) {
  const Quantizer z = block;  // a local copy: codes (bytes) may alias the caller's, and it vectorizes
  if (s.bits == 8) {
#pragma omp simd
    for (int64_t i = a; i < b; ++i) codes[i] = static_cast<uint8_t>(quant::code(load(x[i]), z));
    return;
  }
#pragma omp simd
  for (int64_t j = a / 2; j < b / 2; ++j)
    codes[j] = quant::pack_nibbles(quant::code(load(x[2 * j]), z), quant::code(load(x[2 * j + 1]), z));
  if (b % 2) codes[b / 2] = quant::pack_nibbles(quant::code(load(x[b - 1]), z), 0);
}

// Calls f(a, b) for [lo, hi) in pieces of kTile values (even-aligned from lo)
// across the threads when `parallel`, else f(lo, hi) on this one.
template <typename F>
void for_pieces(int64_t lo, int64_t hi, bool parallel, const F& f) {
  if (!parallel) return f(lo, hi);  // no parallel region per unit: it would cost more than the unit
  const int64_t pieces = (hi - lo + kTile - 1) / kTile;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pieces; ++p) f(lo + p * kTile, std::min(hi, lo + (p + 1) * kTile));
}

// Unit u of a chunk x of n values into its record: its one or two blocks'
// scales and their codes. `parallel`: split the unit over the threads (a chunk
// quantized per tensor); else it runs on the calling thread.
template <typename T>
void quantize_unit(const T* x, int64_t n, int64_t u, const Spec& s, int32_t* record, bool parallel) {
  const int64_t nb = quant::blocks(n, s), b0 = u * quant::blocks_per_unit(s);
  const int64_t lo = b0 * s.block, mid = quant::block_end(b0, n, s);
  const bool two = quant::blocks_per_unit(s) == 2 && b0 + 1 < nb;
  const int64_t hi = two ? quant::block_end(b0 + 1, n, s) : mid;
  uint32_t m0 = 0, m1 = 0;
  if (parallel) {
#pragma omp parallel for schedule(static) reduction(max : m0)
    for (int64_t p = 0; p < (mid - lo + kTile - 1) / kTile; ++p)
      m0 = std::max(m0, amax_bits(x, lo + p * kTile, std::min(mid, lo + (p + 1) * kTile)));
  } else {
    m0 = amax_bits(x, lo, mid);
  }
  if (two) m1 = amax_bits(x, mid, hi);  // a two-block unit's blocks are short: odd 4-bit blocks < n
  const Quantizer z0 = quant::make_quantizer(m0, s);
  const Quantizer z1 = two ? quant::make_quantizer(m1, s) : z0;
  record[b0] = static_cast<int32_t>(float_to_bits(z0.scale));
  if (two) record[b0 + 1] = static_cast<int32_t>(float_to_bits(z1.scale));
  uint8_t* codes = codes_of(record, n, s);
  if (!two) {
    for_pieces(lo, hi, parallel, [&](int64_t a, int64_t b) { code_run(x, a, b, z0, s, codes); });
    return;
  }
  // Two odd 4-bit blocks: lo is even and mid odd, so one byte holds the last
  // value of the first and the first of the second; the unit's bytes are its own.
  code_run(x, lo, mid - 1, z0, s, codes);
  codes[(mid - 1) / 2] = quant::pack_nibbles(quant::code(load(x[mid - 1]), z0), quant::code(load(x[mid]), z1));
  code_run(x, mid + 1, hi, z1, s, codes);
}

template <typename T>
void quantize_chunks(const T* x, int64_t n, int64_t records, const Spec& s, int32_t* words) {
  if (n == 0 || records == 0) return;
  const int64_t per_record = quant::units(n, s), total = records * per_record;
  const int64_t rw = quant::record_words(n, s);
  // Units across the threads when there are enough of them, else each unit's
  // values across the threads (a chunk quantized per tensor).
  const bool across = total >= omp_get_max_threads();
#pragma omp parallel for schedule(static) if (across)
  for (int64_t t = 0; t < total; ++t) {
    const int64_t r = t / per_record;
    quantize_unit(x + r * n, n, t % per_record, s, words + r * rw, !across);
  }
  const int64_t used = quant::codes_offset(n, s) + quant::code_bytes(n, s);
  for (int64_t r = 0; r < records; ++r)
    std::memset(reinterpret_cast<uint8_t*>(words + r * rw) + used, 0,
                static_cast<size_t>(4 * rw - used));
}

// Calls f(lo, hi, scale) for the runs of elements [lo, hi) of [from, to) that
// share a block of `record`.
template <typename F>
void for_block_runs(const int32_t* record, int64_t n, const Spec& s, int64_t from, int64_t to,
                    const F& f) {
  for (int64_t b = from / s.block; from < to; ++b) {
    const int64_t hi = std::min(to, quant::block_end(b, n, s));
    f(from, hi, quant::scale_at(record, b));
    from = hi;
  }
}

template <int kBits, typename T>
void dequantize_chunks(const int32_t* words, int64_t n, int64_t records, const Spec& s, T* y) {
  const int64_t tiles = (n + kTile - 1) / kTile, rw = quant::record_words(n, s);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < records * tiles; ++t) {
    const int64_t r = t / tiles, lo = t % tiles * kTile;
    const int32_t* record = words + r * rw;
    const uint8_t* codes = codes_of(record, n, s);
    T* out = y + r * n;
    for_block_runs(record, n, s, lo, std::min(n, lo + kTile), [&](int64_t a, int64_t b, float scale) {
      for (int64_t i = a; i < b; ++i)
        store(out + i, static_cast<float>(quant::code_at<kBits>(codes, i)) * scale);
    });
  }
}

template <int kBits, typename T>
void dequantize_sum_chunks(const int32_t* words, int64_t n, int64_t records, const Spec& s, T* y) {
  const int64_t tiles = (n + kTile - 1) / kTile, rw = quant::record_words(n, s);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t lo = t * kTile, hi = std::min(n, lo + kTile);
    float acc[kTile];
    std::fill(acc, acc + (hi - lo), 0.0f);
    for (int64_t r = 0; r < records; ++r) {
      const int32_t* record = words + r * rw;
      const uint8_t* codes = codes_of(record, n, s);
      for_block_runs(record, n, s, lo, hi, [&](int64_t a, int64_t b, float scale) {
        // The first record's product is the sum so far (0 + p would turn -0 into +0).
        if (r == 0) {
          for (int64_t i = a; i < b; ++i)
            acc[i - lo] = static_cast<float>(quant::code_at<kBits>(codes, i)) * scale;
        } else {
          for (int64_t i = a; i < b; ++i)
            acc[i - lo] = acc[i - lo] + static_cast<float>(quant::code_at<kBits>(codes, i)) * scale;
        }
      });
    }
    for (int64_t i = lo; i < hi; ++i) store(y + i, acc[i - lo]);
  }
}

}  // namespace

void quantize(const float* x, int64_t n, int64_t records, const Spec& spec, int32_t* words) {
  quantize_chunks(x, n, records, spec, words);
}

void quantize(const uint16_t* x, int64_t n, int64_t records, const Spec& spec, int32_t* words) {
  quantize_chunks(x, n, records, spec, words);
}

// The dequantizing loops are compiled per code width: no branch per value.
void dequantize(const int32_t* words, int64_t n, int64_t records, const Spec& spec, float* y) {
  spec.bits == 8 ? dequantize_chunks<8>(words, n, records, spec, y)
                 : dequantize_chunks<4>(words, n, records, spec, y);
}

void dequantize(const int32_t* words, int64_t n, int64_t records, const Spec& spec, uint16_t* y) {
  spec.bits == 8 ? dequantize_chunks<8>(words, n, records, spec, y)
                 : dequantize_chunks<4>(words, n, records, spec, y);
}

void dequantize_sum(const int32_t* words, int64_t n, int64_t records, const Spec& spec, float* y) {
  spec.bits == 8 ? dequantize_sum_chunks<8>(words, n, records, spec, y)
                 : dequantize_sum_chunks<4>(words, n, records, spec, y);
}

void dequantize_sum(const int32_t* words, int64_t n, int64_t records, const Spec& spec,
                    uint16_t* y) {
  spec.bits == 8 ? dequantize_sum_chunks<8>(words, n, records, spec, y)
                 : dequantize_sum_chunks<4>(words, n, records, spec, y);
}

}  // namespace amsp::kernels
