// Causal grouped-query attention for the CUDA backend, FlashAttention-2 style
// (kernels/cuda/ops.h states the contract; kernels/cpu/attention.cpp is the
// reference it is tested against).
//
// Design. A block owns a tile of 16 query rows of one (sequence, head) and
// walks the key/value tiles left of the causal diagonal, holding one k tile and
// one v tile in shared memory at a time; each row keeps a running maximum and
// sum (online softmax) and rescales its output accumulator when the maximum
// grows. Only the log-sum-exp of each row (lse, B*H*T floats) is kept for
// backward, which recomputes the probabilities from q, k and lse. No T x T
// matrix exists anywhere, forward or backward. Backward has no atomics, so it is
// deterministic: one kernel computes delta = rowsum(dout * out); one computes
// dq per query tile, looping over key tiles; one computes dk and dv per
// (kv head, key tile), looping over the query tiles of every query head of the
// kv group in head order. q and k come rotated by RoPE; with rope tables
// (Shape::rope) backward rotates dq and dk back as it stores them.
//
// Why a self-written kernel and not cuDNN's fused attention. The toolkit here
// ships cuDNN 9.19 (cudnn_graph.h and the engine libraries; not the C++
// cudnn_frontend, whose SDPA node is the documented way in), and its
// FlashAttention-2 SDPA would be the fast path on a GPU. It was not chosen
// because (1) it takes fp16/bf16 (and fp8 on Hopper) q, k, v, and this
// trainer's activations were fp32 then: every call would have added
// conversions (they are bf16 under bf16 compute now, so that reason has gone;
// on Ampere its backward also stops at D = 128); (2) it is a closed binary
// library, which still decides it: the CPU emulation
// (kernels/cuda/emu) could not execute it, so CI, which has no GPU, could test
// none of it, whereas this file is one source that nvcc compiles for the GPU
// and the host compiler for the emulation, and the same code that runs on the
// GPU is what the tests check. (cuDNN's backward does have a deterministic
// mode, so determinism alone would not have decided it.) The kernels of this
// file run fp32 FMAs on CUDA cores; under bf16 compute, head dims that are
// multiples of 16 up to 128 go to the same algorithm on tensor cores
// (attention_bf16.cu), and others run here on inputs rounded to bf16. Nothing
// here has been timed on a GPU.
//
// Work layout inside a block (4 warps). Each warp owns 4 rows of the block's
// tile ("own" rows: queries in forward and dq, keys in dk/dv). The other
// operand is streamed in tiles of S rows ("streamed": keys, or queries in
// dk/dv). Dot products: the warp's lanes are split into S groups of 32/S
// lanes; group c computes the dot products of the 4 own rows with streamed row
// c, each lane over every (32/S)-th feature, then the group sums by shuffles.
// The weights (probabilities, or their gradients) go to a small [16][S] tile in
// shared memory; then lane l, which owns features l, l + 32, ... of the warp's
// 4 own rows, adds weight(c) * streamed[c][feature] for c in order. (A shared
// tile and a __syncwarp rather than 4 * S shuffles: about the same on a GPU,
// much cheaper in the emulation, where every shuffle switches 32 fibers.)
// Tile sizes follow D so that shared memory stays under 48 KiB, which every
// GPU grants without opt-in: S is the largest of 32, 16, 8, 4 that fits
// (D = 64: 32 everywhere; D = 128: 32 forward, 16 backward; D = 256: 8
// forward, 4 backward).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "kernels/common/math.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/simt.h"

namespace amsp::kernels::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kOwnPerWarp = 4;
constexpr int kOwnTile = kWarps * kOwnPerWarp;
constexpr int kMaxD = 256;
constexpr size_t kSharedLimit = 48 * 1024;

// A kernel's variant: Sized<features per lane, activation dtype> (simt.h).
template <typename V>
using Act = typename V::Type;

// What every kernel needs to know about the call.
struct Shape {
  int64_t B, T, H, KV;
  int D;
  int group;     // H / KV query heads per kv head
  int streamed;  // S, rows per streamed tile
  float scale;   // 1 / sqrt(D)
  bool bf16;     // q, k, v and dout rounded to bf16 as they are loaded
  int64_t ldq, ldkv;  // row strides of q and dq, of k, v, dk and dv
  Rotary rope;        // backward: dq and dk rotated back as stored
};

