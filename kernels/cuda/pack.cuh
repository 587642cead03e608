// Vector loads and stores for the memory-bound kernels of kernels/cuda: N
// adjacent elements moved as one access of N * sizeof(A) bytes (16 at most:
// an LDG.128 / STG.128 on the GPU), as llm.c's Packed128 and PyTorch's
// vectorized elementwise kernels do. A warp then moves 512 bytes per
// instruction instead of 64 or 128, which is what it takes to come near the
// memory's bandwidth with one pass over the data.
//
// A pack's address must be a multiple of its size: the host side checks
// (packs_align, flat_packs) and the kernels fall back to one element at a time where it does
// not hold (a row length or stride that is not a multiple of N, a view that
// starts mid-pack). The arithmetic per element is the scalar kernels', so both
// paths give the same bits.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/mma.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/simt.h"

namespace amsp::kernels::cuda {

template <typename A, int N>
struct alignas(sizeof(A) * N) Pack {
  static_assert(sizeof(A) * N <= 16 && (sizeof(A) * N & (sizeof(A) * N - 1)) == 0,
                "a pack is 2, 4, 8 or 16 bytes");
  A x[N];
};

// 16 bytes of A: 4 fp32 values, 8 bf16 ones.
template <typename A>
constexpr int kPack16 = static_cast<int>(16 / sizeof(A));

template <int N, typename A>
AMSP_DEVICE_INLINE Pack<A, N> load_pack(const A* p) {
#if defined(__CUDACC__)
  return *reinterpret_cast<const Pack<A, N>*>(p);
#else
  ::amsp::emu::simt::check_aligned(p, sizeof(Pack<A, N>));
  Pack<A, N> v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}

template <int N, typename A>
AMSP_DEVICE_INLINE void store_pack(A* p, const Pack<A, N>& v) {
#if defined(__CUDACC__)
  *reinterpret_cast<Pack<A, N>*>(p) = v;
#else
  ::amsp::emu::simt::check_aligned(p, sizeof v);
  std::memcpy(p, &v, sizeof v);
#endif
}

// P fp32 values stored as a pack of A, as store() stores each: bf16 a pair
// at a time by pack_bf16 (mma.h: one cvt.rn.bf16x2 on the GPU where
// float_to_bf16 takes some six integer instructions a value; the same bits but
// for a NaN's payload), fp32 as they are.
template <typename A, int P>
AMSP_DEVICE_INLINE Pack<A, P> rounded_pack(const float (&v)[P]) {
  Pack<A, P> out;
  if constexpr (std::is_same_v<A, uint16_t> && P % 2 == 0) {
    AMSP_UNROLL
    for (int k = 0; k < P; k += 2) {
      const uint32_t w = pack_bf16(v[k], v[k + 1]);
      out.x[k] = static_cast<uint16_t>(w & 0xffffu);
      out.x[k + 1] = static_cast<uint16_t>(w >> 16);
    }
  } else {
    AMSP_UNROLL
    for (int k = 0; k < P; ++k) store(&out.x[k], v[k]);
  }
  return out;
}

// Grid-stride loops over packs of P elements: a thread's first element, and
// the step to its next.
template <int P>
AMSP_DEVICE_INLINE int64_t first_pack() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * P;
}
template <int P>
AMSP_DEVICE_INLINE int64_t pack_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x * P;
}

// Batches of loads. One 16-byte pack a thread keeps too few bytes in flight
// for an H200's HBM: 4.8 TB/s at a latency near a microsecond wants some
// 30 KiB in flight an SM, every thread of a full SM waiting on one pack each,
// which short-lived blocks never are; and a loop that uses each load before
// it issues the next pays that latency per element. So loops load a batch of
// U packs before they use any, as PyTorch's vectorized and multi-tensor
// kernels load several a thread (their "ILP"; doc/gpu.md, "Memory-bound
// kernels by 16-byte packs").
//
// batched: over i = first, first + stride, ... < end, U at a time: load(i)
// for every index of a batch first, then use(i, loaded) for each, in order:
// the same calls in the same order as a plain loop (the same bits), provided
// that a use stores nothing a later load of its batch reads (a thread's own
// elements: an in-place update of i reads i before it writes it).
template <int U, typename Load, typename Use>
AMSP_DEVICE_INLINE void batched(int64_t first, int64_t end, int64_t stride, Load load, Use use) {
  using Loaded = decltype(load(first));
  for (int64_t i = first; i < end; i += U * stride) {
    Loaded v[U]{};  // zeros where a batch runs past the end: never used
    AMSP_UNROLL
    for (int u = 0; u < U; ++u)
      if (i + u * stride < end) v[u] = load(i + u * stride);
    AMSP_UNROLL
    for (int u = 0; u < U; ++u)
      if (i + u * stride < end) use(i + u * stride, v[u]);
  }
}

