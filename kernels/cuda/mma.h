// Tensor-core products for the kernels of kernels/cuda: the warp-wide
// mma.sync m16n8k16 with bf16 inputs and fp32 accumulators (sm_80 and later),
// and the fragment loads that feed it from shared memory. nvcc emits the PTX
// instruction; the emulation (kernels/cuda/emu/simt.h) computes the same tile
// from the same fragments, so a kernel written against this header runs in
// the suite as it runs on the GPU.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = 4 g + t:
//   A, 16 x 16 row-major, uint32_t a[4]: a[r] holds rows g + 8 (r % 2),
//       columns 8 (r / 2) + 2 t and + 1, the lower column in the low half;
//   B, 16 x 8, uint32_t b[2]: b[r] holds rows 8 r + 2 t and + 1 of column g;
//   C and D, 16 x 8, float d[4]: d[i] is row g + 8 (i / 2), column 2 t + i % 2.
// Two C tiles side by side (columns 0-7 and 8-15 of one 16 x 16 block) are,
// packed to bf16 pairs, exactly the A fragment of that block: a softmax's
// scores become the next product's left operand without leaving registers.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/math.h"
#include "kernels/cuda/simt.h"

namespace amsp::kernels::cuda {

// d += a * b over one m16n8k16 tile. Every lane of the warp must call it.
AMSP_DEVICE_INLINE void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
#if defined(__CUDACC__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  ::amsp::emu::simt::mma_bf16_16x8x16(d, a, b);
#endif
}

// Two values rounded to bf16 (nearest even) in one word, `lo` in the low half.
// On the GPU one cvt.rn.bf16x2.f32, which rounds as float_to_bf16 does (the
// emulation's path) for every value but NaN, which it makes the canonical
// 0x7fff: the same bits but for a NaN's payload.
AMSP_DEVICE_INLINE uint32_t pack_bf16(float lo, float hi) {
#if defined(__CUDACC__)
  uint32_t w;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(w) : "f"(hi), "f"(lo));
  return w;
#else
  return static_cast<uint32_t>(float_to_bf16(lo)) |
         (static_cast<uint32_t>(float_to_bf16(hi)) << 16);
#endif
}

// The two bf16 values of a word (pack_bf16's layout) as fp32: with pack_bf16,
// what round_bf16 gives each of a pair, in a third of the instructions, and the
// packed word kept for a product that takes the pair.
AMSP_DEVICE_INLINE void unpack_bf16(uint32_t w, float& lo, float& hi) {
  lo = bits_to_float(w << 16);
  hi = bits_to_float(w & 0xffff0000u);
}

// log2(e): exp(x) = 2^(x log2(e)), so that a scale and log2(e) fold into the
// one multiply-add before exp2_approx.
constexpr float kLog2e = 1.4426950408889634f;

// 2^x by the special function unit, as FlashAttention's softmax takes its
// exponentials: one ex2.approx.ftz.f32, against the twenty-odd instructions of
// a polynomial exp. Its error is a few units in the last place (CUDA's exp2f,
// the same instruction, is documented at 2 ulp), far below the bf16 rounding
// of the probabilities that follows (2^-8); 2^-inf = 0, and results below
// FLT_MIN flush to 0. The emulation (emu/simt.h) takes the host's exp2f and
// moves it by up to 2 ulp, so that the suite's tolerances hold for the
// instruction's error, not only for a correctly rounded one.
AMSP_DEVICE_INLINE float exp2_approx(float x) {
#if defined(__CUDACC__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return ::amsp::emu::simt::ex2_approx(x);
#endif
}

// The word of two adjacent bf16 values at p (4-byte aligned), stored or loaded. On the
// GPU one 32-bit access; the host compiler of the emulation gets a memcpy,
// which it compiles to the same access without writing uint16_t storage
// through a uint32_t pointer (undefined behaviour in C++).
AMSP_DEVICE_INLINE void store_word(uint16_t* p, uint32_t w) {
#if defined(__CUDACC__)
  *reinterpret_cast<uint32_t*>(p) = w;
#else
  std::memcpy(p, &w, sizeof w);
#endif
}
AMSP_DEVICE_INLINE uint32_t load_word(const uint16_t* p) {
#if defined(__CUDACC__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
#endif
}

// The fragment loads below take shared memory with 16-byte aligned rows (ld
// a multiple of 8, m 16-byte aligned). On the GPU each is one ldmatrix, which
// gathers 8 x 8 blocks of 16-bit values (the PTX ISA, "ldmatrix"): every lane
// names the start of one row, lanes 8i to 8i + 7 the rows of block i, and
// receives in word i the two values of block i at row g, columns 2t and 2t + 1
// (or, with .trans, at rows 2t and 2t + 1 of column g). The emulation gathers
// the same words from the rows the 32 lanes name (emu/simt.h), so the row
// addresses below are checked in the suite as they run on the GPU.
template <int kCount, bool kTrans>
AMSP_DEVICE_INLINE void ldmatrix(uint32_t (&w)[kCount], const uint16_t* row) {
#if defined(__CUDACC__)
  const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kCount == 4 && kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(at));
  else if constexpr (kCount == 4)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(at));
  else if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(w[0]), "=r"(w[1]) : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(w[0]), "=r"(w[1]) : "r"(at));