// A lane's place in the dot-product phase (see the top of the file).
struct Lanes {
  int col;      // streamed row this lane works on
  int part;     // first feature it sums
  int per_col;  // lanes per streamed row = 32 / S
};

AMSP_DEVICE_INLINE Lanes lanes_of(int streamed) {
  const int lane = threadIdx.x % kWarpSize, per_col = kWarpSize / streamed;
  return Lanes{lane / per_col, lane % per_col, per_col};
}

// Sum over each aligned group of `width` lanes (a power of two): reduce.cuh's
// butterfly, cut short.
AMSP_DEVICE_INLINE float group_sum(float v, int width) {
  for (int o = width / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullWarp, v, o);
  return v;
}

// One activation as the products take it: rounded to bf16 if `bf16` (bf16
// activations are so already).
template <typename A>
AMSP_DEVICE_INLINE float as_read(const A& x, bool bf16) {
  return bf16 ? round_bf16(load(x)) : load(x);
}

// Rows [first, first + n) of one head's [T, D] slice (global row stride ld)
// into fp32 shared memory with row stride sld, rounded to bf16 if `bf16`;
// rows at or past T become zeros.
template <typename A>
AMSP_DEVICE_INLINE void load_rows(float* dst, int sld, const A* src, int64_t ld, int64_t first,
                                  int n, int64_t T, int D, bool bf16) {
  for (int i = threadIdx.x; i < n * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    dst[r * sld + d] = first + r < T ? as_read(src[(first + r) * ld + d], bf16) : 0.0f;
  }
}

// dots[i] = own[i] . tile[lanes.col] for the warp's own rows; every lane of the
// column's group ends with the whole sum.
AMSP_DEVICE_INLINE void tile_dots(const float* own, int own_ld, const float* tile, int tile_ld,
                                  int D, Lanes lanes, float (&dots)[kOwnPerWarp]) {
  const float* t = tile + lanes.col * tile_ld;
  for (int i = 0; i < kOwnPerWarp; ++i) dots[i] = 0.0f;
  for (int d = lanes.part; d < D; d += lanes.per_col) {
    const float x = t[d];
    for (int i = 0; i < kOwnPerWarp; ++i) dots[i] += own[i * own_ld + d] * x;
  }
  for (int i = 0; i < kOwnPerWarp; ++i) dots[i] = group_sum(dots[i], lanes.per_col);
}

// The warp's weights w[i] for streamed row lanes.col into w_s[i][col]
// (row stride S), written by the first lane of each column's group.
AMSP_DEVICE_INLINE void stage_weights(float* w_s, int S, const float (&w)[kOwnPerWarp],
                                      Lanes lanes) {
  if (lanes.part == 0)
    for (int i = 0; i < kOwnPerWarp; ++i) w_s[i * S + lanes.col] = w[i];
}

// acc[i][j] += sum over streamed rows c, in order, of w_s[i][c] * tile[c][lane + 32 j].
template <int kPerLane>
AMSP_DEVICE_INLINE void accumulate(float (&acc)[kOwnPerWarp][kPerLane], const float* w_s, int S,
                                   const float* tile, int tile_ld, int D) {
  const int lane = threadIdx.x % kWarpSize;
  for (int c = 0; c < S; ++c)
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + kWarpSize * j;
      if (d >= D) break;
      const float x = tile[c * tile_ld + d];
      for (int i = 0; i < kOwnPerWarp; ++i) acc[i][j] += w_s[i * S + c] * x;
    }
}

// dst row first + i (global, row stride ld) = scale * acc[i], for the rows
// below T (rounded once if A is bf16).
template <int kPerLane, typename A>
AMSP_DEVICE_INLINE void store_rows(A* dst, int64_t ld, int64_t first, int64_t T, int D,
                                   const float (&acc)[kOwnPerWarp][kPerLane], float scale) {
  const int lane = threadIdx.x % kWarpSize;
  for (int i = 0; i < kOwnPerWarp && first + i < T; ++i)
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + kWarpSize * j;
      if (d < D) store(dst + (first + i) * ld + d, scale * acc[i][j]);
    }
}

