// Causal grouped-query attention on tensor cores: what attention_forward and
// attention_backward (kernels/cuda/ops.h states the contract) run when the
// products take bf16 inputs (compute() == kBF16) and the head dim is a
// multiple of 16 up to 128. The fp32 kernels of attention.cu stay the path
// for fp32 and other head dims, and kernels/cpu/attention.cpp is the
// reference both are tested against.
//
// The algorithm is attention.cu's, FlashAttention-2's: forward walks the key
// tiles left of the causal diagonal with an online softmax and keeps only the
// log-sum-exp of each row; backward recomputes the probabilities from it, in
// one kernel per query tile for dq and one per key tile and query head for
// dk and dv (the query heads that share a kv head leave their shares in the
// workspace, summed in head order after), so no atomics and the same bits run
// after run. What changes is where the products run: every product is a
// warp's mma.sync m16n8k16 (kernels/cuda/mma.h) with bf16 inputs and fp32
// accumulators, as in FlashAttention-2:
//   - q, k, v and dout are taken as they are when the activations are bf16,
//     and rounded to bf16 as they are loaded when they are fp32; out, dq, dk
//     and dv are stored in the activations' dtype (fp32 accumulators, each
//     bf16 output rounded once, two adjacent columns in one 32-bit store);
//   - the probabilities P and their gradients dS are rounded to bf16 for the
//     products that take them (P v, P^T dout, dS k, dS^T q); the softmax's
//     maximum, sum, rescaling and lse stay fp32 in registers. Forward sums the
//     rounded probabilities, so that each output row is a convex combination
//     of the value rows with the weights the product used;
//   - the softmax runs in base 2, as FlashAttention's does: each probability
//     is one multiply-add (the scale and log2(e) folded into it) and one
//     ex2.approx (exp2_approx, mma.h), each pair rounded by one conversion,
//     and the causal mask is applied only to the tiles that reach past a
//     warp's rows or past T. The polynomial exp this replaced cost about twenty
//     instructions a score, which left the tensor cores waiting on issue.
// q and k come rotated by RoPE (the model rotates them in place, once, before
// forward: ops.h); with rope tables backward rotates dq and dk back in the
// accumulators before it stores them (with grouped-query heads, after the
// heads' shares are summed), so that the gradients need no pass of their own.
// The score tile of a warp goes from the product's accumulators straight into
// the next product's left operand (mma.h: two C tiles are one A fragment), so
// P never touches shared memory.
//
// Work layout: 4 warps, each owning 16 rows (queries in forward and dq, keys
// in dk/dv) of the block's 64; up to D = 64, two tiles of 16 rows of the
// block's 128 (in dk/dv where its query tiles come by cp.async), as
// FlashAttention-2's forward takes them, so that each fragment of the other
// side a warp loads from shared memory serves two products, and each copy of
// a tile 128 rows. Shared memory holds bf16 tiles with rows padded by 8
// values (16 bytes), which puts the 32 lanes of every fragment load in 32
// different banks: forward and dq hold a key and a value tile of 64 rows (34
// KiB at D = 128), dk/dv the block's keys and values and a query and dout
// tile of 64 rows up to D = 64 and 16 rows above (37 KiB at D = 64, 43 at
// 128). The query rows' fragments of forward and dq come from global memory
// straight into registers (each element is read once).
// Forward and dq walk the key tiles in order, so with bf16 activations whose
// rows start 16-byte aligned (the model's fused q|k|v always) the tiles come
// by cp.async (mma.h), as in FlashAttention-2: two tiles in shared memory
// (36 KiB at D = 64, 68 at D = 128), the next one copied while the warps
// multiply this one.
// dk/dv walks its query tiles the same way (q, dout, lse and delta): two
// tiles of 32 rows beside the keys and values (37 KiB at D = 64, 69 at 128).
// The rows are summed in the same order either way, so the bits are the
// staged path's.
// Past 48 KiB (D > 80) a kernel must opt in to its shared memory, which
// every GPU these kernels are built for allows (an A100 163 KiB, an H100
// 227), as FlashAttention-2 does; where a device allows less, forward and dq
// take one key tile at a time (the next copied once the warps are done with
// this one) and dk/dv stages tiles of 16 query rows through registers.
// Otherwise (fp32 activations rounded as staged, unaligned rows) each tile
// is staged through registers after the warps are done with the last.
// doc/gpu.md has their times on a GPU.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <type_traits>

#include "kernels/common/math.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/mma.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/simt.h"

namespace amsp::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16;                // rows a warp owns
constexpr int kTile = kWarps * kRows;    // rows a block owns
constexpr int kKeys = 64;                // keys per streamed tile (forward, dq)
// Query rows per tile of dk/dv staged through registers: as many as fit
// beside the keys and values in 48 KiB of shared memory, so that a sync
// serves more products.
template <int kD>
constexpr int kQueries = kD <= 64 ? 64 : 16;
constexpr int kPad = 8;                  // bf16s after each row in shared memory
// Blocks of dk/dv (and of a forward with one row tile a warp) an SM must hold
// at once: up to D = 64, 4 (at most 128 registers a thread, against 156
// unbounded, which let 3 fit; the value that then spills is stored before
// the loops and loaded after them); above, what the registers allow (a bound
// of 4 would spill inside the loops).
template <int kD>
constexpr int kMinBlocks = kD <= 64 ? 4 : 1;
constexpr int kMaxD = 128;

// A kernel's variant: Fwd<head dim, activation dtype, key tiles> (a
// Sized<head dim, activation dtype>, simt.h), or Dkv<...> for dk/dv.
template <typename V>
using Act = typename V::Type;

struct Shape {
  int64_t B, T, H, KV;
  int group;          // H / KV
  float scale;        // 1 / sqrt(D)
  float scale_log2;   // scale * log2(e): exp(scale * x - y) = 2^(x scale_log2 - y log2(e))
  int64_t ldq, ldkv;  // row strides of q and dq, of k, v, dk and dv
  Rotary rope;        // backward: dq and dk rotated back as stored
  bool async_kv;      // bf16 k and v with 16-byte aligned rows: key tiles by cp.async
};

// Two adjacent activations as one word of bf16 values, p[0] in the low half:
// fp32 ones rounded, bf16 ones as they are (one 32-bit load, p 4-byte
// aligned: attention_forward_tc checks the strides and the pointers).
AMSP_DEVICE_INLINE uint32_t bf16_pair(const float* p) { return pack_bf16(p[0], p[1]); }
AMSP_DEVICE_INLINE uint32_t bf16_pair(const uint16_t* p) { return load_word(p); }

// Two adjacent outputs, each rounded once into bf16 activations.
AMSP_DEVICE_INLINE void store_pair(float* p, float lo, float hi) {
  p[0] = lo;
  p[1] = hi;
}
AMSP_DEVICE_INLINE void store_pair(uint16_t* p, float lo, float hi) {
  store_word(p, pack_bf16(lo, hi));
}

// Rows [first, first + n) of one head's [T, kD] slice (row stride ld) into
// bf16 shared memory with row stride kD + kPad; rows at or past T are 0.
template <int kD, typename A>
AMSP_DEVICE_INLINE void stage_rows(uint16_t* dst, const A* src, int64_t ld, int64_t first, int n,
                                   int64_t T) {
  constexpr int kPairs = kD / 2;
  for (int i = threadIdx.x; i < n * kPairs; i += blockDim.x) {
    const int r = i / kPairs, c = 2 * (i % kPairs);
    const int64_t row = first + r;
    store_word(dst + r * (kD + kPad) + c, row < T ? bf16_pair(src + row * ld + c) : 0u);
  }
}

// The A fragments of 16 rows from row0 of a [T, kD] slice in global memory,
// one per 16 columns, in bf16; rows at or past T are 0.
template <int kD, typename A>
AMSP_DEVICE_INLINE void load_a_rows(uint32_t (&a)[kD / 16][4], const A* src, int64_t ld,
                                    int64_t row0, int64_t T) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  AMSP_UNROLL
  for (int c = 0; c < kD / 16; ++c) {
    AMSP_UNROLL
    for (int r = 0; r < 4; ++r) {
      const int64_t row = row0 + g + 8 * (r % 2);
      const int col = 16 * c + 8 * (r / 2) + 2 * t;
      a[c][r] = row >= T ? 0u : bf16_pair(src + row * ld + col);
    }
  }
}

