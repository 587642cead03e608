// Multi-tensor AdamW (kernels/cuda/ops.h): up to kAdamWTensors tensors per
// launch, passed by value in the kernel's parameters (as apex's
// multi_tensor_apply does), so a model's hundreds of small tensors cost a few
// launches instead of hundreds. blockIdx.y picks the tensor, x strides over
// its elements. Per element: the CPU backend's loop, bit for bit.
#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

// Elements of a tensor updated 4 at a time: a pack of 16 bytes of each fp32
// array and 8 of a bf16 one (pack.cuh). packed[t] of tensor t's elements go by
// packs (0 where a pointer is not aligned to its pack), the rest one at a time.
constexpr int kAdamWPack = 4;

struct AdamWBatch {
  AdamWTensor tensors[kAdamWTensors];
  int64_t packed[kAdamWTensors];
};

// P gradients from element i, widened.
template <int P>
AMSP_DEVICE_INLINE Pack<float, P> load_grads(const AdamWTensor& t, int64_t i) {
  if (!t.grad_bf16) return load_pack<P>(static_cast<const float*>(t.grad) + i);
  const Pack<bf16, P> b = load_pack<P>(static_cast<const bf16*>(t.grad) + i);
  Pack<float, P> g;
  AMSP_UNROLL
  for (int k = 0; k < P; ++k) g.x[k] = bf16_to_float(b.x[k]);
  return g;
}

// The updated masters of elements i.. into the copy, in its dtype.
template <int P>
AMSP_DEVICE_INLINE void store_copies(const AdamWTensor& t, int64_t i, const Pack<float, P>& p) {
  if (t.copy == nullptr) return;
  if (!t.copy_bf16) return store_pack<P>(static_cast<float*>(t.copy) + i, p);
  store_pack<P>(static_cast<bf16*>(t.copy) + i, rounded_pack<bf16>(p.x));
}

// An element's gradient, master, first and second moment: P of each.
template <int P>
struct Moments {
  Pack<float, P> g, p, m, v;
};

// Two packs of each array a thread in flight (pack.cuh, batched), at most 64
// registers so that four blocks share an SM.
constexpr int kAdamWBatch = 2;

__global__ void __launch_bounds__(kBlockThreads, 4) adamw_kernel(AdamWBatch batch, AdamWHyper h) {
  const AdamWTensor& t = batch.tensors[blockIdx.y];
  const float scale = h.scale != nullptr ? *h.scale : h.grad_scale;
  const bool scaled = scale != 1.0f;
  const auto load = [&](int64_t i, auto pack) {
    constexpr int P = decltype(pack)::value;
    return Moments<P>{load_grads<P>(t, i), load_pack<P>(t.master_in + i), load_pack<P>(t.m_in + i),
                      load_pack<P>(t.v_in + i)};
  };
  const auto update = [&](int64_t i, auto pack, auto e) {
    constexpr int P = decltype(pack)::value;
    AMSP_UNROLL
    for (int k = 0; k < P; ++k)
      adamw_update_element(e.p.x[k], e.m.x[k], e.v.x[k], scaled ? e.g.x[k] * scale : e.g.x[k], h.lr,
                           h.beta1, h.beta2, h.eps, t.weight_decay, h.bias_correction1,
                           h.bias_correction2);
    store_pack<P>(t.master + i, e.p);
    store_pack<P>(t.m + i, e.m);
    store_pack<P>(t.v + i, e.v);
    store_copies<P>(t, i, e.p);
  };
  for_each_pack<kAdamWPack, kAdamWBatch>(t.n, batch.packed[blockIdx.y], load, update);
}

// How many of t's elements can go by packs.
int64_t packed_elements(const AdamWTensor& t) {
  const size_t grad = t.grad_bf16 ? sizeof(bf16) : sizeof(float),
               copy = t.copy_bf16 ? sizeof(bf16) : sizeof(float);
  const bool fit = packs_align<kAdamWPack>(t.master_in, t.m_in, t.v_in, t.master, t.m, t.v) &&
                   pack_aligned(t.grad, grad * kAdamWPack) &&
                   pack_aligned(t.copy, copy * kAdamWPack);
  return fit ? t.n / kAdamWPack * kAdamWPack : 0;
}

}  // namespace

void adamw(const AdamWTensor* tensors, int count, const AdamWHyper& hyper, cudaStream_t s) {
  for (int first = 0; first < count; first += kAdamWTensors) {
    AdamWBatch batch{};
    int used = 0;
    int64_t longest = 0;
    for (int k = first; k < count && k < first + kAdamWTensors; ++k) {
      if (tensors[k].n == 0) continue;
      batch.packed[used] = packed_elements(tensors[k]);
      batch.tensors[used++] = tensors[k];
      longest = tensors[k].n > longest ? tensors[k].n : longest;
    }
    if (used == 0) continue;
    const dim3 grid(
        flat_pack_grid<kAdamWPack, kAdamWBatch>(longest, longest / kAdamWPack * kAdamWPack, 1024),
        static_cast<unsigned>(used));
    AMSP_LAUNCH(adamw_kernel, grid, kBlockThreads, 0, s)(batch, hyper);
  }
}

}  // namespace amsp::kernels::cuda
