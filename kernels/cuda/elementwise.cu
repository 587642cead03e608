// Conversions, additions, the sum of squares, the clipping factor and a fill
// (kernels/cuda/ops.h). Grid-stride loops, by packs of 4 elements where the
// arrays allow (pack.cuh); the arithmetic per element is the CPU backend's,
// so results are bit-identical (but for the order of the sum of squares).
#include <algorithm>

#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

using F32F32 = Dtypes<float, float>;
using F32Bf16 = Dtypes<float, bf16>;
using Bf16F32 = Dtypes<bf16, float>;
using Bf16Bf16 = Dtypes<bf16, bf16>;

// Conversions, additions and the sum of squares go 4 elements at a time
// (pack.cuh) over the part of the arrays flat_packs allows, one at a time
// over the rest, a thread loading a batch of kFlatBatch packs before it uses
// them (pack.cuh, batched: a few registers a pack in these light kernels).
constexpr int kFlatPack = 4;
constexpr int kFlatBatch = 4;

// The pack of P elements of x at i: for_each_pack's load.
template <typename A>
AMSP_DEVICE_INLINE auto pack_of(const A* x) {
  return [x](int64_t i, auto pack) { return load_pack<decltype(pack)::value>(x + i); };
}

// y = x in y's dtype; T: Dtypes<x's, y's>.
template <typename T>
__global__ void convert_kernel(const typename T::First* x, typename T::Second* y, int64_t n,
                               int64_t packed) {
  for_each_pack<kFlatPack, kFlatBatch>(n, packed, pack_of(x),
                                       [&](int64_t i, auto pack, const auto& xv) {
                                         constexpr int P = decltype(pack)::value;
                                         float v[P];
                                         AMSP_UNROLL
                                         for (int k = 0; k < P; ++k) v[k] = load(xv.x[k]);
                                         store_pack<P>(y + i, rounded_pack<typename T::Second>(v));
                                       });
}

__global__ void round_values_kernel(const float* x, float* y, int64_t n, int64_t packed) {
  for_each_pack<kFlatPack, kFlatBatch>(n, packed, pack_of(x), [&](int64_t i, auto pack, auto v) {
    constexpr int P = decltype(pack)::value;
    AMSP_UNROLL
    for (int k = 0; k < P; ++k) v.x[k] = round_bf16(v.x[k]);
    store_pack<P>(y + i, v);
  });
}

// dst += src in fp32, stored in dst's dtype; T: Dtypes<dst's, src's>.
template <typename T, int P>
struct Addends {
  Pack<typename T::First, P> dst;
  Pack<typename T::Second, P> src;
};

template <typename T>
__global__ void add_kernel(typename T::First* dst, const typename T::Second* src, int64_t n,
                           int64_t packed) {
  const auto both = [&](int64_t i, auto pack) {
    constexpr int P = decltype(pack)::value;
    return Addends<T, P>{load_pack<P>(dst + i), load_pack<P>(src + i)};
  };
  for_each_pack<kFlatPack, kFlatBatch>(n, packed, both, [&](int64_t i, auto pack, auto e) {
    constexpr int P = decltype(pack)::value;
    float sum[P];
    AMSP_UNROLL
    for (int k = 0; k < P; ++k) sum[k] = load(e.dst.x[k]) + load(e.src.x[k]);
    store_pack<P>(dst + i, rounded_pack<typename T::First>(sum));
  });
}

// The launch of one of the kernels above over n elements.
inline unsigned flat_grid(int64_t n, int64_t packed) {
  return flat_pack_grid<kFlatPack, kFlatBatch>(n, packed);
}