// The row of accumulator element i (0..3) of lane (g, t) in a 16-row tile at
// row0, and its column in an 8-column tile at col0.
AMSP_DEVICE_INLINE int64_t c_row(int64_t row0, int i) {
  return row0 + (threadIdx.x % 32) / 4 + 8 * (i / 2);
}
AMSP_DEVICE_INLINE int64_t c_col(int64_t col0, int i) {
  return col0 + 2 * (threadIdx.x % 4) + i % 2;
}

// A gradient's accumulators for 16 rows from row0 (kD columns) scaled, then
// with rope tables rotated back by each row's position: columns d and
// d + kD/2 are the same lane's elements of tiles n and n + kD/16.
template <int kD>
AMSP_DEVICE_INLINE void finish_gradient(float (&acc)[kD / 8][4], int64_t row0, int64_t T,
                                        float scale, const Rotary& rope) {
  for (int n = 0; n < kD / 8; ++n)
    for (int i = 0; i < 4; ++i) acc[n][i] *= scale;
  if (!rope.cos) return;
  AMSP_UNROLL
  for (int n = 0; n < kD / 16; ++n) {
    AMSP_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int64_t row = c_row(row0, i);
      if (row >= T) continue;
      const int64_t at = row * (kD / 2) + c_col(8 * n, i);
      rope_rotate(acc[n][i], acc[n + kD / 16][i], rope.cos[at], -rope.sin[at]);
    }
  }
}

// Sum and maximum over the four lanes (t = 0..3) that hold one row.
AMSP_DEVICE_INLINE float quad_sum(float v) {
  v += __shfl_xor_sync(kFullWarp, v, 1);
  return v + __shfl_xor_sync(kFullWarp, v, 2);
}
AMSP_DEVICE_INLINE float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullWarp, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullWarp, v, 2));
}

// Backward's probability of raw score s in a row whose log-sum-exp times
// log2(e) is lse2: exp(scale s - lse) as one multiply-add and one exp2_approx.
AMSP_DEVICE_INLINE float probability(float s, float lse2, const Shape& sh) {
  return exp2_approx(fmaf(s, sh.scale_log2, -lse2));
}

// A warp's products take kM tiles of 16 rows (kWarpTiles: 2 up to D = 64,
// as FlashAttention-2's 128-row blocks of 4 warps do; else 1), each B
// fragment loaded once from shared memory for all of them. One tile's registers as an
// array of one tile, for the calls that have one:
template <typename T, int N>
AMSP_DEVICE_INLINE T (&one_tile(T (&x)[N]))[1][N] {
  return *reinterpret_cast<T(*)[1][N]>(&x);
}

// acc[r][n] (16 x 8 tiles along kD) += a[r] (16 x 16) times rows [0, 16) of
// the [16][kD] bf16 block at m (row stride kD + kPad), for each row tile r.
// kPairs: the fragments two tiles at a time (kD / 8 is even), one ldmatrix.x4
// each; dk/dv takes them one at a time, as with its two accumulators pairs
// would spill at 128 registers.
template <int kD, bool kPairs = true, int kM>
AMSP_DEVICE_INLINE void mma_rows(float (&acc)[kM][kD / 8][4], const uint32_t (&a)[kM][4],
                                 const uint16_t* m) {
  for (int n = 0; n < kD / 8; n += kPairs ? 2 : 1) {
    if constexpr (kPairs) {
      uint32_t b[2][2];
      load_b_kn_n2(b, m + 8 * n, kD + kPad);
      for (int r = 0; r < kM; ++r) {
        mma_bf16_16x8x16(acc[r][n], a[r], b[0]);
        mma_bf16_16x8x16(acc[r][n + 1], a[r], b[1]);
      }
    } else {
      uint32_t b[2];
      load_b_kn(b, m + 8 * n, kD + kPad);
      for (int r = 0; r < kM; ++r) mma_bf16_16x8x16(acc[r][n], a[r], b);
    }
  }
}
template <int kD, bool kPairs = true>
AMSP_DEVICE_INLINE void mma_rows(float (&acc)[kD / 8][4], const uint32_t (&a)[4],
                                 const uint16_t* m) {
  mma_rows<kD, kPairs>(one_tile(acc), one_tile(a), m);
}

// s[r][n] and s[r][n + 1] (16 x 8 each) += row tile r's a-rows (kD/16
// fragments) dotted with the 16 rows of the [16][kD] bf16 block at m: the
// scores of 16 rows against 16 others, rows 0-7 of m into s[r][n] and 8-15
// into s[r][n + 1], both fragments of a step in one ldmatrix.x4.
template <int kD, int kM, int kN>
AMSP_DEVICE_INLINE void mma_dots(float (&s)[kM][kN][4], int n, const uint32_t (&a)[kM][kD / 16][4],
                                 const uint16_t* m) {
  for (int c = 0; c < kD / 16; ++c) {
    uint32_t b[2][2];
    load_b_nk_n2(b, m + 16 * c, kD + kPad);
    for (int r = 0; r < kM; ++r) {
      mma_bf16_16x8x16(s[r][n], a[r][c], b[0]);
      mma_bf16_16x8x16(s[r][n + 1], a[r][c], b[1]);
    }
  }
}
template <int kD>
AMSP_DEVICE_INLINE void mma_dots(float (&s)[2][4], const uint32_t (&a)[kD / 16][4],
                                 const uint16_t* m) {
  mma_dots<kD>(one_tile(s), 0, one_tile(a), m);
}

// Where one head's rows start in q, in k and v, in out and dout ([B*T, H*D]),
// and in lse and delta ([B, H, T]).
struct Head {
  int64_t q_off, kv_off, o_off, ldq, ldk, ldo, lse_off;
};

AMSP_DEVICE_INLINE Head head_of(int64_t b, int64_t h, int D, const Shape& sh) {
  const int64_t ldo = sh.H * D;
  return Head{b * sh.T * sh.ldq + h * D, b * sh.T * sh.ldkv + (h / sh.group) * D,
              b * sh.T * ldo + h * D,    sh.ldq,
              sh.ldkv,                   ldo,
              (b * sh.H + h) * sh.T};
}

template <int kD>
struct alignas(16) KeyValueTiles {
  uint16_t k[kKeys * (kD + kPad)];
  uint16_t v[kKeys * (kD + kPad)];
};

// The block (b*H + h, query tile) of the forward and dq kernels, the last
// tiles (most keys) first, each warp owning warp_rows of the tile's kWarps *
// warp_rows: its head, this warp's first row, and the tile's last row below T.
struct QueryRows {
  Head hd;
  int64_t row0, q_last;
};

AMSP_DEVICE_INLINE QueryRows query_rows(int D, const Shape& sh, int warp_rows = kRows) {
  const int64_t tile = kWarps * warp_rows;
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * tile;
  return QueryRows{head_of(blockIdx.x / sh.H, blockIdx.x % sh.H, D, sh),
                   q0 + threadIdx.x / 32 * warp_rows, (q0 + tile < sh.T ? q0 + tile : sh.T) - 1};
}

// Shared memory a block may have: 48 KiB without asking, up to kSharedBudget
// where the kernel opts in and the device allows it (shared_fits): two tiles
// of keys and values at D = 128 (68 KiB), or dk/dv's two query tiles beside
// its keys and values (69 KiB), with two blocks still sharing an H100's or an
// A100's SM (228 and 164 KiB).
constexpr size_t kSharedNoOptIn = 48 * 1024;
constexpr size_t kSharedBudget = 100 * 1024;

// Forward's and dq's variants: head dim, activation dtype, key tiles in
// shared memory (two: the next copied by cp.async while the warps multiply
// this one; or one), and tiles of 16 query rows a warp owns.
template <int kD, typename A, int kS, int kM>
struct Fwd : Sized<kD, A> {
  static constexpr int stages = kS, row_tiles = kM;
};