// store_rows of a gradient of q or k, rotated back by each row's position
// first + i when there are rope tables. The pairs (d, d + D/2) of a row live
// in different lanes for most D, so the warp's rows go through `stage`, its
// own [4][D] rows of a shared tile that nothing else reads any more.
template <int kPerLane, typename A>
AMSP_DEVICE_INLINE void store_rows_back(A* dst, int64_t ld, int64_t first, int64_t T, int D,
                                        const float (&acc)[kOwnPerWarp][kPerLane], float scale,
                                        const Rotary& rope, float* stage) {
  if (!rope.cos) return store_rows(dst, ld, first, T, D, acc, scale);
  const int lane = threadIdx.x % kWarpSize, half = D / 2;
  __syncwarp();  // every lane is done reading the stage's rows
  for (int i = 0; i < kOwnPerWarp; ++i)
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + kWarpSize * j;
      if (d < D) stage[i * D + d] = scale * acc[i][j];
    }
  __syncwarp();
  for (int i = 0; i < kOwnPerWarp && first + i < T; ++i)
    for (int d = lane; d < half; d += kWarpSize) {
      float a = stage[i * D + d], b = stage[i * D + d + half];
      const int64_t at = (first + i) * half + d;
      rope_rotate(a, b, rope.cos[at], -rope.sin[at]);
      store(dst + (first + i) * ld + d, a);
      store(dst + (first + i) * ld + d + half, b);
    }
}

// Where one head's rows start: q and out have H heads per row, k and v KV.
struct Heads {
  int64_t b, h, kvh;
  int64_t q_off, kv_off, o_off;  // offsets of (b, t = 0, head, d = 0) in q, k and out
  int64_t ldq, ldk, ldo;         // row strides
};

AMSP_DEVICE_INLINE Heads heads_of(int64_t b, int64_t h, const Shape& sh) {
  const int64_t kvh = h / sh.group, ldo = sh.H * sh.D;
  return Heads{b,   h,      kvh, b * sh.T * sh.ldq + h * sh.D, b * sh.T * sh.ldkv + kvh * sh.D,
               b * sh.T * ldo + h * sh.D, sh.ldq, sh.ldkv, ldo};
}

// The block (b*H + h, query tile) of the forward and dq kernels: its head, its
// tile's first and last rows (q_last below T), and this warp's first own row.
// The last tiles see the most keys: they are started first.
struct QueryTile {
  Heads hd;
  int64_t q0, q_last;
  int warp;
  int64_t row0;
};

AMSP_DEVICE_INLINE QueryTile query_tile(const Shape& sh) {
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * kOwnTile;
  const int warp = threadIdx.x / kWarpSize;
  return QueryTile{heads_of(blockIdx.x / sh.H, blockIdx.x % sh.H, sh), q0,
                   (q0 + kOwnTile < sh.T ? q0 + kOwnTile : sh.T) - 1, warp, q0 + warp * kOwnPerWarp};
}

// The key and value rows [k0, k0 + S) of the tile's kv head into k_s and v_s,
// once every warp is done with the previous ones.
template <typename A>
AMSP_DEVICE_INLINE void load_kv_tiles(float* k_s, float* v_s, int ld_kv, const A* k, const A* v,
                                      const Heads& hd, int64_t k0, const Shape& sh) {
  __syncthreads();
  load_rows(k_s, ld_kv, k + hd.kv_off, hd.ldk, k0, sh.streamed, sh.T, sh.D, sh.bf16);
  load_rows(v_s, ld_kv, v + hd.kv_off, hd.ldk, k0, sh.streamed, sh.T, sh.D, sh.bf16);
  __syncthreads();
}