// One block per chunk of kSumSquaresChunk elements (a multiple of the pack):
// the chunk's part below `packed` by packs, the rest one at a time.
template <typename T>
__global__ void chunk_squares_kernel(const T* x, int64_t n, int64_t packed, double* partials) {
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * kSumSquaresChunk;
  const int64_t hi = lo + kSumSquaresChunk < n ? lo + kSumSquaresChunk : n;
  const int64_t mid = std::min(hi, std::max(lo, packed));  // packed, within the chunk
  double s = 0.0;
  batched<kFlatBatch>(
      lo + static_cast<int64_t>(threadIdx.x) * kFlatPack, mid, blockDim.x * kFlatPack,
      [&](int64_t i) { return load_pack<kFlatPack>(x + i); },
      [&](int64_t, const Pack<T, kFlatPack>& v) {
        AMSP_UNROLL
        for (int k = 0; k < kFlatPack; ++k) {
          const double d = load(v.x[k]);
          s += d * d;
        }
      });
  for (int64_t i = mid + threadIdx.x; i < hi; i += blockDim.x) {
    const double v = load(x[i]);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// The chunks by one block: thread t sums chunks t, t + blockDim.x, ... in
// order, then block_sum's fixed tree (the same bits every run; not the CPU
// backend's left-to-right order, hence sum_squares' tolerance). One thread
// summing thousands of chunks (a unit of 50M elements has 3,000) took 0.2 ms a
// call on an H200, about five times a pass over the unit at bandwidth.
// With add, the total is added into *out.
__global__ void sum_chunks_kernel(const double* partials, int64_t chunks, double* out, bool add) {
  double total = 0.0;
  batched<kFlatBatch>(
      threadIdx.x, chunks, blockDim.x, [&](int64_t c) { return partials[c]; },
      [&](int64_t, double part) { total += part; });
  total = block_sum(total);
  if (threadIdx.x == 0) *out = add ? *out + total : total;
}

template <typename T>
void sum_squares_impl(const T* x, int64_t n, double* partials, double* out, bool add,
                      cudaStream_t s) {
  const int64_t chunks = sum_squares_chunks(n);
  if (chunks > 0)
    AMSP_LAUNCH(chunk_squares_kernel<T>, static_cast<unsigned>(chunks), kBlockThreads, 0, s)
    (x, n, flat_packs<kFlatPack>(n, x), partials);
  // n == 0 still stores the total (0), so the caller's read is defined.
  AMSP_LAUNCH(sum_chunks_kernel, 1, kBlockThreads, 0, s)(partials, chunks, out, add);
}

__global__ void clip_scale_kernel(const double* sumsq, double divisor, double max_norm,
                                  float* scale) {
  const double norm = sqrt(*sumsq / divisor);
  *scale = max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
}

__global__ void fill_i32_kernel(int32_t* x, int32_t value, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = value;
}

template <typename T>
void add_flat(typename T::First* dst, const typename T::Second* src, int64_t n, cudaStream_t s) {
  const int64_t packed = flat_packs<kFlatPack>(n, dst, src);
  if (n > 0)
    AMSP_LAUNCH(add_kernel<T>, flat_grid(n, packed), kBlockThreads, 0, s)(dst, src, n, packed);
}

}  // namespace

void to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t s) {
  const int64_t packed = flat_packs<kFlatPack>(n, x, y);
  if (n > 0)
    AMSP_LAUNCH(convert_kernel<F32Bf16>, flat_grid(n, packed), kBlockThreads, 0, s)
    (x, y, n, packed);
}

void to_f32(const bf16* x, float* y, int64_t n, cudaStream_t s) {
  const int64_t packed = flat_packs<kFlatPack>(n, x, y);
  if (n > 0)
    AMSP_LAUNCH(convert_kernel<Bf16F32>, flat_grid(n, packed), kBlockThreads, 0, s)
    (x, y, n, packed);
}

void round_bf16_values(const float* x, float* y, int64_t n, cudaStream_t s) {
  const int64_t packed = flat_packs<kFlatPack>(n, x, y);
  if (n > 0)
    AMSP_LAUNCH(round_values_kernel, flat_grid(n, packed), kBlockThreads, 0, s)(x, y, n, packed);
}

void add(float* dst, const float* src, int64_t n, cudaStream_t s) {
  add_flat<F32F32>(dst, src, n, s);
}

void add(float* dst, const bf16* src, int64_t n, cudaStream_t s) {
  add_flat<F32Bf16>(dst, src, n, s);
}

void add(bf16* dst, const float* src, int64_t n, cudaStream_t s) {
  add_flat<Bf16F32>(dst, src, n, s);
}

void add(bf16* dst, const bf16* src, int64_t n, cudaStream_t s) {
  add_flat<Bf16Bf16>(dst, src, n, s);
}

int64_t sum_squares_chunks(int64_t n) { return (n + kSumSquaresChunk - 1) / kSumSquaresChunk; }

void sum_squares(const float* x, int64_t n, double* partials, double* out, cudaStream_t s) {
  sum_squares_impl(x, n, partials, out, false, s);
}

void sum_squares(const bf16* x, int64_t n, double* partials, double* out, cudaStream_t s) {
  sum_squares_impl(x, n, partials, out, false, s);
}

void sum_squares_add(const float* x, int64_t n, double* partials, double* acc, cudaStream_t s) {
  sum_squares_impl(x, n, partials, acc, true, s);
}

void sum_squares_add(const bf16* x, int64_t n, double* partials, double* acc, cudaStream_t s) {
  sum_squares_impl(x, n, partials, acc, true, s);
}

void clip_scale(const double* sumsq, double divisor, double max_norm, float* scale, cudaStream_t s) {
  AMSP_LAUNCH(clip_scale_kernel, 1, 1, 0, s)(sumsq, divisor, max_norm, scale);
}

void fill_i32(int32_t* x, int32_t value, int64_t n, cudaStream_t s) {
  if (n > 0) AMSP_LAUNCH(fill_i32_kernel, grid_for(n), kBlockThreads, 0, s)(x, value, n);
}

}  // namespace amsp::kernels::cuda
