// RMSNorm forward, recomputation and backward (kernels/cuda/ops.h), with the
// CPU backend's arithmetic: row sums of squares and of w*dy*x in double, the
// per-element math of kernels/common/math.h. The row sums are block
// reductions (a fixed tree order, not the CPU's), so inv_rms and dx may differ
// from the CPU in the last bit; y and dw follow the CPU's order exactly.
#include <type_traits>

#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

// Every kernel here moves P adjacent elements at a time (pack.cuh): P = 4 (x
// and dx as 16 bytes, bf16 w, y and dy as 8) when the row length is a multiple
// of 4 and every pointer is aligned to its pack, else P = 1. A thread takes
// the packs j = threadIdx.x, + blockDim.x, ... of a row, two at a time
// loaded before it uses them (pack.cuh, batched: llama-1b's row of 2048 fp32
// values in one batch); the per-element arithmetic is the same either way.
// dw's chunks, a small grid, take four rows at a time. A row of at most
// kNormHeld packs a thread (2048 columns by packs of 4: llama-1b's hidden
// size) is held in registers from its sum to the pass that uses the sum, so
// that it is read once (two_passes), in the registers the two passes took
// (nvcc 13, sm_90: dx 54, forward 45); four packs, 7B's 4096 columns, would
// take 101 for dx, half the blocks an SM.
constexpr int kNormBatch = 2;
constexpr int kNormHeld = 2;
constexpr int kDwRowBatch = 4;
template <int P>
AMSP_DEVICE_INLINE int64_t first_column() {
  return static_cast<int64_t>(threadIdx.x) * P;
}
template <int P>
AMSP_DEVICE_INLINE int64_t column_stride() {
  return static_cast<int64_t>(blockDim.x) * P;
}

// Two passes over a row of dim columns by packs of P, this block's threads
// taking its packs j in order: sum(j, load(j)) for each, then between() (a
// block reduction: every thread calls it), then update(j, load(j), more(j)),
// more's loads (what only the update reads) issued before the updates. The
// row is held in registers where kNormHeld packs a thread cover it, else
// loaded again in batches; the same calls in the same order either way.
struct Nothing {};
template <int P, typename Load, typename Sum, typename Between, typename More, typename Update>
AMSP_DEVICE_INLINE void two_passes(int64_t dim, Load load, Sum sum, Between between, More more,
                                   Update update) {
  const int64_t first = first_column<P>(), step = column_stride<P>();
  if (dim <= kNormHeld * step) {  // block-uniform
    const auto row = hold<kNormHeld>(first, dim, step, load);
    row.visit(sum);
    between();
    const auto extra = hold<kNormHeld>(first, dim, step, more);
    AMSP_UNROLL
    for (int u = 0; u < kNormHeld; ++u)
      if (row.at(u) < dim) update(row.at(u), row.v[u], extra.v[u]);
  } else {
    batched<kNormBatch>(first, dim, step, load, sum);
    between();
    using Loaded = decltype(load(first));
    using Extra = decltype(more(first));
    struct Both {
      Loaded row;
      Extra extra;
    };
    batched<kNormBatch>(
        first, dim, step,
        [&](int64_t j) {
          return Both{load(j), more(j)};
        },
        [&](int64_t j, const Both& b) { update(j, b.row, b.extra); });
  }
}

// P columns of a row's x and of w.
template <int P, typename W>
struct XW {
  Pack<float, P> x;
  Pack<W, P> w;
};

template <int P, typename W>
AMSP_DEVICE_INLINE XW<P, W> load_xw(const float* x, const W* w, int64_t j) {
  return XW<P, W>{load_pack<P>(x + j), load_pack<P>(w + j)};
}

// y = w * (x * inv) at P columns from j.
template <int P, typename W, typename Y>
AMSP_DEVICE_INLINE void apply_pack(Y* y, int64_t j, const XW<P, W>& e, float inv) {
  float v[P];
  AMSP_UNROLL
  for (int k = 0; k < P; ++k) v[k] = rmsnorm_element(e.x.x[k], load(e.w.x[k]), inv);
  store_pack<P>(y + j, rounded_pack<Y>(v));
}

// One block per row (grid-stride over rows); every thread of a block takes
// part in the reduction, however short the row. V: Sized<P, Dtypes<w's, y's>>.
template <typename V>
__global__ void rmsnorm_forward_kernel(const float* x, const typename V::Type::First* w,
                                       typename V::Type::Second* y, float* inv_rms, int64_t rows,
                                       int64_t dim, float eps) {
  constexpr int P = V::value;
  using W = typename V::Type::First;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * dim;
    double ss = 0.0;
    float inv = 0.0f;
    two_passes<P>(
        dim, [&](int64_t j) { return load_xw<P>(xr, w, j); },
        [&](int64_t, const XW<P, W>& e) {
          AMSP_UNROLL
          for (int k = 0; k < P; ++k) ss += static_cast<double>(e.x.x[k]) * e.x.x[k];
        },
        [&] {
          inv = rms_inv(static_cast<float>(block_sum(ss)), dim, eps);
          if (threadIdx.x == 0) inv_rms[r] = inv;
        },
        [](int64_t) { return Nothing{}; },
        [&](int64_t j, const XW<P, W>& e, Nothing) { apply_pack<P>(y + r * dim, j, e, inv); });
  }
}