// Forward: block (b*H + h, query tile). Shared memory: the query tile
// [16][D], a key and a value tile [S][D + 1] (padded so the lanes of the
// dot-product phase, reading down a column, hit different banks), and the
// probabilities [16][S].
template <typename V>  // Sized<features per lane, activation dtype>
__global__ void attention_forward_kernel(const Act<V>* q, const Act<V>* k, const Act<V>* v,
                                         float* lse, Act<V>* out, Shape sh) {
  constexpr int kPerLane = V::value;
  AMSP_DYNAMIC_SHARED(float, smem);
  const int D = sh.D, S = sh.streamed, ld_kv = D + 1;
  float* q_s = smem;
  float* k_s = q_s + kOwnTile * D;
  float* v_s = k_s + S * ld_kv;
  float* p_s = v_s + S * ld_kv + threadIdx.x / kWarpSize * kOwnPerWarp * S;  // this warp's rows
  const auto [hd, q0, q_last, warp, row0] = query_tile(sh);
  const Lanes lanes = lanes_of(S);
  load_rows(q_s, D, q + hd.q_off, hd.ldq, q0, kOwnTile, sh.T, D, sh.bf16);

  float m[kOwnPerWarp], l[kOwnPerWarp], acc[kOwnPerWarp][kPerLane] = {};
  for (int i = 0; i < kOwnPerWarp; ++i) m[i] = -INFINITY, l[i] = 0.0f;
  for (int64_t k0 = 0; k0 <= q_last; k0 += S) {  // causal: tiles left of the diagonal
    load_kv_tiles(k_s, v_s, ld_kv, k, v, hd, k0, sh);
    float s[kOwnPerWarp], p[kOwnPerWarp];
    tile_dots(q_s + warp * kOwnPerWarp * D, D, k_s, ld_kv, D, lanes, s);
    const int64_t key = k0 + lanes.col;
    for (int i = 0; i < kOwnPerWarp; ++i) {
      const bool seen = key <= row0 + i && key < sh.T;
      const float score = seen ? sh.scale * s[i] : -INFINITY;
      // Key 0 is in the first tile and every row sees it, so m_new is finite
      // from the first tile on; exp(-inf - m_new) = 0 for masked keys and the
      // first rescale.
      const float m_new = fmaxf(m[i], warp_reduce(score, MaxOp{}));
      const float rescale = fast_exp(m[i] - m_new);
      p[i] = seen ? fast_exp(score - m_new) : 0.0f;
      l[i] = l[i] * rescale + warp_reduce(lanes.part == 0 ? p[i] : 0.0f, SumOp{});
      m[i] = m_new;
      for (int j = 0; j < kPerLane; ++j) acc[i][j] *= rescale;
    }
    stage_weights(p_s, S, p, lanes);
    __syncwarp();  // the weights are this warp's own
    accumulate(acc, p_s, S, v_s, ld_kv, D);
  }

  for (int i = 0; i < kOwnPerWarp; ++i)
    for (int j = 0; j < kPerLane; ++j) acc[i][j] /= l[i];
  store_rows(out + hd.o_off, hd.ldo, row0, sh.T, D, acc, 1.0f);
  if (threadIdx.x % kWarpSize == 0)
    for (int i = 0; i < kOwnPerWarp && row0 + i < sh.T; ++i)
      lse[(hd.b * sh.H + hd.h) * sh.T + row0 + i] = m[i] + logf(l[i]);
}

// delta[b, h, t] = sum_d dout * out over one row of one head: a warp per row,
// rows in out's memory order ((b * T + t) * H + h).
template <typename A>
__global__ void attention_delta_kernel(const A* out, const A* dout, float* delta, Shape sh) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  if (row >= sh.B * sh.T * sh.H) return;  // whole warps leave together
  const int64_t h = row % sh.H, t = row / sh.H % sh.T, b = row / (sh.H * sh.T);
  float sum = 0.0f;
  for (int d = threadIdx.x % kWarpSize; d < sh.D; d += kWarpSize) {
    const float g = load(dout[row * sh.D + d]);
    sum += (sh.bf16 ? round_bf16(g) : g) * load(out[row * sh.D + d]);
  }
  sum = warp_reduce(sum, SumOp{});
  if (threadIdx.x % kWarpSize == 0) delta[(b * sh.H + h) * sh.T + t] = sum;
}