#else
  ::amsp::emu::simt::ldmatrix(w, kCount, kTrans, row);
#endif
}

// The A fragment of the 16 x 16 block at `m` (row-major, row stride ld bf16s):
// rows along the tile's m, columns along its k. Blocks: rows 0-7 and 8-15 of
// columns 0-7, then of columns 8-15.
AMSP_DEVICE_INLINE void load_a(uint32_t (&a)[4], const uint16_t* m, int ld) {
  const int lane = threadIdx.x % 32;
  ldmatrix<4, false>(a, m + (lane % 16) * ld + 8 * (lane / 16));
}

// The B fragment of a 16 x 8 block stored as it is, 16 rows of 8 (as values
// are stored for p v): each word gathers two rows. Blocks, transposed: rows
// 0-7, then 8-15.
AMSP_DEVICE_INLINE void load_b_kn(uint32_t (&b)[2], const uint16_t* m, int ld) {
  const int lane = threadIdx.x % 32;
  ldmatrix<2, true>(b, m + (lane % 16) * ld);
}

// Two B fragments in one ldmatrix.x4, half the load instructions of two
// ldmatrix.x2 (as FlashAttention-2 takes its fragments). The lanes name the
// rows of four 8 x 8 blocks; words 0-1 are the first fragment's, 2-3 the
// second's.
AMSP_DEVICE_INLINE void split_pair(uint32_t (&b)[2][2], const uint32_t (&w)[4]) {
  b[0][0] = w[0];
  b[0][1] = w[1];
  b[1][0] = w[2];
  b[1][1] = w[3];
}

// The B fragments of two 16 x 8 blocks stored transposed, as 16 rows of 16
// (row n holds column n of B: "k-major", as keys are stored for q k^T): rows
// 0-7 (b[0]) and 8-15 (b[1]), each from its columns 0-7 and 8-15.
AMSP_DEVICE_INLINE void load_b_nk_n2(uint32_t (&b)[2][2], const uint16_t* m, int ld) {
  const int lane = threadIdx.x % 32;
  uint32_t w[4];
  ldmatrix<4, false>(w, m + (lane % 8 + 8 * (lane / 16)) * ld + 8 * ((lane / 8) % 2));
  split_pair(b, w);
}

// load_b_kn's fragments of the 16 rows at m for two blocks of 8 columns along
// n: columns 0-7 (b[0]) and 8-15 (b[1]).
AMSP_DEVICE_INLINE void load_b_kn_n2(uint32_t (&b)[2][2], const uint16_t* m, int ld) {
  const int lane = threadIdx.x % 32;
  uint32_t w[4];
  ldmatrix<4, true>(w, m + (lane % 16) * ld + 8 * (lane / 16));
  split_pair(b, w);
}

// The A fragment of the 16 x 16 block formed by C tiles c0 (columns 0-7) and
// c1 (columns 8-15), rounded to bf16.
AMSP_DEVICE_INLINE void a_from_c(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// Asynchronous copies from global into shared memory (sm_80 and later), so
// that the next tile is on its way while the current one is multiplied: each
// cp_async16 is one cp.async.cg of 16 bytes (both addresses 16-byte aligned),
// or 16 zero bytes where `valid` is false (src must still be a readable
// address); cp_async_commit closes the thread's group of copies, and
// cp_async_wait<N>() returns once at most the newest N groups are still in
// flight. What a thread copied is visible to the block only after its wait and
// a __syncthreads. The emulation lands the bytes at the wait, not before
// (emu/simt.h), so a missing wait reads stale shared memory in the suite too.
AMSP_DEVICE_INLINE void cp_async16(uint16_t* dst, const uint16_t* src, bool valid) {
#if defined(__CUDACC__)
  const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at),
               "l"(__cvta_generic_to_global(src)), "r"(valid ? 16 : 0)
               : "memory");
#else
  ::amsp::emu::simt::cp_async16(dst, src, !valid);
#endif
}

AMSP_DEVICE_INLINE void cp_async_commit() {
#if defined(__CUDACC__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
  ::amsp::emu::simt::cp_async_commit();
#endif
}

template <int kPending>
AMSP_DEVICE_INLINE void cp_async_wait() {
#if defined(__CUDACC__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#else
  ::amsp::emu::simt::cp_async_wait(kPending);
#endif
}

}  // namespace amsp::kernels::cuda
