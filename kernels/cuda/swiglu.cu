// SwiGLU of LLaMA's MLP (kernels/cuda/ops.h): kernels/common/math.h's swiglu
// and swiglu_grad on fp32 or bf16 activations (widened, computed in fp32,
// stored rounded), the same bits as the CPU.
//
// blockIdx.y strides over the rows and x over a row's columns, P adjacent
// columns per thread: P = 16 bytes' worth (pack.cuh) where every row starts
// 16-byte aligned and holds whole packs (the model's gate|up always), else 1;
// a thread loads its packs of a row in batches (pack.cuh).
#include <type_traits>

#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

// Packs a thread loads before it uses them (pack.cuh, batched).
constexpr int kSwigluBatch = 2;

// P columns of a row's gate and up, and of the output's gradient (backward).
template <typename V>
struct GateUp {
  Pack<typename V::Type, V::value> gate, up;
};
template <typename V>
struct GateUpDout {
  Pack<typename V::Type, V::value> gate, up, dout;
};

// V: Sized<P, activation dtype>.
template <typename V>
__global__ void __launch_bounds__(kBlockThreads, 4)
    swiglu_forward_kernel(const typename V::Type* gate, const typename V::Type* up, int64_t ld,
                          typename V::Type* out, int64_t rows, int64_t cols) {
  constexpr int P = V::value;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    batched<kSwigluBatch>(
        first_pack<P>(), cols, pack_stride<P>(),
        [&](int64_t c) {
          return GateUp<V>{load_pack<P>(gate + r * ld + c), load_pack<P>(up + r * ld + c)};
        },
        [&](int64_t c, const GateUp<V>& e) {
          float o[P];
          AMSP_UNROLL
          for (int k = 0; k < P; ++k) o[k] = swiglu(load(e.gate.x[k]), load(e.up.x[k]));
          store_pack<P>(out + r * cols + c, rounded_pack<typename V::Type>(o));
        });
}

// dup may alias dout when ld == cols: each thread reads its columns of dout
// before it writes the same columns of dup.
template <typename V>
__global__ void __launch_bounds__(kBlockThreads, 4)
    swiglu_backward_kernel(const typename V::Type* gate, const typename V::Type* up, int64_t ld,
                           const typename V::Type* dout, typename V::Type* dgate,
                           typename V::Type* dup, int64_t rows, int64_t cols) {
  constexpr int P = V::value;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    batched<kSwigluBatch>(
        first_pack<P>(), cols, pack_stride<P>(),
        [&](int64_t c) {
          return GateUpDout<V>{load_pack<P>(gate + r * ld + c), load_pack<P>(up + r * ld + c),
                               load_pack<P>(dout + r * cols + c)};
        },
        [&](int64_t c, const GateUpDout<V>& e) {
          float dg[P], du[P];
          AMSP_UNROLL
          for (int k = 0; k < P; ++k)
            swiglu_grad(load(e.gate.x[k]), load(e.up.x[k]), load(e.dout.x[k]), dg[k], du[k]);
          store_pack<P>(dgate + r * ld + c, rounded_pack<typename V::Type>(dg));
          store_pack<P>(dup + r * ld + c, rounded_pack<typename V::Type>(du));
        });
}

// Calls f with std::integral_constant<int, P> and the grid for it.
template <typename A, typename F, typename... Ptr>
void with_pack(int64_t rows, int64_t cols, int64_t ld, F f, const Ptr*... p) {
  constexpr int N = kPack16<A>;
  const auto launch = [&](auto pack) {
    const int64_t packs = cols / decltype(pack)::value;
    f(pack, dim3(grid_for(packs, kBlockThreads * kSwigluBatch), grid_for(rows, 1, 65535)));
  };
  with_packs<N>(cols % N == 0 && ld % N == 0, launch, p...);
}

}  // namespace

template <typename A>
void swiglu_forward(const A* gate, const A* up, int64_t ld, A* out, int64_t rows, int64_t cols,
                    cudaStream_t s) {
  if (rows * cols == 0) return;
  with_pack<A>(
      rows, cols, ld,
      [&](auto pack, dim3 grid) {
        using V = Sized<decltype(pack)::value, A>;
        AMSP_LAUNCH(swiglu_forward_kernel<V>, grid, kBlockThreads, 0, s)
        (gate, up, ld, out, rows, cols);
      },
      gate, up, out);
}

template <typename A>
void swiglu_backward(const A* gate, const A* up, int64_t ld, const A* dout, A* dgate, A* dup,
                     int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols == 0) return;
  with_pack<A>(
      rows, cols, ld,
      [&](auto pack, dim3 grid) {
        using V = Sized<decltype(pack)::value, A>;
        AMSP_LAUNCH(swiglu_backward_kernel<V>, grid, kBlockThreads, 0, s)
        (gate, up, ld, dout, dgate, dup, rows, cols);
      },
      gate, up, dout, dgate, dup);
}

template void swiglu_forward(const float*, const float*, int64_t, float*, int64_t, int64_t, cudaStream_t);
template void swiglu_forward(const bf16*, const bf16*, int64_t, bf16*, int64_t, int64_t, cudaStream_t);
template void swiglu_backward(const float*, const float*, int64_t, const float*, float*, float*, int64_t,
                              int64_t, cudaStream_t);
template void swiglu_backward(const bf16*, const bf16*, int64_t, const bf16*, bf16*, bf16*, int64_t,
                              int64_t, cudaStream_t);

}  // namespace amsp::kernels::cuda
