// The SIMT emulation: CUDA kernels, unchanged, run on the CPU (kernels/cuda/simt.h
// includes this header in every build that is not nvcc's).
//
// A launch runs at once, on the calling thread: the grid's blocks one after
// another in linear order, and each block's threads as fibers (Boost.Context)
// scheduled round-robin in linear thread order, so every run interleaves the
// threads the same way. A thread runs until it finishes or waits:
//   - __syncthreads waits until every thread of the block has arrived;
//   - __syncwarp and the shuffles wait until every lane named in the mask has
//     arrived. A shuffle is two rendezvous: each lane deposits its value, all
//     read, and only after the second may a slot be reused.
// Two other schedules (set_order, or AMSP_SIMT_ORDER in the environment) make
// races show that the forward round-robin hides: reverse resumes the threads
// from the last; lowest-first always resumes the lowest runnable thread, so
// the first warp runs as far ahead of the others as the barriers let it. A
// kernel that lacks a barrier reads shared memory too early in one of them.
// When no thread of a block can run and not all have finished (some exited or
// wait at a warp op while others wait at __syncthreads, or a mask names a lane
// that exited), the launch fails with std::runtime_error naming the kernel and
// the block; so does a mask naming a lane the block does not have, a shuffle
// reading a lane outside its mask, lanes of one warp meeting with different
// masks, or a launch configuration CUDA rejects.
//
// Memory: __shared__ is `static thread_local` (one copy per OS thread, shared by
// the fibers of the block that runs; blocks run one at a time, and like CUDA's,
// it is not cleared between blocks). Dynamic shared memory (AMSP_DYNAMIC_SHARED)
// is a per-launch buffer of shared_bytes, filled with 0xff bytes (NaN as float)
// before each block so that reads of unwritten shared memory show. At most
// kMaxDynamicShared bytes, CUDA's limit without an opt-in attribute, unless the
// kernel opted in to more (cudaFuncSetAttribute's
// cudaFuncAttributeMaxDynamicSharedMemorySize, up to kMaxDynamicSharedOptin).
//
// What it does not emulate: blocks running at the same time (a block spinning
// on another block's flag hangs here), memory ordering and races between
// threads beyond what the three schedules expose (one OS thread runs them
// all), and the hardware's own scheduling between barriers.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/cuda/emu/runtime.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__
#define __launch_bounds__(...)
#define __shared__ static thread_local
// GCC and Clang know __restrict__ as a keyword; only other compilers need it gone.
#if !defined(__GNUC__)
#define __restrict__
#endif

constexpr int warpSize = 32;