template <typename V>
__global__ void rmsnorm_apply_kernel(const float* x, const typename V::Type::First* w,
                                     const float* inv_rms, typename V::Type::Second* y,
                                     int64_t rows, int64_t dim) {
  constexpr int P = V::value;
  using W = typename V::Type::First;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * dim;
    const float inv = inv_rms[r];
    batched<kNormBatch>(
        first_column<P>(), dim, column_stride<P>(), [&](int64_t j) { return load_xw<P>(xr, w, j); },
        [&](int64_t j, const XW<P, W>& e) { apply_pack<P>(y + r * dim, j, e, inv); });
  }
}

// P columns of a row's x, w and dy.
template <int P, typename W, typename DY>
struct Row {
  Pack<float, P> x;
  Pack<W, P> w;
  Pack<DY, P> dy;
};

// dx += inv * w*dy - x * coef, coef = inv^3 * sum_j(w*dy*x) / dim, per row;
// and dx16 = bf16(dx) where dx16 is not null (one test a block: uniform).
// V: Sized<P, Dtypes<w's, dy's>>.
template <typename V>
__global__ void rmsnorm_dx_kernel(const typename V::Type::Second* dy, const float* x,
                                  const typename V::Type::First* w, const float* inv_rms, float* dx,
                                  bf16* dx16, int64_t rows, int64_t dim) {
  constexpr int P = V::value;
  using W = typename V::Type::First;
  using DY = typename V::Type::Second;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * dim;
    const DY* dyr = dy + r * dim;
    float* dxr = dx + r * dim;
    const float inv = inv_rms[r];
    double c = 0.0;
    float coef = 0.0f;
    two_passes<P>(
        dim,
        [&](int64_t j) {
          return Row<P, W, DY>{load_pack<P>(xr + j), load_pack<P>(w + j), load_pack<P>(dyr + j)};
        },
        [&](int64_t, const Row<P, W, DY>& e) {
          AMSP_UNROLL
          for (int k = 0; k < P; ++k)
            c += static_cast<double>(load(e.w.x[k]) * load(e.dy.x[k])) * e.x.x[k];
        },
        [&] {
          c = block_sum(c);
          coef = static_cast<float>(c * inv * inv * inv / static_cast<double>(dim));
        },
        [&](int64_t j) { return load_pack<P>(dxr + j); },
        [&](int64_t j, const Row<P, W, DY>& e, Pack<float, P> dxv) {
          AMSP_UNROLL
          for (int k = 0; k < P; ++k)
            dxv.x[k] += rmsnorm_dx_element(e.x.x[k], load(e.w.x[k]), load(e.dy.x[k]), inv, coef);
          store_pack<P>(dxr + j, dxv);
          if (dx16 != nullptr) store_pack<P>(dx16 + r * dim + j, rounded_pack<bf16>(dxv.x));
        });
  }
}

AMSP_DEVICE_INLINE void add_to(float* dst, float c) { *dst += c; }
AMSP_DEVICE_INLINE void add_to(bf16* dst, float c) {
  *dst = float_to_bf16(bf16_to_float(*dst) + c);
}

// dw[j] (+)= sum over rows of dy * (x * inv), in two launches spread over the
// device: the sums of each chunk of kRmsnormDwRows rows (math.h) per column, a
// block per (256 packs of columns, chunk), in double; then per column the
// chunks in order, added to dw once (or written). The CPU sums in the same order.
// V: Sized<P, dy's dtype>.
// Row r's dy and x at P columns, and its inv_rms. V: Sized<P, dy's dtype>.
template <typename V>
struct DwRow {
  Pack<typename V::Type, V::value> dy;
  Pack<float, V::value> x;
  float inv;
};

template <typename V>
__global__ void rmsnorm_dw_chunks_kernel(const typename V::Type* dy, const float* x,
                                         const float* inv_rms, double* partials, int64_t rows,
                                         int64_t dim) {
  constexpr int P = V::value;
  const int64_t chunks = (rows + kRmsnormDwRows - 1) / kRmsnormDwRows;
  for (int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * P; j < dim;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x * P)
    for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
      const int64_t r1 = (c + 1) * kRmsnormDwRows < rows ? (c + 1) * kRmsnormDwRows : rows;
      double acc[P] = {};
      batched<kDwRowBatch>(
          c * kRmsnormDwRows, r1, 1,
          [&](int64_t r) {
            return DwRow<V>{load_pack<P>(dy + r * dim + j), load_pack<P>(x + r * dim + j),
                            inv_rms[r]};
          },
          [&](int64_t, const DwRow<V>& e) {
            AMSP_UNROLL
            for (int k = 0; k < P; ++k)
              acc[k] += static_cast<double>(load(e.dy.x[k]) * (e.x.x[k] * e.inv));
          });
      AMSP_UNROLL
      for (int k = 0; k < P; ++k) partials[c * dim + j + k] = acc[k];
    }
}