// dq = scale * sum over keys of p * (dp - delta) * k, with p = exp(score - lse)
// recomputed and dp = dout . v. Block (b*H + h, query tile). Shared memory:
// the query and dout tiles [16][D], a key and a value tile [S][D + 1], and
// p * (dp - delta) [16][S].
template <typename V>  // Sized<features per lane, activation dtype>
__global__ void attention_dq_kernel(const Act<V>* q, const Act<V>* k, const Act<V>* v,
                                    const float* lse, const Act<V>* dout, const float* delta,
                                    Act<V>* dq, Shape sh) {
  constexpr int kPerLane = V::value;
  AMSP_DYNAMIC_SHARED(float, smem);
  const int D = sh.D, S = sh.streamed, ld_kv = D + 1;
  float* q_s = smem;
  float* do_s = q_s + kOwnTile * D;
  float* k_s = do_s + kOwnTile * D;
  float* v_s = k_s + S * ld_kv;
  float* ds_s = v_s + S * ld_kv + threadIdx.x / kWarpSize * kOwnPerWarp * S;
  const auto [hd, q0, q_last, warp, row0] = query_tile(sh);
  const Lanes lanes = lanes_of(S);
  load_rows(q_s, D, q + hd.q_off, hd.ldq, q0, kOwnTile, sh.T, D, sh.bf16);
  load_rows(do_s, D, dout + hd.o_off, hd.ldo, q0, kOwnTile, sh.T, D, sh.bf16);
  float row_lse[kOwnPerWarp], row_delta[kOwnPerWarp];
  for (int i = 0; i < kOwnPerWarp; ++i) {
    const int64_t at = (hd.b * sh.H + hd.h) * sh.T + row0 + i;
    row_lse[i] = row0 + i < sh.T ? lse[at] : 0.0f;
    row_delta[i] = row0 + i < sh.T ? delta[at] : 0.0f;
  }

  float acc[kOwnPerWarp][kPerLane] = {};
  for (int64_t k0 = 0; k0 <= q_last; k0 += S) {
    load_kv_tiles(k_s, v_s, ld_kv, k, v, hd, k0, sh);
    float s[kOwnPerWarp], dp[kOwnPerWarp], ds[kOwnPerWarp];
    tile_dots(q_s + warp * kOwnPerWarp * D, D, k_s, ld_kv, D, lanes, s);
    tile_dots(do_s + warp * kOwnPerWarp * D, D, v_s, ld_kv, D, lanes, dp);
    const int64_t key = k0 + lanes.col;
    for (int i = 0; i < kOwnPerWarp; ++i) {
      const bool seen = key <= row0 + i && key < sh.T;
      const float p = seen ? fast_exp(sh.scale * s[i] - row_lse[i]) : 0.0f;
      ds[i] = p * (dp[i] - row_delta[i]);
    }
    stage_weights(ds_s, S, ds, lanes);
    __syncwarp();
    accumulate(acc, ds_s, S, k_s, ld_kv, D);
  }
  store_rows_back(dq + hd.q_off, hd.ldq, row0, sh.T, D, acc, sh.scale, sh.rope,
                  q_s + warp * kOwnPerWarp * D);
}