// Tiles of 16 rows a warp may take at head dim kD (query rows in forward and
// dq, keys in dk/dv's cp.async variant): two up to D = 64, so that each
// fragment of the other side a warp loads serves two products and each
// copied tile 128 rows (FlashAttention-2's forward blocks for D = 64 on an
// A100 or H100: 128 rows, 4 warps); at D = 128 two tiles' accumulators and
// fragments would not fit a thread's 255 registers (FlashAttention-2 keeps
// its queries in shared memory there).
template <int kD>
constexpr int kWarpTiles = kD <= 64 ? 2 : 1;
// Blocks an SM must hold at once of a kernel with kTiles tiles a warp: with
// two, 2 (255 registers a thread); with one, kOne.
template <int kTiles, int kOne>
constexpr int kTileMinBlocks = kTiles > 1 ? 2 : kOne;

// Whether two key tiles are a variant for D and A: bf16 activations (cp.async)
// within the budget.
template <int kD, typename A>
constexpr bool kTwoKeyTiles = std::is_same_v<A, uint16_t> &&
                              2 * sizeof(KeyValueTiles<kD>) <= kSharedBudget;

// The variants' shared memory, one buffer of 16-byte words that each kernel
// takes as its tiles (dynamic, so that a launch may have more than 48 KiB).
struct alignas(16) Shared16 {
  uint32_t w[4];
};

// Keys [k0, k0 + kKeys) of the head into the shared tiles, once every warp is
// done with the previous ones, through registers (fp32 activations rounded,
// rows not 16-byte aligned).
template <int kD, typename A>
AMSP_DEVICE_INLINE void stage_keys(KeyValueTiles<kD>& tiles, const A* k, const A* v, const Head& hd,
                                   int64_t k0, int64_t T) {
  __syncthreads();  // every warp is done with the previous tiles
  stage_rows<kD>(tiles.k, k + hd.kv_off, hd.ldk, k0, kKeys, T);
  stage_rows<kD>(tiles.v, v + hd.kv_off, hd.ldk, k0, kKeys, T);
  __syncthreads();
}

// Rows [first, first + kN) of one head's [T, kD] slice (row stride ld, every
// row 16-byte aligned) into shared memory as copies of the thread's open
// cp.async group; rows at or past T are 0. Where a row's 16-byte pieces divide
// the block's threads, each thread copies the same piece of every kStep-th
// row: a constant step between its addresses, no division per copy (at D = 64
// the index arithmetic was most of the copy loop's 29 instructions a piece).
template <int kD, int kN>
AMSP_DEVICE_INLINE void fetch_rows(uint16_t* dst, const uint16_t* src, int64_t ld, int64_t first,
                                   int64_t T) {
  constexpr int kChunks = kD / 8;  // 16-byte pieces of a row
  if constexpr (kThreads % kChunks == 0 && kN % (kThreads / kChunks) == 0) {
    constexpr int kStep = kThreads / kChunks;
    const int c = 8 * (threadIdx.x % kChunks), r0 = threadIdx.x / kChunks;
    const int below = static_cast<int>(T - first < kN ? T - first : kN);  // rows below T
    int64_t at = (first + r0) * ld + c;
    AMSP_UNROLL
    for (int j = 0; j < kN / kStep; ++j, at += kStep * ld) {
      const bool in = r0 + j * kStep < below;
      cp_async16(dst + (r0 + j * kStep) * (kD + kPad) + c, src + (in ? at : c), in);
    }
  } else {
    for (int i = threadIdx.x; i < kN * kChunks; i += kThreads) {
      const int r = i / kChunks, c = 8 * (i % kChunks);
      const bool in = first + r < T;
      cp_async16(dst + r * (kD + kPad) + c, src + (in ? first + r : 0) * ld + c, in);
    }
  }
}

// The copies of keys [k0, k0 + kKeys) of the head and their values into the
// shared tiles as one group of cp.async (rows at or past T are 0).
template <int kD>
AMSP_DEVICE_INLINE void fetch_keys(KeyValueTiles<kD>& tiles, const uint16_t* k, const uint16_t* v,
                                   const Head& hd, int64_t k0, int64_t T) {
  fetch_rows<kD, kKeys>(tiles.k, k + hd.kv_off, hd.ldk, k0, T);
  fetch_rows<kD, kKeys>(tiles.v, v + hd.kv_off, hd.ldk, k0, T);
  cp_async_commit();
}