// A thread's share of a row held in registers between two passes over it (a
// sum over the row, then an update by that sum), so that the row is read once:
// hold<U> loads load(i) for i = first, first + stride, ... < end, every load
// before any use, where the caller knows that U of them cover the row (a
// block-uniform test); visit(use) then calls use(i, loaded) in order, the
// order batched takes, so a pass over a held row gives batched's bits.
template <int U, typename T>
struct Held {
  T v[U];
  int64_t first, end, stride;
  AMSP_DEVICE_INLINE int64_t at(int u) const { return first + u * stride; }
  template <typename Use>
  AMSP_DEVICE_INLINE void visit(Use use) const {
    AMSP_UNROLL
    for (int u = 0; u < U; ++u)
      if (at(u) < end) use(at(u), v[u]);
  }
};

template <int U, typename Load>
AMSP_DEVICE_INLINE auto hold(int64_t first, int64_t end, int64_t stride, Load load) {
  Held<U, decltype(load(first))> h{{}, first, end, stride};
  AMSP_UNROLL
  for (int u = 0; u < U; ++u)
    if (h.at(u) < end) h.v[u] = load(h.at(u));
  return h;
}

// Over elements [0, n) of flat arrays, grid-stride: use(i, P, load(i, P))
// for i in [0, packed) by packs of P (P a std::integral_constant), in batches
// of U, then use(i, 1, load(i, 1)) for the rest, one at a time. `packed` is a
// multiple of P: flat_packs' answer.
template <int P, int U, typename Load, typename Use>
AMSP_DEVICE_INLINE void for_each_pack(int64_t n, int64_t packed, Load load, Use use) {
  const std::integral_constant<int, P> pack;
  const std::integral_constant<int, 1> one;
  batched<U>(
      first_pack<P>(), packed, pack_stride<P>(), [&](int64_t i) { return load(i, pack); },
      [&](int64_t i, const auto& v) { use(i, pack, v); });
  for (int64_t i = packed + first_pack<1>(); i < n; i += pack_stride<1>())
    use(i, one, load(i, one));
}

// Blocks for for_each_pack<P, U> over n elements of which `packed` go by
// packs: a batch a thread, or an element a thread where none go by packs.
template <int P, int U>
unsigned flat_pack_grid(int64_t n, int64_t packed, int64_t cap = 1 << 16) {
  const int64_t batches = (packed / P + U - 1) / U, rest = n - packed;
  return grid_for(batches > rest ? batches : rest, kBlockThreads, cap);
}

// Whether p is a multiple of `bytes`, a pack's size. Host side, at launch.
inline bool pack_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Whether every pointer is aligned to its pack of N elements of its own type.
template <int N, typename... T>
bool packs_align(const T*... p) {
  return (pack_aligned(p, sizeof(T) * N) && ...);
}

// Calls launch(std::integral_constant<int, N>) where `whole` (the lengths and
// strides a kernel steps by hold whole packs of N) and every pointer is
// aligned to its pack, else launch(std::integral_constant<int, 1>): the one
// choice every launcher by packs makes. Host side, at launch.
template <int N, typename Launch, typename... T>
void with_packs(bool whole, Launch launch, const T*... p) {
  if (whole && packs_align<N>(p...))
    launch(std::integral_constant<int, N>{});
  else
    launch(std::integral_constant<int, 1>{});
}

// How many of n elements of flat arrays at these pointers for_each_pack<N>
// can take by packs: n rounded down to whole packs, or 0 where a pointer is
// not aligned to its pack.
template <int N, typename... T>
int64_t flat_packs(int64_t n, const T*... p) {
  return packs_align<N>(p...) ? n / N * N : 0;
}

}  // namespace amsp::kernels::cuda