namespace amsp::emu::simt {

constexpr size_t kMaxDynamicShared = 48 * 1024;
// The most a kernel may opt in to on the emulated device by default: an
// A100's 163 KiB (sm_80, what the kernels are compiled for first; an H100
// allows 227, a T4 64).
constexpr size_t kMaxDynamicSharedOptin = 163 * 1024;
constexpr int kMaxBlockThreads = 1024;

// What a fiber needs to answer threadIdx and friends; `current` points at the
// running thread's (null outside a kernel).
struct ThreadInfo {
  dim3 thread_idx;
  dim3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
  void* dynamic_shared;
};
inline thread_local const ThreadInfo* current = nullptr;

// The type-erased body of a launch: calls the kernel with the launch's arguments.
using KernelBody = void (*)(const void* context);

// Runs a whole launch of `function` (simt.cpp); throws std::runtime_error
// naming `kernel` on a bad configuration (more dynamic shared memory than the
// function may have), a barrier divergence or a bad warp op.
void run(const char* kernel, const void* function, dim3 grid, dim3 block, size_t shared_bytes,
         KernelBody body, const void* context);

// Thread blocks launched so far, over every kernel and thread (the grids'
// sizes): what a test reads to see which work layout a launcher chose.
uint64_t blocks_launched();

// The dynamic shared memory `function` may have from now on (the emulated
// cudaFuncSetAttribute); false, and nothing changed, past device_shared_optin().
bool set_max_dynamic_shared(const void* function, size_t bytes);

// What the emulated device lets a kernel opt in to
// (cudaDevAttrMaxSharedMemoryPerBlockOptin): kMaxDynamicSharedOptin, or what a
// test set to play a smaller GPU (at least 48 KiB; 0 restores the default).
size_t device_shared_optin();
void set_device_shared_optin(size_t bytes);

// Barriers and the warp exchange behind the CUDA names below.
void sync_block();
void sync_warp(unsigned mask);
// Deposits `value` for this lane, rendezvous with the lanes of `mask`, returns
// the value lane `src` deposited (src is a lane of this warp, 0..31), then
// rendezvous again.
uint64_t exchange(unsigned mask, uint64_t value, int src);
// The tensor-core product of kernels/cuda/mma.h, d += a * b for one
// m16n8k16 tile with bf16 inputs and fp32 accumulators, as the whole warp's
// mma.sync: every lane deposits its fragments, the 32 meet, each computes its
// own four outputs from all the fragments (PTX's layout), and they meet again.
// The 16 products of an output are exact in double and added to it with one
// fp32 rounding, as the hardware sums them before it rounds once.
void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
// ex2.approx.ftz.f32 of kernels/cuda/mma.h: 2^x as the host's exp2f gives it,
// then moved by -2 to +2 units in the last place (chosen by x's bits, so the
// same x always gives the same result), the error the GPU's instruction may
// have; results below FLT_MIN are 0 (.ftz), 2^-inf is 0, 2^inf is inf.
float ex2_approx(float x);
// ldmatrix.sync.aligned.m8n8.x`count`[.trans].shared.b16 of kernels/cuda/mma.h
// for the whole warp: lane 8 i + j names row j of 8 x 8 block i (16 bytes,
// 16-byte aligned, else the launch fails); each lane receives in words[i] the
// two values of block i at row g, columns 2 t and 2 t + 1, or with `trans` at
// rows 2 t and 2 t + 1 of column g (lane = 4 g + t), the first in the low half.
void ldmatrix(uint32_t* words, int count, bool trans, const uint16_t* row);
// cp.async.cg.shared.global of kernels/cuda/mma.h, 16 bytes from global `src`
// to shared `dst` (both 16-byte aligned, else the launch fails), or 16 zero
// bytes with fill_zero. The bytes are read at issue and land in shared memory
// only when this thread's cp_async_wait says their group is complete, as on
// the GPU no sooner is promised: a kernel that reads a tile before it waits
// (or before the barrier after the wait) reads the previous tile's bytes.
// Under the lowest-first schedule they land at issue instead, the earliest the
// GPU may write them: a kernel that issues the next tile's copies before every
// warp is done with the buffer they overwrite reads the next tile's bytes.
// cp_async_commit closes the thread's open group; cp_async_wait(n) lands every
// committed group but the newest n. Copies never committed land at no wait,
// as PTX's wait_group promises nothing of them.
void cp_async16(void* dst, const void* src, bool fill_zero);
void cp_async_commit();
void cp_async_wait(int pending);
// A vector access of `bytes` (2, 4, 8 or 16: kernels/cuda/pack.cuh) at p:
// fails the launch unless p is a multiple of `bytes`, as the GPU does
// (cudaErrorMisalignedAddress), so a kernel that takes packs where they do not
// fit fails in the suite too.
void check_aligned(const void* p, size_t bytes);

// The order in which a block's threads are resumed, for launches from this OS
// thread; the default is AMSP_SIMT_ORDER's ("forward", "reverse" or
// "lowest-first"), else forward.
enum class Order { kForward, kReverse, kLowestFirst };
void set_order(Order order);
Order order();

// Counters for the cost figures of the tests: fiber switches and fibers
// started on this OS thread since it began.
int64_t switch_count();
int64_t fiber_count();

template <typename T>
uint64_t to_slot(T v) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  uint64_t s = 0;
  std::memcpy(&s, &v, sizeof v);
  return s;
}

template <typename T>
T from_slot(uint64_t s) {
  T v;
  std::memcpy(&v, &s, sizeof v);
  return v;
}

inline int lane_id() {
  const ThreadInfo& t = *current;
  const unsigned linear =
      t.thread_idx.x + t.block_dim.x * (t.thread_idx.y + t.block_dim.y * t.thread_idx.z);
  return static_cast<int>(linear % 32u);
}

// The launcher AMSP_LAUNCH makes: its call operator takes the kernel's own
// parameter types, so arguments convert as they do for <<<...>>>, and each
// emulated thread gets its own copy of the parameters, as on the GPU.
template <typename Kernel>
class Launch;