template <typename DW>
__global__ void rmsnorm_dw_sum_kernel(const double* partials, DW* dw, bool add, int64_t chunks,
                                      int64_t dim) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < dim;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double acc = 0.0;  // the chunks in order, eight loads in flight at a time
    batched<8>(
        j, chunks * dim, dim, [&](int64_t at) { return partials[at]; },
        [&](int64_t, double part) { acc += part; });
    if (add)
      add_to(dw + j, static_cast<float>(acc));
    else
      store(dw + j, static_cast<float>(acc));
  }
}

// Calls f with std::integral_constant<int, P>: P = 4 where every pointer is
// aligned to its pack of 4 and rows of `dim` hold whole packs, else P = 1.
constexpr int kNormPack = 4;
template <typename F, typename... Ptr>
void with_pack(int64_t dim, F f, const Ptr*... p) {
  with_packs<kNormPack>(dim % kNormPack == 0, f, p...);
}

}  // namespace

template <typename W, typename Y>
void rmsnorm_forward(const float* x, const W* w, Y* y, float* inv_rms, int64_t rows, int64_t dim, float eps,
                     cudaStream_t s) {
  if (rows == 0) return;
  with_pack(
      dim,
      [&](auto pack) {
        using V = Sized<decltype(pack)::value, Dtypes<W, Y>>;
        AMSP_LAUNCH(rmsnorm_forward_kernel<V>, grid_for(rows, 1), kBlockThreads, 0, s)
        (x, w, y, inv_rms, rows, dim, eps);
      },
      x, w, y);
}

template <typename W, typename Y>
void rmsnorm_apply(const float* x, const W* w, const float* inv_rms, Y* y, int64_t rows, int64_t dim,
                   cudaStream_t s) {
  if (rows == 0 || dim == 0) return;
  with_pack(
      dim,
      [&](auto pack) {
        using V = Sized<decltype(pack)::value, Dtypes<W, Y>>;
        AMSP_LAUNCH(rmsnorm_apply_kernel<V>, grid_for(rows, 1), kBlockThreads, 0, s)
        (x, w, inv_rms, y, rows, dim);
      },
      x, w, y);
}

int64_t rmsnorm_backward_workspace(int64_t rows, int64_t dim) {
  return (rows + kRmsnormDwRows - 1) / kRmsnormDwRows * dim;
}

template <typename DY, typename W, typename DW>
void rmsnorm_backward(const DY* dy, const float* x, const W* w, const float* inv_rms, float* dx,
                      bf16* dx16, DW* dw, bool add_dw, int64_t rows, int64_t dim, double* workspace,
                      cudaStream_t s) {
  if (dim == 0 || (rows == 0 && add_dw)) return;  // no rows: dw written as zeros, or left
  const int64_t chunks = (rows + kRmsnormDwRows - 1) / kRmsnormDwRows;
  if (rows > 0)
    with_pack(
        dim,
        [&](auto pack) {
          constexpr int P = decltype(pack)::value;
          using V = Sized<P, Dtypes<W, DY>>;
          using VDY = Sized<P, DY>;
          AMSP_LAUNCH(rmsnorm_dx_kernel<V>, grid_for(rows, 1), kBlockThreads, 0, s)
          (dy, x, w, inv_rms, dx, dx16, rows, dim);
          const dim3 grid(grid_for(dim / P), grid_for(chunks, 1, 65535));
          AMSP_LAUNCH(rmsnorm_dw_chunks_kernel<VDY>, grid, kBlockThreads, 0, s)
          (dy, x, inv_rms, workspace, rows, dim);
        },
        dy, x, w, dx, dx16);
  AMSP_LAUNCH(rmsnorm_dw_sum_kernel<DW>, grid_for(dim), kBlockThreads, 0, s)
  (workspace, dw, add_dw, chunks, dim);
}

// Every combination of fp32 and bf16: w (and dw) a parameter's dtype, y and dy
// the activations'.
#define AMSP_RMSNORM(W, A)                                                                      \
  template void rmsnorm_forward(const float*, const W*, A*, float*, int64_t, int64_t, float,    \
                                cudaStream_t);                                                  \
  template void rmsnorm_apply(const float*, const W*, const float*, A*, int64_t, int64_t,       \
                              cudaStream_t);                                                    \
  template void rmsnorm_backward(const A*, const float*, const W*, const float*, float*, bf16*, \
                                 float*, bool, int64_t, int64_t, double*, cudaStream_t);        \
  template void rmsnorm_backward(const A*, const float*, const W*, const float*, float*, bf16*, \
                                 bf16*, bool, int64_t, int64_t, double*, cudaStream_t);
AMSP_RMSNORM(float, float)
AMSP_RMSNORM(float, bf16)
AMSP_RMSNORM(bf16, float)
AMSP_RMSNORM(bf16, bf16)
#undef AMSP_RMSNORM

}  // namespace amsp::kernels::cuda