// dv = sum over queries of p * dout, dk = scale * sum of p * (dp - delta) * q,
// over the query rows at or below each key of every query head of the kv
// group, heads in order. Block (b*KV + kv head, key tile). Shared memory: the
// key and value tiles [16][D], a query and a dout tile [S][D + 1], the lse and
// delta of those S rows, and p and p * (dp - delta) [16][S].
template <typename V>  // Sized<features per lane, activation dtype>
__global__ void attention_dkv_kernel(const Act<V>* q, const Act<V>* k, const Act<V>* v,
                                     const float* lse, const Act<V>* dout, const float* delta,
                                     Act<V>* dk, Act<V>* dv, Shape sh) {
  constexpr int kPerLane = V::value;
  AMSP_DYNAMIC_SHARED(float, smem);
  const int D = sh.D, S = sh.streamed, ld_q = D + 1;
  float* k_s = smem;
  float* v_s = k_s + kOwnTile * D;
  float* q_s = v_s + kOwnTile * D;
  float* do_s = q_s + S * ld_q;
  float* lse_s = do_s + S * ld_q;
  float* delta_s = lse_s + S;
  float* p_s = delta_s + S + threadIdx.x / kWarpSize * kOwnPerWarp * S;
  float* ds_s = p_s + kOwnTile * S;
  const int64_t b = blockIdx.x / sh.KV, kvh = blockIdx.x % sh.KV;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kOwnTile;  // early keys see most rows
  const int warp = threadIdx.x / kWarpSize;
  const int64_t key0 = k0 + warp * kOwnPerWarp;
  const Lanes lanes = lanes_of(S);
  const Heads kv_hd = heads_of(b, kvh * sh.group, sh);
  load_rows(k_s, D, k + kv_hd.kv_off, kv_hd.ldk, k0, kOwnTile, sh.T, D, sh.bf16);
  load_rows(v_s, D, v + kv_hd.kv_off, kv_hd.ldk, k0, kOwnTile, sh.T, D, sh.bf16);

  float dk_acc[kOwnPerWarp][kPerLane] = {}, dv_acc[kOwnPerWarp][kPerLane] = {};
  for (int64_t h = kvh * sh.group; h < (kvh + 1) * sh.group; ++h) {
    const Heads hd = heads_of(b, h, sh);
    const float* head_lse = lse + (b * sh.H + h) * sh.T;
    const float* head_delta = delta + (b * sh.H + h) * sh.T;
    for (int64_t r0 = k0 / S * S; r0 < sh.T; r0 += S) {  // causal: rows at or below the keys
      __syncthreads();
      load_rows(q_s, ld_q, q + hd.q_off, hd.ldq, r0, S, sh.T, D, sh.bf16);
      load_rows(do_s, ld_q, dout + hd.o_off, hd.ldo, r0, S, sh.T, D, sh.bf16);
      for (int i = threadIdx.x; i < S; i += blockDim.x) {
        lse_s[i] = r0 + i < sh.T ? head_lse[r0 + i] : 0.0f;
        delta_s[i] = r0 + i < sh.T ? head_delta[r0 + i] : 0.0f;
      }
      __syncthreads();
      float s[kOwnPerWarp], dp[kOwnPerWarp], p[kOwnPerWarp], ds[kOwnPerWarp];
      tile_dots(k_s + warp * kOwnPerWarp * D, D, q_s, ld_q, D, lanes, s);
      tile_dots(v_s + warp * kOwnPerWarp * D, D, do_s, ld_q, D, lanes, dp);
      const int64_t row = r0 + lanes.col;
      for (int i = 0; i < kOwnPerWarp; ++i) {
        const bool seen = key0 + i <= row && row < sh.T;
        p[i] = seen ? fast_exp(sh.scale * s[i] - lse_s[lanes.col]) : 0.0f;
        ds[i] = p[i] * (dp[i] - delta_s[lanes.col]);
      }
      stage_weights(p_s, S, p, lanes);
      stage_weights(ds_s, S, ds, lanes);
      __syncwarp();
      accumulate(dv_acc, p_s, S, do_s, ld_q, D);
      accumulate(dk_acc, ds_s, S, q_s, ld_q, D);
    }
  }
  store_rows(dv + kv_hd.kv_off, kv_hd.ldk, key0, sh.T, D, dv_acc, 1.0f);
  store_rows_back(dk + kv_hd.kv_off, kv_hd.ldk, key0, sh.T, D, dk_acc, sh.scale, sh.rope,
                  k_s + warp * kOwnPerWarp * D);
}

// The streamed tile size S and the shared bytes of a kernel whose block holds
// own_arrays [16][D] tiles, streamed_arrays [S][D + 1] tiles, per_streamed
// floats per streamed row (lse, delta) and weight_arrays [16][S] tiles: the
// largest S that fits the limit (S = 4 always does for D <= 256).
struct Tiles {
  int streamed;
  size_t shared_bytes;
};

Tiles tiles_for(int D, int own_arrays, int streamed_arrays, int per_streamed, int weight_arrays) {
  auto bytes = [&](int S) {
    const int64_t per_row = streamed_arrays * (D + 1) + per_streamed + weight_arrays * kOwnTile;
    return static_cast<size_t>(own_arrays * kOwnTile * D + S * per_row) * sizeof(float);
  };
  int S = kWarpSize;
  while (S > 4 && bytes(S) > kSharedLimit) S /= 2;
  return Tiles{S, bytes(S)};
}