template <typename... Params>
class Launch<void (*)(Params...)> {
 public:
  Launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
         cudaStream_t stream)
      : name_(name), kernel_(kernel), grid_(grid), block_(block), shared_bytes_(shared_bytes) {
    (void)stream;  // the emulated stream runs work when it is issued
  }

  void operator()(Params... args) const {
    struct Context {
      void (*kernel)(Params...);
      std::tuple<std::decay_t<Params>...> args;
    };
    const Context context{kernel_, std::tuple<std::decay_t<Params>...>(args...)};
    run(name_, reinterpret_cast<const void*>(kernel_), grid_, block_, shared_bytes_, &call<Context>,
        &context);
  }

 private:
  template <typename Context>
  static void call(const void* p) {
    const Context& c = *static_cast<const Context*>(p);
    std::apply(c.kernel, c.args);
  }

  const char* name_;
  void (*kernel_)(Params...);
  dim3 grid_, block_;
  size_t shared_bytes_;
};

template <typename... Params>
Launch(const char*, void (*)(Params...), dim3, dim3, size_t, cudaStream_t)
    -> Launch<void (*)(Params...)>;

}  // namespace amsp::emu::simt

#define threadIdx (::amsp::emu::simt::current->thread_idx)
#define blockIdx (::amsp::emu::simt::current->block_idx)
#define blockDim (::amsp::emu::simt::current->block_dim)
#define gridDim (::amsp::emu::simt::current->grid_dim)

#define AMSP_LAUNCH(kernel, grid, block, shared_bytes, stream)                                  \
  ::amsp::emu::simt::Launch(#kernel, &kernel, dim3(grid), dim3(block),                          \
                            static_cast<size_t>(shared_bytes), (stream))
#define AMSP_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(::amsp::emu::simt::current->dynamic_shared)

inline void __syncthreads() { ::amsp::emu::simt::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::amsp::emu::simt::sync_warp(mask); }

// Shuffles of 4- and 8-byte values (float, int, unsigned, double, long long):
// __shfl_sync, __shfl_up_sync, __shfl_down_sync, __shfl_xor_sync.
// `width` splits the warp into segments as CUDA does.
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  const int lane = ::amsp::emu::simt::lane_id();
  const int src = (lane / width) * width + ((src_lane % width) + width) % width;
  return ::amsp::emu::simt::from_slot<T>(
      ::amsp::emu::simt::exchange(mask, ::amsp::emu::simt::to_slot(var), src));
}

template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const int lane = ::amsp::emu::simt::lane_id();
  // Past the end of its segment a lane reads its own value.
  const int src = (lane % width) + static_cast<int>(delta) < width
                      ? lane + static_cast<int>(delta) : lane;
  return ::amsp::emu::simt::from_slot<T>(
      ::amsp::emu::simt::exchange(mask, ::amsp::emu::simt::to_slot(var), src));
}

template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const int lane = ::amsp::emu::simt::lane_id();
  // Before the start of its segment a lane reads its own value.
  const int src = (lane % width) >= static_cast<int>(delta) ? lane - static_cast<int>(delta) : lane;
  return ::amsp::emu::simt::from_slot<T>(
      ::amsp::emu::simt::exchange(mask, ::amsp::emu::simt::to_slot(var), src));
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  const int lane = ::amsp::emu::simt::lane_id();
  // A lane may read earlier segments, not later ones (there it reads itself).
  const int target = lane ^ lane_mask;
  const int src = target >= (lane / width + 1) * width ? lane : target;
  return ::amsp::emu::simt::from_slot<T>(
      ::amsp::emu::simt::exchange(mask, ::amsp::emu::simt::to_slot(var), src));
}

// No two emulated threads run at once, so a read-modify-write is atomic.
inline int atomicAdd(int* address, int value) {
  const int old = *address;
  *address = old + value;
  return old;
}

inline int atomicMin(int* address, int value) {
  const int old = *address;
  if (value < old) *address = value;
  return old;
}

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

// fp32 product and sum rounded once each, which nvcc never contracts into a
// fused multiply-add. Out of line (simt.cpp), so that the host compiler cannot
// fuse them with their neighbours either, whatever its -ffp-contract.
float __fmul_rn(float a, float b);
float __fadd_rn(float a, float b);
