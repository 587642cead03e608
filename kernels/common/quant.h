// Block quantization for compressed collectives (doc/compression.md): the record
// format, which the CPU and CUDA kernels write and read and from which the
// planner predicts the bytes on the wire, and the per-element arithmetic that
// both backends' kernels share, so that they give the same bits.
//
// A chunk of n values (fp32 or bf16) becomes one record, in int32 words:
//
//   bytes [0, 4 nb)                fp32 scales, one per block of `block` values
//                                  (nb = ceil(n / block); the last block may be short)
//   bytes [4 nb, 4 nb + codes)     the codes: bits 8: int8[n]; bits 4: two's
//                                  complement nibbles, two per byte, element 2j in
//                                  the low nibble of byte j, ceil(n / 2) bytes
//   then zero bytes up to a multiple of 4 (record_bytes).
//
// Each block: amax = max |x|; scale = amax / qmax and codes
// q = clamp(rint(x * inv), -qmax, qmax) with inv = qmax / amax, all in fp32,
// rint rounding half to even; qmax = 2^(bits-1) - 1. A block of zeros has scale 0
// and codes 0. A block holding a NaN or an infinity has the scale NaN and codes
// 0, so every value of it dequantizes to NaN: a non-finite value stays visible.
// When amax < 2^-64, x and amax are first multiplied by 2^64 (exactly), so
// that inv does not overflow for tiny blocks; where qmax / amax is finite this
// gives the very codes of the plain formula. Dequantization is y = q * scale.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/hd.h"
#include "kernels/common/math.h"

namespace amsp::kernels::quant {

struct Spec {
  int32_t bits = 8;      // 8 or 4
  int64_t block = 2048;  // values per scale, > 0; block >= n: one scale per chunk
};

AMSP_HD bool valid(const Spec& s) { return (s.bits == 8 || s.bits == 4) && s.block > 0; }

// The largest code: 127 for 8 bits, 7 for 4.
AMSP_HD int32_t qmax(const Spec& s) { return (1 << (s.bits - 1)) - 1; }

// ---- the record of a chunk of n values ----------------------------------------------

// Blocks (scales) of a chunk: ceil(n / block), without overflow for a huge block.
AMSP_HD int64_t blocks(int64_t n, const Spec& s) { return n / s.block + (n % s.block != 0); }
// The end of block b (< blocks(n)): the value after its last.
AMSP_HD int64_t block_end(int64_t b, int64_t n, const Spec& s) {
  const int64_t lo = b * s.block;
  return s.block >= n - lo ? n : lo + s.block;
}
// Where the codes start, in bytes from the record's start.
AMSP_HD int64_t codes_offset(int64_t n, const Spec& s) { return 4 * blocks(n, s); }
AMSP_HD int64_t code_bytes(int64_t n, const Spec& s) { return s.bits == 8 ? n : n / 2 + n % 2; }
// The record's size: scales, codes, zero padding to a multiple of 4 bytes.
AMSP_HD int64_t record_bytes(int64_t n, const Spec& s) {
  return (codes_offset(n, s) + code_bytes(n, s) + 3) / 4 * 4;
}
AMSP_HD int64_t record_words(int64_t n, const Spec& s) { return record_bytes(n, s) / 4; }

// ---- how the kernels split the work ----------------------------------------------

// A worker (a CPU loop iteration, a CUDA thread block) quantizes one unit of
// blocks: one block, or two where 4-bit blocks are odd-sized, so that no byte
// of codes holds nibbles of two units and units never write the same byte.
AMSP_HD int64_t blocks_per_unit(const Spec& s) { return s.bits == 4 && s.block % 2 == 1 ? 2 : 1; }
AMSP_HD int64_t units(int64_t n, const Spec& s) {
  const int64_t nb = blocks(n, s), per = blocks_per_unit(s);
  return nb / per + (nb % per != 0);
}

// ---- the arithmetic ------------------------------------------------------------------

constexpr uint32_t kNanScaleBits = 0x7fc00000u;  // the scale of a non-finite block
constexpr uint32_t kInfBits = 0x7f800000u;

// |x| as bits: for non-negative floats the integer order is the float order,
// and every NaN is above infinity, so the integer max of these over a block is
// amax with a NaN winning, in any order (CPU vector lanes, GPU warps alike).
AMSP_HD uint32_t abs_bits(float x) { return float_to_bits(x) & 0x7fffffffu; }

// A block's quantizer, from the max of abs_bits over it.
struct Quantizer {
  float scale;  // what the record stores
  float pre;    // 1, or 2^64 for a block with amax < 2^-64
  float inv;    // qmax / (amax * pre); 0 for a block of zeros
  float qmax;
  bool finite;  // false: codes 0 (the scale is NaN)
};

AMSP_HD Quantizer make_quantizer(uint32_t amax_bits, const Spec& s) {
  const float q = static_cast<float>(qmax(s));
  if (amax_bits == 0) return Quantizer{0.0f, 1.0f, 0.0f, q, true};
  if (amax_bits >= kInfBits) return Quantizer{bits_to_float(kNanScaleBits), 1.0f, 0.0f, q, false};
  const float amax = bits_to_float(amax_bits);
  const float pre = amax < 0x1p-64f ? 0x1p64f : 1.0f;
  return Quantizer{amax / q, pre, q / (amax * pre), q, true};
}

// The code of x in its block. |x * inv| <= qmax (1 + 2^-24)^2 < qmax + 1/2 for
// every finite x of the block, so the clamp never binds; it is there as the
// format's promise that a code is within [-qmax, qmax].
AMSP_HD int32_t code(float x, const Quantizer& z) {
  float t = rintf((x * z.pre) * z.inv);
  t = t > z.qmax ? z.qmax : t;
  t = t < -z.qmax ? -z.qmax : t;
  return z.finite ? static_cast<int32_t>(t) : 0;
}

// One byte of 4-bit codes: element 2j (lo) in the low nibble, 2j + 1 (hi) in the high one.
AMSP_HD uint8_t pack_nibbles(int32_t lo, int32_t hi) {
  return static_cast<uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
}

// The code of element i of a chunk's codes, for codes of kBits bits (a loop
// that knows its bits has no branch per value) or of spec.bits.
template <int kBits>
AMSP_HD int32_t code_at(const uint8_t* codes, int64_t i) {
  if constexpr (kBits == 8) {
    return static_cast<int8_t>(codes[i]);
  } else {
    const int32_t nibble = (codes[i >> 1] >> ((i & 1) * 4)) & 0xf;
    return nibble >= 8 ? nibble - 16 : nibble;
  }
}
AMSP_HD int32_t code_at(const uint8_t* codes, int64_t i, const Spec& s) {
  return s.bits == 8 ? code_at<8>(codes, i) : code_at<4>(codes, i);
}

// Scale b of a record (the record's first words), as fp32.
AMSP_HD float scale_at(const int32_t* record, int64_t b) {
  return bits_to_float(static_cast<uint32_t>(record[b]));
}

}  // namespace amsp::kernels::quant