// Calls launch(std::integral_constant<int, P>) with P = features per lane in
// the accumulators (ceil(D / 32) rounded up to a power of two), so that the
// accumulators are fixed-size arrays in registers.
template <typename Launch>
void with_per_lane(int D, Launch launch) {
  if (D <= 32) {
    launch(std::integral_constant<int, 1>{});
  } else if (D <= 64) {
    launch(std::integral_constant<int, 2>{});
  } else if (D <= 128) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, 8>{});
  }
}

// The shapes this file supports (require_shape).
Shape shape_of(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int64_t ldq, int64_t ldkv,
               const char* what) {
  require_shape(what, D >= 1 && D <= kMaxD, "1 <= D <= 256", kOwnTile, T, H, KV, D, ldq, ldkv);
  const int d = static_cast<int>(D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  return Shape{B, T, H, KV, d, static_cast<int>(H / KV), 0, scale, false, ldq, ldkv, Rotary{}};
}

unsigned tiles_of(int64_t T) { return static_cast<unsigned>((T + kOwnTile - 1) / kOwnTile); }

}  // namespace

void require_shape(const char* what, bool d_ok, const char* d_expected, int64_t tile, int64_t T,
                   int64_t H, int64_t KV, int64_t D, int64_t ldq, int64_t ldkv) {
  if (d_ok && KV >= 1 && H % KV == 0 && (T + tile - 1) / tile <= 65535 && ldq >= H * D &&
      ldkv >= KV * D)
    return;
  std::fprintf(stderr,
               "amsp: %s: unsupported shape T=%lld H=%lld KV=%lld D=%lld ldq=%lld ldkv=%lld "
               "(expected %s, H a multiple of KV, T <= %lld, rows of q and k/v that hold H*D "
               "and KV*D values)\n",
               what, static_cast<long long>(T), static_cast<long long>(H),
               static_cast<long long>(KV), static_cast<long long>(D), static_cast<long long>(ldq),
               static_cast<long long>(ldkv), d_expected, static_cast<long long>(65535 * tile));
  std::abort();
}

template <typename A>
void attention_delta(const A* out, const A* dout, float* delta, int64_t B, int64_t T, int64_t H,
                     int64_t D, bool round_dout, cudaStream_t s) {
  const Shape sh{B, T, H, 1, static_cast<int>(D), 1, 0, 0.0f, round_dout, H * D, D, Rotary{}};
  const unsigned blocks = static_cast<unsigned>((B * T * H + kWarps - 1) / kWarps);
  AMSP_LAUNCH(attention_delta_kernel<A>, blocks, kThreads, 0, s)(out, dout, delta, sh);
}

int64_t attention_saved_count(int64_t B, int64_t T, int64_t H) { return B * H * T; }

int64_t attention_backward_workspace(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, bool bf16) {
  return B * H * T + (bf16 && attention_tc_supports(D) ? attention_tc_partials(B, T, H, KV, D) : 0);
}