// body(tiles, k0) for each key tile [k0, k0 + kKeys) up to q_last, with its
// keys and values in shared memory, visible to every warp. With
// sh.async_kv the tiles come by cp.async, the next one while body runs on this
// one when there are two stages; else stage_keys stages each.
template <int kStagesN, int kD, typename A, typename Body>
AMSP_DEVICE_INLINE void for_each_key_tile(KeyValueTiles<kD> (&tiles)[kStagesN], const A* k,
                                          const A* v, const Head& hd, int64_t q_last,
                                          const Shape& sh, Body&& body) {
  if constexpr (std::is_same_v<A, uint16_t>) {
    if (sh.async_kv) {
      const int64_t n = q_last / kKeys + 1;
      fetch_keys<kD>(tiles[0], k, v, hd, 0, sh.T);
      for (int64_t t = 0; t < n; ++t) {
        KeyValueTiles<kD>& tile = tiles[t % kStagesN];
        if (kStagesN == 2 && t + 1 < n) {
          fetch_keys<kD>(tiles[(t + 1) % kStagesN], k, v, hd, (t + 1) * kKeys, sh.T);
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        __syncthreads();  // tile t has landed, from every thread's copies
        body(tile, t * kKeys);
        __syncthreads();  // every warp is done with tile t before it is copied over
        if (kStagesN == 1 && t + 1 < n) fetch_keys<kD>(tile, k, v, hd, (t + 1) * kKeys, sh.T);
      }
      return;
    }
  }
  for (int64_t k0 = 0; k0 <= q_last; k0 += kKeys) {
    stage_keys<kD>(tiles[0], k, v, hd, k0, sh.T);
    body(tiles[0], k0);
  }
}

// One key tile of the online softmax for the 16 rows from row0, in base 2 as
// FlashAttention-2 takes it: the raw scores s (masked here, only in a tile
// that reaches past row0 or past T) become the probabilities
// 2^(s scale_log2 - m scale_log2), one multiply-add and one exp2_approx each,
// rounded to bf16 and packed in pairs into p as the product with v takes them
// (and left in s, rounded, for the sum); the running maximum m (of raw
// scores) and sum l of the lane's two rows move on, and rescale says by how
// much the output accumulated so far shrinks. Key k0 <= row0 is in the tile
// and every row (rows past T too) sees it, so the maximum is finite from the
// first tile on, and 2^-inf = 0 for masked keys and for the first rescale.
// kMasked: the caller's tile may reach past a row or past T.
template <bool kMasked>
AMSP_DEVICE_INLINE void softmax_tile(float (&s)[kKeys / 8][4], uint32_t (&p)[kKeys / 8][2],
                                     float (&m)[2], float (&l)[2], float (&rescale)[2], int64_t k0,
                                     int64_t row0, const Shape& sh) {
  // Warp-uniform: the diagonal, or the end.
  if (kMasked && (k0 + kKeys - 1 > row0 || k0 + kKeys > sh.T))
    for (int n = 0; n < kKeys / 8; ++n)
      for (int i = 0; i < 4; ++i) {
        const int64_t key = c_col(k0 + 8 * n, i);
        if (key > c_row(row0, i) || key >= sh.T) s[n][i] = -INFINITY;
      }
  float mx[2] = {-INFINITY, -INFINITY};
  for (int n = 0; n < kKeys / 8; ++n)
    for (int i = 0; i < 4; ++i) mx[i / 2] = fmaxf(mx[i / 2], s[n][i]);
  float shift[2];  // m scale_log2
  for (int j = 0; j < 2; ++j) {
    const float m_new = fmaxf(m[j], quad_max(mx[j]));
    rescale[j] = exp2_approx((m[j] - m_new) * sh.scale_log2);
    m[j] = m_new;
    shift[j] = m_new * sh.scale_log2;
    l[j] *= rescale[j];
  }
  for (int n = 0; n < kKeys / 8; ++n)
    for (int j = 0; j < 2; ++j) {
      float& lo = s[n][2 * j];
      float& hi = s[n][2 * j + 1];
      p[n][j] = pack_bf16(exp2_approx(fmaf(lo, sh.scale_log2, -shift[j])),
                          exp2_approx(fmaf(hi, sh.scale_log2, -shift[j])));
      unpack_bf16(p[n][j], lo, hi);  // what P v multiplies by
      l[j] += lo;
      l[j] += hi;
    }
}

// Forward's end for the 16 rows from row0: each output row divided by its
// sum, and its log-sum-exp (natural units) from the maximum and sum.
template <int kD, typename A>
AMSP_DEVICE_INLINE void store_rows(const float (&o)[kD / 8][4], const float (&m)[2], float (&l)[2],
                                   int64_t row0, A* out, float* lse, const Head& hd,
                                   const Shape& sh) {
  for (int j = 0; j < 2; ++j) l[j] = quad_sum(l[j]);
  for (int n = 0; n < kD / 8; ++n)
    for (int j = 0; j < 2; ++j) {
      const int64_t row = c_row(row0, 2 * j);
      if (row < sh.T)
        store_pair(out + hd.o_off + row * hd.ldo + c_col(8 * n, 2 * j), o[n][2 * j] / l[j],
                   o[n][2 * j + 1] / l[j]);
    }
  if (threadIdx.x % 4 == 0)
    for (int j = 0; j < 2; ++j) {
      const int64_t row = c_row(row0, 2 * j);
      if (row < sh.T) lse[hd.lse_off + row] = m[j] * sh.scale + logf(l[j]);
    }
}

// Forward: block (b*H + h, query tile of kWarps * V::row_tiles * 16 rows);
// V::stages key tiles in its V::stages * sizeof(KeyValueTiles) bytes of
// dynamic shared memory. Each row tile takes the same products in the same
// order as alone: the same bits whatever the row tiles a warp.
template <typename V>  // Fwd<head dim, activation dtype, key tiles, row tiles>
__global__ void __launch_bounds__(kThreads, kTileMinBlocks<V::row_tiles, kMinBlocks<V::value>>)
    attention_forward_bf16_kernel(const Act<V>* q, const Act<V>* k, const Act<V>* v, float* lse,
                                  Act<V>* out, Shape sh) {
  constexpr int kD = V::value, kM = V::row_tiles;
  constexpr int kLd = kD + kPad;
  // A key tile that reaches a warp's rows reaches its first row (causal
  // order, softmax_tile): the key tiles' starts step past whole warps' rows.
  static_assert(kKeys % (kM * kRows) == 0, "a warp's rows within one key tile");
  AMSP_DYNAMIC_SHARED(Shared16, smem);
  auto& tiles = *reinterpret_cast<KeyValueTiles<kD>(*)[V::stages]>(smem);
  const QueryRows rows = query_rows(kD, sh, kM * kRows);
  const Head& hd = rows.hd;
  const int64_t row0 = rows.row0;  // row tile r's first row: row0 + 16 r
  uint32_t qa[kM][kD / 16][4];
  AMSP_UNROLL
  for (int r = 0; r < kM; ++r) load_a_rows<kD>(qa[r], q + hd.q_off, hd.ldq, row0 + kRows * r, sh.T);

  float o[kM][kD / 8][4] = {}, m[kM][2], l[kM][2] = {};
  AMSP_UNROLL
  for (int r = 0; r < kM; ++r) m[r][0] = m[r][1] = -INFINITY;
  // One key tile's products and softmax; kMasked: it may reach past a row or past T.
  auto keys = [&](const KeyValueTiles<kD>& kv, int64_t k0, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    float s[kM][kKeys / 8][4] = {};
    AMSP_UNROLL
    for (int n = 0; n < kKeys / 8; n += 2) mma_dots<kD>(s, n, qa, kv.k + 8 * n * kLd);
    uint32_t p[kM][kKeys / 8][2];
    AMSP_UNROLL
    for (int r = 0; r < kM; ++r) {
      float rescale[2];
      softmax_tile<kMasked>(s[r], p[r], m[r], l[r], rescale, k0, row0 + kRows * r, sh);
      for (int n = 0; n < kD / 8; ++n)
        for (int i = 0; i < 4; ++i) o[r][n][i] *= rescale[i / 2];
    }
    AMSP_UNROLL
    for (int c = 0; c < kKeys / 16; ++c) {
      uint32_t pa[kM][4];  // the A fragment of keys [16 c, 16 c + 16): two C tiles' pairs
      AMSP_UNROLL
      for (int r = 0; r < kM; ++r)
        for (int i = 0; i < 4; ++i) pa[r][i] = p[r][2 * c + i / 2][i % 2];
      mma_rows<kD>(o, pa, kv.v + 16 * c * kLd);
    }
  };
  for_each_key_tile(tiles, k, v, hd, rows.q_last, sh, [&](const KeyValueTiles<kD>& kv, int64_t k0) {
    if (k0 > row0 + kM * kRows - 1) return;  // causal: none of these keys for this warp
    // Warp-uniform: every key of the tile at or before the warp's first row and before T.
    if (k0 + kKeys - 1 <= row0 && k0 + kKeys <= sh.T)
      keys(kv, k0, std::false_type{});
    else
      keys(kv, k0, std::true_type{});
  });

  AMSP_UNROLL
  for (int r = 0; r < kM; ++r) store_rows<kD>(o[r], m[r], l[r], row0 + kRows * r, out, lse, hd, sh);
}

// dq's dS = P (dP - delta) of the 16 rows from row0 against keys [kc, kc +
// 16), in place of their scores s (P = 0 for a key past a row, past T, or a
// row past T: kMasked, where the caller's tile may hold such keys or rows).
template <bool kMasked>
AMSP_DEVICE_INLINE void ds_tile(float (&s)[2][4], const float (&dp)[2][4], const float (&lse2)[2],
                                const float (&delta)[2], int64_t kc, int64_t row0,
                                const Shape& sh) {
  // Warp-uniform: whether some of these keys are past a row, past T, or rows past T.
  const bool edge = kMasked && (kc + 15 > row0 || kc + 16 > sh.T || row0 + kRows > sh.T);
  for (int half = 0; half < 2; ++half)
    for (int i = 0; i < 4; ++i) {
      float p = probability(s[half][i], lse2[i / 2], sh);
      if (edge) {
        const int64_t key = c_col(kc + 8 * half, i), row = c_row(row0, i);
        if (key > row || key >= sh.T || row >= sh.T) p = 0.0f;
      }
      s[half][i] = p * (dp[half][i] - delta[i / 2]);
    }
}

// One key tile [k0, k0 + kKeys) of dq's sums for a warp's kM row tiles from
// row0, in sub-tiles of 16 keys up to the warp's last row. kMasked: the tile
// may hold keys past a row or past T, or the warp rows past T (the diagonal,
// the end); the other tiles, most of them, run without the mask's compares.
template <bool kMasked, int kD, int kM>
AMSP_DEVICE_INLINE void dq_keys(float (&acc)[kM][kD / 8][4], const uint32_t (&qa)[kM][kD / 16][4],
                                const uint32_t (&da)[kM][kD / 16][4], const float (&lse2)[kM][2],
                                const float (&delta)[kM][2], const KeyValueTiles<kD>& kv,
                                int64_t k0, int64_t row0, const Shape& sh) {
  constexpr int kLd = kD + kPad;
  // Kept a loop: unrolled, the unmasked path took 3.9 instructions a product and 198
  // registers at D = 64 (nvcc 13, sm_90) against 3.4 and 146.
  AMSP_NO_UNROLL
  for (int c = 0; c < kKeys / 16; ++c) {
    if (kMasked && k0 + 16 * c > row0 + kM * kRows - 1) break;  // past the warp's last row
    float s[kM][2][4] = {}, dp[kM][2][4] = {};
    mma_dots<kD>(s, 0, qa, kv.k + 16 * c * kLd);
    mma_dots<kD>(dp, 0, da, kv.v + 16 * c * kLd);
    uint32_t dsa[kM][4];
    AMSP_UNROLL
    for (int r = 0; r < kM; ++r) {
      ds_tile<kMasked>(s[r], dp[r], lse2[r], delta[r], k0 + 16 * c, row0 + kRows * r, sh);
      a_from_c(dsa[r], s[r][0], s[r][1]);
    }
    mma_rows<kD>(acc, dsa, kv.k + 16 * c * kLd);
  }
}

// dq = scale * sum over keys of dS k, dS = P (dP - delta), P = exp(score -
// lse), dP = dout . v. Block (b*H + h, query tile of kWarps * V::row_tiles *
// 16 rows); keys in sub-tiles of 16, each one A fragment of dS a row tile.
// Shared memory as forward's. A warp walks the keys up to its last row: its
// first row tile multiplies a last sub-tile whose dS is all masked to 0,
// which leaves its sums as they are, so the bits are one row tile's.
template <typename V>  // Fwd<head dim, activation dtype, key tiles, row tiles>
__global__ void __launch_bounds__(kThreads, kTileMinBlocks<V::row_tiles, 1>)
    attention_dq_bf16_kernel(const Act<V>* q, const Act<V>* k, const Act<V>* v, const float* lse,
                             const Act<V>* dout, const float* delta, Act<V>* dq, Shape sh) {
  constexpr int kD = V::value, kM = V::row_tiles;
  AMSP_DYNAMIC_SHARED(Shared16, smem);
  auto& tiles = *reinterpret_cast<KeyValueTiles<kD>(*)[V::stages]>(smem);
  const QueryRows rows = query_rows(kD, sh, kM * kRows);
  const Head& hd = rows.hd;
  const int64_t row0 = rows.row0;  // row tile r's first row: row0 + 16 r
  uint32_t qa[kM][kD / 16][4], da[kM][kD / 16][4];
  float row_lse2[kM][2], row_delta[kM][2];  // lse times log2(e) (probability), delta
  AMSP_UNROLL
  for (int r = 0; r < kM; ++r) {
    load_a_rows<kD>(qa[r], q + hd.q_off, hd.ldq, row0 + kRows * r, sh.T);
    load_a_rows<kD>(da[r], dout + hd.o_off, hd.ldo, row0 + kRows * r, sh.T);
    for (int j = 0; j < 2; ++j) {
      const int64_t row = c_row(row0 + kRows * r, 2 * j);
      row_lse2[r][j] = row < sh.T ? lse[hd.lse_off + row] * kLog2e : 0.0f;
      row_delta[r][j] = row < sh.T ? delta[hd.lse_off + row] : 0.0f;
    }
  }

  float acc[kM][kD / 8][4] = {};
  for_each_key_tile(tiles, k, v, hd, rows.q_last, sh, [&](const KeyValueTiles<kD>& kv, int64_t k0) {
    // Warp-uniform: every key of the tile at or before the warp's first row and
    // before T, and every row of the warp before T.
    if (k0 + kKeys - 1 <= row0 && k0 + kKeys <= sh.T && row0 + kM * kRows <= sh.T)
      dq_keys<false>(acc, qa, da, row_lse2, row_delta, kv, k0, row0, sh);
    else
      dq_keys<true>(acc, qa, da, row_lse2, row_delta, kv, k0, row0, sh);
  });
  AMSP_UNROLL
  for (int r = 0; r < kM; ++r) {
    const int64_t first = row0 + kRows * r;
    finish_gradient<kD>(acc[r], first, sh.T, sh.scale, sh.rope);
    for (int n = 0; n < kD / 8; ++n)
      for (int j = 0; j < 2; ++j) {
        const int64_t row = c_row(first, 2 * j);
        if (row < sh.T)
          store_pair(dq + hd.q_off + row * hd.ldq + c_col(8 * n, 2 * j), acc[r][n][2 * j],
                     acc[r][n][2 * j + 1]);
      }
  }
}

// A staged tile of kR query rows for dk/dv: their q and dout, lse
// times log2(e) (probability) and delta.
template <int kD, int kR>
struct alignas(16) QueryTile {
  uint16_t q[kR * (kD + kPad)];
  uint16_t dout[kR * (kD + kPad)];
  float lse2[kR];
  float delta[kR];
};

// The dk/dv kernel's variants: head dim, activation dtype, query rows per
// staged tile, tiles in shared memory (2: the next copied by cp.async while
// the warps multiply this one), and tiles of 16 keys a warp owns.
template <int kD, typename A, int kR, int kS, int kM = 1>
struct Dkv {
  static constexpr int D = kD, rows = kR, stages = kS, key_tiles = kM;
  using Type = A;
};

// Its shared memory: the block's keys and values, and the query tiles.
template <typename W>
struct alignas(16) DkvTiles {
  uint16_t k[kTile * W::key_tiles * (W::D + kPad)];
  uint16_t v[kTile * W::key_tiles * (W::D + kPad)];
  QueryTile<W::D, W::rows> queries[W::stages];
};

// Query rows per tile of the cp.async variant with kM key tiles a warp: the
// most of 32 or 16 with which two tiles fit beside the keys and values in
// the budget (0: none does).
template <int kD, int kM>
constexpr int kAsyncQueries = sizeof(DkvTiles<Dkv<kD, bf16, 32, 2, kM>>) <= kSharedBudget   ? 32
                              : sizeof(DkvTiles<Dkv<kD, bf16, 16, 2, kM>>) <= kSharedBudget ? 16
                                                                                            : 0;

// The tile's lse times log2(e) and delta (rows at or past T are 0), by plain
// loads.
template <int kD, int kR>
AMSP_DEVICE_INLINE void load_lse_delta(QueryTile<kD, kR>& t, const float* lse, const float* delta,
                                       const Head& hd, int64_t r0, int64_t T) {
  for (int i = threadIdx.x; i < kR; i += blockDim.x) {
    t.lse2[i] = r0 + i < T ? lse[hd.lse_off + r0 + i] * kLog2e : 0.0f;
    t.delta[i] = r0 + i < T ? delta[hd.lse_off + r0 + i] : 0.0f;
  }
}

// Query rows [r0, r0 + kR) of head hd into a tile with their lse and delta,
// through registers, once every warp is done with the previous ones.
template <int kD, int kR, typename A>
AMSP_DEVICE_INLINE void stage_queries(QueryTile<kD, kR>& t, const A* q, const A* dout,
                                      const float* lse, const float* delta, const Head& hd,
                                      int64_t r0, int64_t T) {
  __syncthreads();
  stage_rows<kD>(t.q, q + hd.q_off, hd.ldq, r0, kR, T);
  stage_rows<kD>(t.dout, dout + hd.o_off, hd.ldo, r0, kR, T);
  load_lse_delta(t, lse, delta, hd, r0, T);
  __syncthreads();
}

// The same rows as one group of cp.async, lse and delta by plain loads; all
// visible after the thread's wait and a barrier.
template <int kD, int kR>
AMSP_DEVICE_INLINE void fetch_queries(QueryTile<kD, kR>& t, const uint16_t* q, const uint16_t* dout,
                                      const float* lse, const float* delta, const Head& hd,
                                      int64_t r0, int64_t T) {
  fetch_rows<kD, kR>(t.q, q + hd.q_off, hd.ldq, r0, T);
  fetch_rows<kD, kR>(t.dout, dout + hd.o_off, hd.ldo, r0, T);
  cp_async_commit();
  load_lse_delta(t, lse, delta, hd, r0, T);
}

// body(tile, r0) for each tile of query rows [r0, r0 + kR) from `first` on,
// staged and visible to every warp: by cp.async, the next tile copied while
// body runs on this one, in the two-stage variant; else through registers.
template <typename W, typename Body>
AMSP_DEVICE_INLINE void for_each_query_tile(DkvTiles<W>& tiles, const typename W::Type* q,
                                            const typename W::Type* dout, const float* lse,
                                            const float* delta, const Head& hd, int64_t first,
                                            const Shape& sh, Body&& body) {
  constexpr int kD = W::D, kR = W::rows;
  if constexpr (W::stages == 2) {
    const int64_t n = (sh.T - first + kR - 1) / kR;
    fetch_queries(tiles.queries[0], q, dout, lse, delta, hd, first, sh.T);
    for (int64_t t = 0; t < n; ++t) {
      QueryTile<kD, kR>& tile = tiles.queries[t % 2];
      const int64_t r0 = first + t * kR;
      if (t + 1 < n) {
        fetch_queries(tiles.queries[(t + 1) % 2], q, dout, lse, delta, hd, r0 + kR, sh.T);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // tile t has landed, from every thread's copies and loads
      body(tile, r0);
      __syncthreads();  // every warp is done with tile t before it is copied over
    }
  } else {
    for (int64_t r0 = first; r0 < sh.T; r0 += kR) {
      stage_queries(tiles.queries[0], q, dout, lse, delta, hd, r0, sh.T);
      body(tiles.queries[0], r0);
    }
  }
}

// Sixteen staged query rows' share of a warp's dv and dk (rows r0.. of the
// staged tile, from its row `at0` on), for each of its kM tiles of 16 keys
// (tile r: keys key0 + 16 r on, at k_w and v_w + 16 r rows in shared memory):
// the transposed scores S^T = k q^T and dP^T = v dout^T, then P^T and dS^T as
// the left operands of P^T dout and dS^T q. The query rows' fragments are
// loaded once for all the tiles. kMasked: some key may lie past a row, or a
// row past T (the caller's warp-uniform test); the other tiles, most of them,
// run without the mask's compares.
template <bool kMasked, int kD, int kR, int kM>
AMSP_DEVICE_INLINE void dkv_tile(float (&dk_acc)[kM][kD / 8][4], float (&dv_acc)[kM][kD / 8][4],
                                 const uint16_t* k_w, const uint16_t* v_w,
                                 const QueryTile<kD, kR>& tile, int at0, int64_t key0, int64_t r0,
                                 const Shape& sh) {
  constexpr int kLd = kD + kPad;
  const uint16_t* q_t = tile.q + at0 * kLd;
  const uint16_t* dout_t = tile.dout + at0 * kLd;
  float st[kM][2][4] = {}, dpt[kM][2][4] = {};
  for (int c = 0; c < kD / 16; ++c) {
    uint32_t bq[2][2], bd[2][2];  // [half]: query rows 0-7, 8-15
    load_b_nk_n2(bq, q_t + 16 * c, kLd);
    load_b_nk_n2(bd, dout_t + 16 * c, kLd);
    AMSP_UNROLL
    for (int r = 0; r < kM; ++r) {
      uint32_t ka[4], va[4];
      load_a(ka, k_w + 16 * r * kLd + 16 * c, kLd);
      load_a(va, v_w + 16 * r * kLd + 16 * c, kLd);
      for (int half = 0; half < 2; ++half) {
        mma_bf16_16x8x16(st[r][half], ka, bq[half]);
        mma_bf16_16x8x16(dpt[r][half], va, bd[half]);
      }
    }
  }
  uint32_t pa[kM][4], dsa[kM][4];
  AMSP_UNROLL
  for (int r = 0; r < kM; ++r) {
    const int64_t first = key0 + kRows * r;
    const bool edge = kMasked && (first + kRows - 1 > r0 || r0 + 15 >= sh.T);  // past a row, or T
    for (int half = 0; half < 2; ++half)
      for (int i = 0; i < 4; ++i) {
        const int at = at0 + 8 * half + static_cast<int>(c_col(0, i));
        float p = probability(st[r][half][i], tile.lse2[at], sh);
        if (edge) {
          const int64_t key = c_row(first, i), row = r0 + at - at0;
          if (key > row || row >= sh.T) p = 0.0f;
        }
        st[r][half][i] = p;
        dpt[r][half][i] = p * (dpt[r][half][i] - tile.delta[at]);
      }
    a_from_c(pa[r], st[r][0], st[r][1]);
    a_from_c(dsa[r], dpt[r][0], dpt[r][1]);
  }
  mma_rows<kD, false>(dv_acc, pa, dout_t);
  mma_rows<kD, false>(dk_acc, dsa, q_t);
}

// Where the dk/dv kernel writes: dk and dv themselves (row stride ldkv) when
// every kv head serves one query head, else query head h's fp32 share, in
// the workspace slice (h mod group) of [group][B*T, KV*D] (attention_dkv_sum).
template <typename A>
struct DkvOut {
  A *dk, *dv;                       // when H == KV
  float *dk_shares, *dv_shares;     // when H > KV
  int64_t ld, per_share;
};

// The dk/dv kernel's two adjacent outputs at `at` (rows of o.ld), into the
// shares or into dk and dv.
template <typename A>
AMSP_DEVICE_INLINE void store_dkv(const DkvOut<A>& o, int64_t at, const float (&dk)[4],
                                  const float (&dv)[4], int j) {
  if (o.dk_shares) {
    store_pair(o.dk_shares + at, dk[2 * j], dk[2 * j + 1]);
    store_pair(o.dv_shares + at, dv[2 * j], dv[2 * j + 1]);
  } else {
    store_pair(o.dk + at, dk[2 * j], dk[2 * j + 1]);
    store_pair(o.dv + at, dv[2 * j], dv[2 * j + 1]);
  }
}

// dv = sum over queries of P^T dout, dk = scale * sum of dS^T q, over the
// query rows at or below each key, for one query head. Block (b*H + h, key
// tile), the early keys (most queries) first: the query heads of a kv group
// run side by side, and their shares are summed in head order afterwards
// (attention_dkv_sum_kernel), so the bits do not depend on timing. A warp's
// scores are transposed (keys x queries) so that P^T and dS^T are the A
// fragments of the products that form dv and dk.
//
// With W::key_tiles tiles of 16 keys a warp, a tile of keys multiplies the
// staged query rows from its warp's first key on: its first 16 rows lie above
// a second tile's keys, whose P and dS there are masked to 0, which leaves
// its sums as they are, so the bits are one key tile's.
template <typename W>  // Dkv<head dim, activation dtype, query rows per tile, tiles, key tiles>
__global__ void __launch_bounds__(kThreads, kTileMinBlocks<W::key_tiles, kMinBlocks<W::D>>)
    attention_dkv_bf16_kernel(const typename W::Type* q, const typename W::Type* k,
                              const typename W::Type* v, const float* lse,
                              const typename W::Type* dout, const float* delta,
                              DkvOut<typename W::Type> o, Shape sh) {
  constexpr int kD = W::D, kR = W::rows, kM = W::key_tiles, kLd = kD + kPad;
  constexpr int kWarpKeys = kM * kRows, kBlockKeys = kWarps * kWarpKeys;
  AMSP_DYNAMIC_SHARED(Shared16, smem);  // sizeof(DkvTiles<W>) bytes
  DkvTiles<W>& tiles = *reinterpret_cast<DkvTiles<W>*>(smem);
  const int64_t b = blockIdx.x / sh.H, h = blockIdx.x % sh.H, kvh = h / sh.group;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kBlockKeys;
  const int64_t key0 = k0 + threadIdx.x / 32 * kWarpKeys;  // this warp's first key
  const Head hd = head_of(b, h, kD, sh);
  stage_rows<kD>(tiles.k, k + hd.kv_off, hd.ldk, k0, kBlockKeys, sh.T);
  stage_rows<kD>(tiles.v, v + hd.kv_off, hd.ldk, k0, kBlockKeys, sh.T);
  const uint16_t* k_w = tiles.k + (threadIdx.x / 32) * kWarpKeys * kLd;
  const uint16_t* v_w = tiles.v + (threadIdx.x / 32) * kWarpKeys * kLd;

  float dk_acc[kM][kD / 8][4] = {}, dv_acc[kM][kD / 8][4] = {};
  // Causal: the rows at or below the block's keys.
  for_each_query_tile(tiles, q, dout, lse, delta, hd, k0, sh,
                      [&](const QueryTile<kD, kR>& tile, int64_t r0) {
                        for (int at0 = 0; at0 < kR; at0 += 16) {
                          const int64_t row = r0 + at0;   // the first of these 16 rows
                          if (row + 15 < key0) continue;  // every row above this warp's keys
                          if (key0 + kWarpKeys - 1 > row || row + 15 >= sh.T)
                            dkv_tile<true, kD>(dk_acc, dv_acc, k_w, v_w, tile, at0, key0, row, sh);
                          else
                            dkv_tile<false, kD>(dk_acc, dv_acc, k_w, v_w, tile, at0, key0, row, sh);
                        }
                      });
  const int64_t base = (h % sh.group) * o.per_share + b * sh.T * o.ld + kvh * kD;
  AMSP_UNROLL
  for (int r = 0; r < kM; ++r) {
    const int64_t first = key0 + kRows * r;
    // A share is rotated back after the shares are summed.
    finish_gradient<kD>(dk_acc[r], first, sh.T, sh.scale, o.dk_shares ? Rotary{} : sh.rope);
    for (int n = 0; n < kD / 8; ++n)
      for (int j = 0; j < 2; ++j) {
        const int64_t key = c_row(first, 2 * j);
        if (key < sh.T)
          store_dkv(o, base + key * o.ld + c_col(8 * n, 2 * j), dk_acc[r][n], dv_acc[r][n], j);
      }
  }
}

// dk and dv (row stride ldkv) = the sum of the group's shares in head order,
// dk then rotated back by each row's position with rope tables. The shares
// are [B*T, KV*D]; a thread takes the pair of columns d and d + D/2 of one
// kv head of one row.
template <typename A>
__global__ void attention_dkv_sum_kernel(const float* dk_shares, const float* dv_shares, A* dk,
                                         A* dv, int64_t rows, int64_t width, int64_t ldkv,
                                         int group, int64_t T, int D, Rotary rope) {
  const int64_t n = rows * width, half = D / 2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n / 2;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / (width / 2), col = (i % (width / 2)) / half * D + i % half;
    const int64_t lo = row * width + col, hi = lo + half;
    float k[2] = {0.0f, 0.0f}, v[2] = {0.0f, 0.0f};
    for (int g = 0; g < group; ++g) {
      k[0] += dk_shares[g * n + lo];
      k[1] += dk_shares[g * n + hi];
      v[0] += dv_shares[g * n + lo];
      v[1] += dv_shares[g * n + hi];
    }
    if (rope.cos) {
      const int64_t at = row % T * half + i % half;
      rope_rotate(k[0], k[1], rope.cos[at], -rope.sin[at]);
    }
    const int64_t at = row * ldkv + col;
    store(dk + at, k[0]);
    store(dk + at + half, k[1]);
    store(dv + at, v[0]);
    store(dv + at + half, v[1]);
  }
}

// Calls launch(std::integral_constant<int, D>) for a supported head dim.
template <typename Launch>
void with_head_dim(int64_t D, Launch launch) {
  switch (D) {
    case 16: return launch(std::integral_constant<int, 16>{});
    case 32: return launch(std::integral_constant<int, 32>{});
    case 48: return launch(std::integral_constant<int, 48>{});
    case 64: return launch(std::integral_constant<int, 64>{});
    case 80: return launch(std::integral_constant<int, 80>{});
    case 96: return launch(std::integral_constant<int, 96>{});
    case 112: return launch(std::integral_constant<int, 112>{});
    case 128: return launch(std::integral_constant<int, 128>{});
    default: break;
  }
}

// The shapes this file supports (require_shape; attention.cu asks
// attention_tc_supports before it calls here). bf16 activations are read and
// written two at a time in one 32-bit access: their pointers and row strides
// must keep every pair 4-byte aligned.
template <typename A>
Shape shape_of(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int64_t ldq, int64_t ldkv,
               Rotary rope, std::initializer_list<const A*> pointers, const char* what) {
  require_shape(what, attention_tc_supports(D), "D a multiple of 16 up to 128", kTile, T, H, KV, D,
                ldq, ldkv);
  if (std::is_same_v<A, bf16>) {
    bool aligned = ldq % 2 == 0 && ldkv % 2 == 0;
    for (const A* p : pointers) aligned = aligned && reinterpret_cast<uintptr_t>(p) % 4 == 0;
    if (!aligned) {
      std::fprintf(stderr, "amsp: %s: bf16 rows must start 4-byte aligned (even row strides, "
                   "got ldq=%lld ldkv=%lld, and 4-byte aligned pointers)\n",
                   what, static_cast<long long>(ldq), static_cast<long long>(ldkv));
      std::abort();
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  return Shape{B,   T,    H,    KV,   static_cast<int>(H / KV), scale, scale * kLog2e,
               ldq, ldkv, rope, false};
}

// Whether key tiles can come by cp.async: bf16 k and v whose rows all start
// 16-byte aligned (cp.async copies 16 bytes at a time).
template <typename A>
bool async_keys(const A* k, const A* v, int64_t ldkv) {
  return std::is_same_v<A, bf16> && ldkv % 8 == 0 && reinterpret_cast<uintptr_t>(k) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(v) % 16 == 0;
}

// Whether dk/dv's query tiles can come by cp.async: bf16 q and dout whose
// rows all start 16-byte aligned (dout's row stride H * D always is).
template <typename A>
bool async_queries(const A* q, const A* dout, int64_t ldq) {
  return std::is_same_v<A, bf16> && ldq % 8 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(dout) % 16 == 0;
}

// Query tiles of `rows` over T: a launch's grid.y.
unsigned tiles_of(int64_t T, int64_t rows = kTile) {
  return static_cast<unsigned>((T + rows - 1) / rows);
}

// Whether a block may have `bytes` of shared memory on the current device:
// any launch up to 48 KiB, more where the device allows a kernel to opt in
// (an A100 163 KiB, an H100 227, a T4 64).
bool shared_fits(size_t bytes) {
  if (bytes <= kSharedNoOptIn) return true;
  int device = 0, most = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    (void)cudaGetLastError();  // then the variants that need no opt-in
    return false;
  }
  return bytes <= static_cast<size_t>(most);
}

// `bytes` of dynamic shared memory for a launch of `kernel`, which opts in
// first where they are more than 48 KiB (a failure shows at the launch).
template <typename Kernel>
size_t shared_for(Kernel kernel, size_t bytes) {
  if (bytes > kSharedNoOptIn)
    (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(bytes));
  return bytes;
}

// Tiles of 16 rows a warp where the head dim allows two (set_attention_warp_tiles):
// one, which an H200 ran 7% faster forward and 9% backward at D = 64 (doc/gpu.md).
std::atomic<int> warp_tiles{1};

// Whether forward, dq and dk/dv take two tiles a warp at head dim kD.
template <int kD>
bool two_warp_tiles() {
  return kWarpTiles<kD> == 2 && warp_tiles.load(std::memory_order_relaxed) == 2;
}

// Forward's or dq's variant for D and A: two key tiles where the activations
// come by cp.async and two tiles fit, else one; two row tiles a warp where
// two_warp_tiles says so, else one.
template <int kD, typename A, typename Launch>
void with_key_tiles(bool async_kv, Launch launch) {
  static_assert(sizeof(KeyValueTiles<kD>) <= kSharedNoOptIn, "one tile needs no opt-in");
  auto with_rows = [&](auto stages) {
    constexpr int kS = decltype(stages)::value;
    if constexpr (kWarpTiles<kD> == 2) {
      if (two_warp_tiles<kD>()) return launch(Fwd<kD, A, kS, 2>{});
    }
    launch(Fwd<kD, A, kS, 1>{});
  };
  if constexpr (kTwoKeyTiles<kD, A>) {
    if (async_kv && shared_fits(2 * sizeof(KeyValueTiles<kD>)))
      return with_rows(std::integral_constant<int, 2>{});
  }
  with_rows(std::integral_constant<int, 1>{});
}

}  // namespace

bool attention_tc_supports(int64_t D) { return D >= 16 && D <= kMaxD && D % 16 == 0; }

void set_attention_warp_tiles(int tiles) { warp_tiles.store(tiles, std::memory_order_relaxed); }
int attention_warp_tiles() { return warp_tiles.load(std::memory_order_relaxed); }

int64_t attention_tc_partials(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  return H > KV ? 2 * H * B * T * D : 0;  // dk and dv, group (H / KV) shares of B*T*KV*D
}

// The launches (in the unnamed namespace: their lambdas capture its types).
namespace {

template <typename A>
void forward_tensor_cores(const A* q, const A* k, const A* v, int64_t ldq, int64_t ldkv, float* lse,
                          A* out, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                          cudaStream_t s) {
  if (B == 0 || T == 0 || H == 0) return;
  Shape sh =
      shape_of<A>(B, T, H, KV, D, ldq, ldkv, Rotary{}, {q, k, v, out}, "attention_forward_tc");
  sh.async_kv = async_keys(k, v, ldkv);
  AMSP_DEVICE_FLOPS(causal_flops(2, B, T, H, D), true);
  with_head_dim(D, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    with_key_tiles<kD, A>(sh.async_kv, [&](auto variant) {
      using V = decltype(variant);
      const size_t bytes =
          shared_for(attention_forward_bf16_kernel<V>, V::stages * sizeof(KeyValueTiles<V::value>));
      const dim3 grid(static_cast<unsigned>(B * H), tiles_of(T, kTile * V::row_tiles));
      AMSP_LAUNCH(attention_forward_bf16_kernel<V>, grid, kThreads, bytes, s)
      (q, k, v, lse, out, sh);
    });
  });
}

// dk/dv's launch for D and A: by cp.async in tiles of query rows where q and
// dout allow it and the device has the shared memory, two key tiles a warp
// where two_warp_tiles says so; else staged through registers, one key tile.
template <int kD, typename A>
void launch_dkv(const A* q, const A* k, const A* v, int64_t ldq, const float* lse, const A* dout,
                const float* delta, const DkvOut<A>& o, const Shape& sh, cudaStream_t s) {
  const unsigned heads = static_cast<unsigned>(sh.B * sh.H);
  if constexpr (std::is_same_v<A, bf16>) {
    auto by_cp_async = [&](auto key_tiles) {
      constexpr int kM = decltype(key_tiles)::value;
      if constexpr (kAsyncQueries < kD, kM >> 0) {
        using W = Dkv<kD, A, kAsyncQueries<kD, kM>, 2, kM>;
        if (!shared_fits(sizeof(DkvTiles<W>))) return false;
        const size_t bytes = shared_for(attention_dkv_bf16_kernel<W>, sizeof(DkvTiles<W>));
        AMSP_LAUNCH(attention_dkv_bf16_kernel<W>, dim3(heads, tiles_of(sh.T, kTile * kM)), kThreads,
                    bytes, s)
        (q, k, v, lse, dout, delta, o, sh);
        return true;
      }
      return false;
    };
    if (async_queries(q, dout, ldq)) {
      if constexpr (kWarpTiles<kD> == 2) {
        if (two_warp_tiles<kD>() && by_cp_async(std::integral_constant<int, 2>{})) return;
      }
      if (by_cp_async(std::integral_constant<int, 1>{})) return;
    }
  }
  using W = Dkv<kD, A, kQueries<kD>, 1>;
  static_assert(sizeof(DkvTiles<W>) <= kSharedNoOptIn, "the fallback needs no opt-in");
  AMSP_LAUNCH(attention_dkv_bf16_kernel<W>, dim3(heads, tiles_of(sh.T)), kThreads,
              sizeof(DkvTiles<W>), s)
  (q, k, v, lse, dout, delta, o, sh);
}

template <typename A>
void backward_tensor_cores(const A* q, const A* k, const A* v, int64_t ldq, int64_t ldkv,
                           Rotary rope, const float* lse, const A* out, const A* dout, A* dq, A* dk,
                           A* dv, float* workspace, int64_t B, int64_t T, int64_t H, int64_t KV,
                           int64_t D, cudaStream_t s) {
  if (B == 0 || T == 0 || H == 0) return;
  Shape sh = shape_of<A>(B, T, H, KV, D, ldq, ldkv, rope, {q, k, v, out, dout, dq, dk, dv},
                         "attention_backward_tc");
  sh.async_kv = async_keys(k, v, ldkv);
  float* delta = workspace;
  attention_delta(out, dout, delta, B, T, H, D, true, s);
  // Shares of dk and dv per query head (after delta) when kv heads are shared.
  const int64_t share = B * T * KV * D;
  float* shares = workspace + B * H * T;
  const DkvOut<A> o = H == KV ? DkvOut<A>{dk, dv, nullptr, nullptr, ldkv, 0}
                              : DkvOut<A>{nullptr, nullptr, shares, shares + sh.group * share,
                                          KV * D, share};
  AMSP_DEVICE_FLOPS(causal_flops(7, B, T, H, D), true);
  with_head_dim(D, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    with_key_tiles<kD, A>(sh.async_kv, [&](auto variant) {
      using V = decltype(variant);
      const size_t bytes =
          shared_for(attention_dq_bf16_kernel<V>, V::stages * sizeof(KeyValueTiles<kD>));
      const dim3 grid(static_cast<unsigned>(B * H), tiles_of(T, kTile * V::row_tiles));
      AMSP_LAUNCH(attention_dq_bf16_kernel<V>, grid, kThreads, bytes, s)
      (q, k, v, lse, dout, delta, dq, sh);
    });
    launch_dkv<kD>(q, k, v, ldq, lse, dout, delta, o, sh, s);
  });
  if (H != KV) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(1024, (share / 2 + 255) / 256));
    AMSP_LAUNCH(attention_dkv_sum_kernel<A>, blocks, 256, 0, s)
    (o.dk_shares, o.dv_shares, dk, dv, B * T, KV * D, ldkv, sh.group, T, static_cast<int>(D), rope);
  }
}

}  // namespace

