// Cross-entropy over the vocabulary (kernels/cuda/ops.h). Forward: one block
// per row, the max and the sum of exp(z - max) as block reductions (the sum in
// double, as the CPU does, each thread's packs in turn then a fixed tree: lse
// may differ from the CPU's in the last bit). Backward: elementwise, the CPU's
// arithmetic.
#include <cmath>
#include <type_traits>

#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

// Rows by packs of P logits (16 bytes: pack.cuh) where the vocabulary holds
// whole packs and the logits are aligned, else one at a time; a thread loads a
// batch of kLossBatch packs before it uses them (pack.cuh, batched).
constexpr int kLossBatch = 4;

// S: Sized<P, logits' dtype>.
template <typename S>
__global__ void cross_entropy_forward_kernel(const typename S::Type* logits, const int32_t* targets,
                                             float* lse, float* losses, int32_t* bad_row,
                                             int64_t rows, int64_t V) {
  constexpr int P = S::value;
  using Logits = Pack<typename S::Type, P>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const typename S::Type* z = logits + r * V;
    // A row's packs, each thread's in turn: j = P t, P (t + blockDim.x), ...
    const auto over_row = [&](auto use) {
      batched<kLossBatch>(
          static_cast<int64_t>(threadIdx.x) * P, V, blockDim.x * P,
          [&](int64_t j) { return load_pack<P>(z + j); }, use);
    };
    float mx = -INFINITY;
    over_row([&](int64_t, const Logits& zs) {
      AMSP_UNROLL
      for (int k = 0; k < P; ++k) mx = MaxOp{}(mx, load(zs.x[k]));
    });
    mx = block_max(mx);
    double sum = 0.0;
    over_row([&](int64_t, const Logits& zs) {
      AMSP_UNROLL
      for (int k = 0; k < P; ++k) sum += fast_exp(load(zs.x[k]) - mx);
    });
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
      const double l = static_cast<double>(mx) + log(sum);
      lse[r] = static_cast<float>(l);
      const int32_t t = targets[r];
      if (t >= V) {
        // Never read past the row; the caller learns the first bad row.
        atomicMin(bad_row, static_cast<int>(r));
        losses[r] = 0.0f;
      } else {
        losses[r] = t < 0 ? 0.0f : static_cast<float>(l - static_cast<double>(load(z[t])));
      }
    }
  }
}

// One block, each thread a strided share of the rows, then block_sum's fixed
// tree: the double sum, on the device (not the host's row order).
__global__ void accumulate_loss_kernel(const float* losses, const int32_t* targets,
                                       const int32_t* bad_row, int64_t rows, double* acc) {
  double sum = 0.0, count = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (targets[r] < 0) continue;
    sum += static_cast<double>(losses[r]);
    count += 1.0;
  }
  sum = block_sum(sum);
  count = block_sum(count);
  if (threadIdx.x != 0) return;
  acc[0] += sum;
  acc[1] += count;
  const int32_t bad = *bad_row;
  if (bad != 0x7fffffff && acc[2] == 0.0) {
    acc[2] = static_cast<double>(bad) + 1.0;
    acc[3] = static_cast<double>(targets[bad]);
  }
}

// z := scale * exp(z - lse), then the target's entry minus scale, as the CPU
// writes then subtracts; ignored rows become 0. A bf16 entry is rounded once.
// S: Sized<P, logits' dtype>.
template <typename S>
__global__ void cross_entropy_backward_kernel(typename S::Type* logits, const int32_t* targets,
                                              const float* lse, int64_t rows, int64_t V,
                                              float scale) {
  constexpr int P = S::value;
  using Logits = Pack<typename S::Type, P>;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    typename S::Type* z = logits + r * V;
    const int32_t t = targets[r];
    const float l = lse[r];
    if (t < 0) {
      Logits zero;
      AMSP_UNROLL
      for (int k = 0; k < P; ++k) store(&zero.x[k], 0.0f);
      for (int64_t j = first_pack<P>(); j < V; j += pack_stride<P>()) store_pack<P>(z + j, zero);
      continue;
    }
    batched<kLossBatch>(
        first_pack<P>(), V, pack_stride<P>(), [&](int64_t j) { return load_pack<P>(z + j); },
        [&](int64_t j, const Logits& zs) {
          float g[P];
          AMSP_UNROLL
          for (int k = 0; k < P; ++k) {
            const float p = scale * fast_exp(load(zs.x[k]) - l);
            g[k] = j + k == t ? p - scale : p;
          }
          store_pack<P>(z + j, rounded_pack<typename S::Type>(g));
        });
  }
}

// Calls launch(std::integral_constant<int, P>) for the logits' packs.
template <typename Z, typename Launch>
void with_logit_packs(const Z* logits, int64_t V, Launch launch) {
  with_packs<kPack16<Z>>(V % kPack16<Z> == 0, launch, logits);
}

}  // namespace

template <typename Z>
void cross_entropy_forward(const Z* logits, const int32_t* targets, float* lse, float* losses,
                           int32_t* bad_row, int64_t rows, int64_t V, cudaStream_t s) {
  if (rows == 0 || V == 0) return;
  with_logit_packs(logits, V, [&](auto pack) {
    using S = Sized<decltype(pack)::value, Z>;
    AMSP_LAUNCH(cross_entropy_forward_kernel<S>, grid_for(rows, 1), kBlockThreads, 0, s)
    (logits, targets, lse, losses, bad_row, rows, V);
  });
}

void accumulate_loss(const float* losses, const int32_t* targets, const int32_t* bad_row,
                     int64_t rows, double* acc, cudaStream_t s) {
  AMSP_LAUNCH(accumulate_loss_kernel, 1, kBlockThreads, 0, s)(losses, targets, bad_row, rows, acc);
}

template <typename Z>
void cross_entropy_backward(Z* logits, const int32_t* targets, const float* lse, int64_t rows, int64_t V,
                            float scale, cudaStream_t s) {
  if (rows == 0 || V == 0) return;
  with_logit_packs(logits, V, [&](auto pack) {
    using S = Sized<decltype(pack)::value, Z>;
    // Rows along y (at most 65535 per pass), the vocabulary's packs along x.
    const dim3 grid(grid_for(V / S::value, kBlockThreads * kLossBatch, 64),
                    grid_for(rows, 1, 65535));
    AMSP_LAUNCH(cross_entropy_backward_kernel<S>, grid, kBlockThreads, 0, s)
    (logits, targets, lse, rows, V, scale);
  });
}

#define AMSP_CROSS_ENTROPY(Z)                                                                       \
  template void cross_entropy_forward(const Z*, const int32_t*, float*, float*, int32_t*, int64_t,  \
                                      int64_t, cudaStream_t);                                       \
  template void cross_entropy_backward(Z*, const int32_t*, const float*, int64_t, int64_t, float,   \
                                       cudaStream_t);
AMSP_CROSS_ENTROPY(float)
AMSP_CROSS_ENTROPY(bf16)
#undef AMSP_CROSS_ENTROPY

}  // namespace amsp::kernels::cuda