// The kernels of this file behind attention_forward and attention_backward
// (in the unnamed namespace: their lambdas capture its types).
namespace {

template <typename A>
void forward_cuda_cores(const A* q, const A* k, const A* v, int64_t ldq, int64_t ldkv, float* lse,
                        A* out, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, bool bf16,
                        cudaStream_t s) {
  if (B == 0 || T == 0 || H == 0) return;
  Shape sh = shape_of(B, T, H, KV, D, ldq, ldkv, "attention_forward");
  sh.bf16 = bf16;
  const Tiles tiles = tiles_for(sh.D, 1, 2, 0, 1);
  sh.streamed = tiles.streamed;
  const dim3 grid(static_cast<unsigned>(B * H), tiles_of(T));
  AMSP_DEVICE_FLOPS(causal_flops(2, B, T, H, sh.D), false);
  with_per_lane(sh.D, [&](auto per_lane) {
    using V = Sized<decltype(per_lane)::value, A>;
    AMSP_LAUNCH(attention_forward_kernel<V>, grid, kThreads, tiles.shared_bytes, s)(q, k, v, lse,
                                                                                  out, sh);
  });
}

template <typename A>
void backward_cuda_cores(const A* q, const A* k, const A* v, int64_t ldq, int64_t ldkv, Rotary rope,
                         const float* lse, const A* out, const A* dout, A* dq, A* dk, A* dv,
                         float* workspace, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                         bool bf16, cudaStream_t s) {
  if (B == 0 || T == 0 || H == 0) return;
  Shape sh = shape_of(B, T, H, KV, D, ldq, ldkv, "attention_backward");
  sh.bf16 = bf16;
  sh.rope = rope;
  float* delta = workspace;
  attention_delta(out, dout, delta, B, T, H, D, bf16, s);

  Shape dq_sh = sh;
  const Tiles dq_tiles = tiles_for(sh.D, 2, 2, 0, 1);
  dq_sh.streamed = dq_tiles.streamed;
  Shape dkv_sh = sh;
  const Tiles dkv_tiles = tiles_for(sh.D, 2, 2, 2, 2);
  dkv_sh.streamed = dkv_tiles.streamed;
  AMSP_DEVICE_FLOPS(causal_flops(7, B, T, H, sh.D), false);
  with_per_lane(sh.D, [&](auto per_lane) {
    using V = Sized<decltype(per_lane)::value, A>;
    AMSP_LAUNCH(attention_dq_kernel<V>, dim3(static_cast<unsigned>(B * H), tiles_of(T)), kThreads,
                dq_tiles.shared_bytes, s)(q, k, v, lse, dout, delta, dq, dq_sh);
    AMSP_LAUNCH(attention_dkv_kernel<V>, dim3(static_cast<unsigned>(B * KV), tiles_of(T)),
                kThreads, dkv_tiles.shared_bytes, s)(q, k, v, lse, dout, delta, dk, dv, dkv_sh);
  });
}

}  // namespace

template <typename A>
void attention_forward(const A* q, const A* k, const A* v, int64_t ldq, int64_t ldkv, float* lse,
                       A* out, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, bool bf16,
                       cudaStream_t s) {
  if (bf16 && attention_tc_supports(D))
    attention_forward_tc(q, k, v, ldq, ldkv, lse, out, B, T, H, KV, D, s);
  else
    forward_cuda_cores(q, k, v, ldq, ldkv, lse, out, B, T, H, KV, D, bf16, s);
}

template <typename A>
void attention_backward(const A* q, const A* k, const A* v, int64_t ldq, int64_t ldkv, Rotary rope,
                        const float* lse, const A* out, const A* dout, A* dq, A* dk, A* dv,
                        float* workspace, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        bool bf16, cudaStream_t s) {
  if (bf16 && attention_tc_supports(D))
    attention_backward_tc(q, k, v, ldq, ldkv, rope, lse, out, dout, dq, dk, dv, workspace, B, T, H,
                          KV, D, s);
  else
    backward_cuda_cores(q, k, v, ldq, ldkv, rope, lse, out, dout, dq, dk, dv, workspace, B, T, H,
                        KV, D, bf16, s);
}

template void attention_delta(const float*, const float*, float*, int64_t, int64_t, int64_t,
                              int64_t, bool, cudaStream_t);
template void attention_delta(const bf16*, const bf16*, float*, int64_t, int64_t, int64_t, int64_t,
                              bool, cudaStream_t);
template void attention_forward(const float*, const float*, const float*, int64_t, int64_t, float*,
                                float*, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                                cudaStream_t);
template void attention_forward(const bf16*, const bf16*, const bf16*, int64_t, int64_t, float*,
                                bf16*, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                                cudaStream_t);
template void attention_backward(const float*, const float*, const float*, int64_t, int64_t, Rotary,
                                 const float*, const float*, const float*, float*, float*, float*,
                                 float*, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                                 cudaStream_t);
template void attention_backward(const bf16*, const bf16*, const bf16*, int64_t, int64_t, Rotary,
                                 const float*, const bf16*, const bf16*, bf16*, bf16*, bf16*,
                                 float*, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                                 cudaStream_t);

}  // namespace amsp::kernels::cuda