template <typename A>
void attention_forward_tc(const A* q, const A* k, const A* v, int64_t ldq, int64_t ldkv, float* lse,
                          A* out, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                          cudaStream_t s) {
  forward_tensor_cores(q, k, v, ldq, ldkv, lse, out, B, T, H, KV, D, s);
}

template <typename A>
void attention_backward_tc(const A* q, const A* k, const A* v, int64_t ldq, int64_t ldkv,
                           Rotary rope, const float* lse, const A* out, const A* dout, A* dq, A* dk,
                           A* dv, float* workspace, int64_t B, int64_t T, int64_t H, int64_t KV,
                           int64_t D, cudaStream_t s) {
  backward_tensor_cores(q, k, v, ldq, ldkv, rope, lse, out, dout, dq, dk, dv, workspace, B, T, H,
                        KV, D, s);
}

template void attention_forward_tc(const float*, const float*, const float*, int64_t, int64_t,
                                   float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                   cudaStream_t);
template void attention_forward_tc(const bf16*, const bf16*, const bf16*, int64_t, int64_t, float*,
                                   bf16*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                   cudaStream_t);
template void attention_backward_tc(const float*, const float*, const float*, int64_t, int64_t,
                                    Rotary, const float*, const float*, const float*, float*,
                                    float*, float*, float*, int64_t, int64_t, int64_t, int64_t,
                                    int64_t, cudaStream_t);
template void attention_backward_tc(const bf16*, const bf16*, const bf16*, int64_t, int64_t, Rotary,
                                    const float*, const bf16*, const bf16*, bf16*, bf16*, bf16*,
                                    float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                    cudaStream_t);

}  // namespace amsp::kernels::cuda
