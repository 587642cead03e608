// The SIMT emulation against what CUDA promises: shuffles and shared memory
// combine a block's values, dynamic shared memory is per block, 2D grids and
// blocks number their threads as CUDA does, a partial last block stays within
// bounds, and barrier divergence fails loudly instead of passing by luck.
#include "kernels/cuda/simt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/mma.h"
#include "kernels/cuda/pack.cuh"

namespace {

// Sum over a block of up to 1024 threads: a warp reduction by shuffles, the
// warps' sums through shared memory, then the first warp reduces those.
__device__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const unsigned warps = (blockDim.x + 31) / 32;
  v = lane < warps ? warp_sums[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const float total = __shfl_sync(0xffffffffu, v, 0);
  __syncthreads();  // warp_sums may be written again by the caller's next call
  return total;
}

__global__ void block_sum_kernel(const float* x, float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const float s = block_sum(i < n ? x[i] : 0.0f);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

TEST(Simt, BlockSumByShufflesAndSharedMemory) {
  const int n = 1000, threads = 256, blocks = (n + threads - 1) / threads;
  std::vector<float> x(n), out(blocks, -1.0f);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i % 7);  // exact sums in fp32
  AMSP_LAUNCH(block_sum_kernel, blocks, threads, 0, nullptr)(x.data(), out.data(), n);
  for (int b = 0; b < blocks; ++b) {
    float want = 0.0f;
    for (int i = b * threads; i < std::min(n, (b + 1) * threads); ++i) want += x[i];
    EXPECT_EQ(out[b], want) << "block " << b;
  }
}

__global__ void shuffle_kinds_kernel(double* d, int* k, unsigned* u) {
  const int lane = static_cast<int>(threadIdx.x);
  d[lane] = __shfl_down_sync(0xffffffffu, 0.5 + lane, 3);      // past 31: own value
  k[lane] = __shfl_xor_sync(0xffffffffu, 100 + lane, 1, 16);  // neighbour in 16-lane halves
  u[lane] = __shfl_up_sync(0xffffffffu, 200u + lane, 2, 8);    // before a segment: own value
}

TEST(Simt, ShufflesOfDoubleAndInt) {
  std::vector<double> d(32);
  std::vector<int> k(32);
  std::vector<unsigned> u(32);
  AMSP_LAUNCH(shuffle_kinds_kernel, 1, 32, 0, nullptr)(d.data(), k.data(), u.data());
  for (int lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(d[lane], 0.5 + (lane + 3 < 32 ? lane + 3 : lane));
    EXPECT_EQ(k[lane], 100 + (lane ^ 1));
    EXPECT_EQ(u[lane], 200u + static_cast<unsigned>(lane % 8 >= 2 ? lane - 2 : lane));
  }
}

// Reverses each block's slice through dynamic shared memory.
__global__ void reverse_kernel(const int* x, int* y, int n) {
  AMSP_DYNAMIC_SHARED(int, buf);
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x] = i < static_cast<unsigned>(n) ? x[i] : -1;
  __syncthreads();
  const unsigned j = blockDim.x - 1 - threadIdx.x;
  if (i < static_cast<unsigned>(n)) y[i] = buf[j];
}

TEST(Simt, DynamicSharedMemoryAndPartialLastBlock) {
  const int n = 100, threads = 64;  // the second block has 36 of its 64 threads in range
  std::vector<int> x(n), y(n + 8, 12345);
  std::iota(x.begin(), x.end(), 0);
  AMSP_LAUNCH(reverse_kernel, 2, threads, threads * sizeof(int), nullptr)(x.data(), y.data(), n);
  for (int i = 0; i < n; ++i) {
    const int b = i / threads, j = threads - 1 - i % threads, src = b * threads + j;
    EXPECT_EQ(y[i], src < n ? src : -1) << i;
  }
  for (int i = n; i < n + 8; ++i) EXPECT_EQ(y[i], 12345) << "written past n at " << i;
}

// More than 48 KiB of dynamic shared memory only after the kernel opts in
// (cudaFuncSetAttribute), as on a GPU, and never past what the device allows
// (cudaDevAttrMaxSharedMemoryPerBlockOptin); the opt-in belongs to the kernel.
AMSP_DEVICE_INLINE void reverse_past_48k(int* y) {
  AMSP_DYNAMIC_SHARED(int, buf);
  buf[threadIdx.x + 15000] = static_cast<int>(threadIdx.x);  // past 48 KiB
  __syncthreads();
  y[threadIdx.x] = buf[31 - threadIdx.x + 15000];
}
__global__ void big_shared_kernel(int* y) { reverse_past_48k(y); }
__global__ void other_big_shared_kernel(int* y) { reverse_past_48k(y); }

TEST(Simt, SharedMemoryPast48KiBNeedsTheKernelsOptIn) {
  const size_t bytes = 64 * 1024;
  std::vector<int> y(32, -1);
  EXPECT_THROW(AMSP_LAUNCH(big_shared_kernel, 1, 32, bytes, nullptr)(y.data()), std::runtime_error);
  int most = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), cudaSuccess);
  EXPECT_EQ(most, 163 * 1024);
  EXPECT_EQ(cudaFuncSetAttribute(big_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 most + 1),
            cudaErrorInvalidValue);
  (void)cudaGetLastError();
  ASSERT_EQ(cudaFuncSetAttribute(big_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(bytes)),
            cudaSuccess);
  AMSP_LAUNCH(big_shared_kernel, 1, 32, bytes, nullptr)(y.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 31 - i) << i;
  EXPECT_THROW(AMSP_LAUNCH(big_shared_kernel, 1, 32, bytes + 4, nullptr)(y.data()),
               std::runtime_error);
  EXPECT_THROW(AMSP_LAUNCH(other_big_shared_kernel, 1, 32, bytes, nullptr)(y.data()),
               std::runtime_error);
}

// Reads its lower neighbour's shared slot with no barrier between the write
// and the read: a race. Resumed in forward order every neighbour has written
// already, so it passes by luck; in reverse order it reads unwritten memory.
__global__ void racy_shift_kernel(int* y) {
  AMSP_DYNAMIC_SHARED(int, buf);
  const unsigned i = threadIdx.x;
  buf[i] = static_cast<int>(i);
  y[i] = i > 0 ? buf[i - 1] : -1;
}

TEST(Simt, ReverseOrderExposesAMissingBarrier) {
  using amsp::emu::simt::Order;
  auto wrong = [](Order order) {
    amsp::emu::simt::set_order(order);
    std::vector<int> y(64);
    AMSP_LAUNCH(racy_shift_kernel, 1, 64, 64 * sizeof(int), nullptr)(y.data());
    amsp::emu::simt::set_order(Order::kForward);
    int bad = 0;
    for (int i = 1; i < 64; ++i) bad += y[i] != i - 1;
    return bad;
  };
  EXPECT_EQ(wrong(Order::kForward), 0);
  EXPECT_EQ(wrong(Order::kReverse), 63);
}

// Each thread copies 16 bytes of src into shared memory by cp.async and
// reads them back before its wait (seen[0..7]) and after it (seen[8..15]).
struct alignas(16) Tile {
  uint16_t v[8 * 32];
};

__global__ void async_copy_kernel(const uint16_t* src, uint16_t* seen) {
  __shared__ Tile shared;
  uint16_t* tile = shared.v;
  const int i = static_cast<int>(threadIdx.x);
  for (int j = 0; j < 8; ++j) tile[8 * i + j] = 0xffff;
  amsp::kernels::cuda::cp_async16(tile + 8 * i, src + 8 * i, i % 2 == 0);
  amsp::kernels::cuda::cp_async_commit();
  for (int j = 0; j < 8; ++j) seen[16 * i + j] = tile[8 * i + j];
  amsp::kernels::cuda::cp_async_wait<0>();
  for (int j = 0; j < 8; ++j) seen[16 * i + 8 + j] = tile[8 * i + j];
}

// cp.async lands at the wait (odd threads' copies zero-fill), no sooner, and
// under lowest-first at issue: the two ends of what the GPU may do.
TEST(Simt, AsyncCopiesLandAtTheWaitOrAtIssue) {
  using amsp::emu::simt::Order;
  std::vector<uint16_t> src(8 * 32);  // malloc's 16-byte alignment
  std::iota(src.begin(), src.end(), uint16_t{1});
  for (Order order : {Order::kForward, Order::kLowestFirst}) {
    amsp::emu::simt::set_order(order);
    std::vector<uint16_t> seen(16 * 32);
    AMSP_LAUNCH(async_copy_kernel, 1, 32, 0, nullptr)(src.data(), seen.data());
    amsp::emu::simt::set_order(Order::kForward);
    for (int i = 0; i < 32; ++i)
      for (int j = 0; j < 8; ++j) {
        const uint16_t want = i % 2 == 0 ? src[8 * i + j] : 0;
        EXPECT_EQ(seen[16 * i + j], order == Order::kLowestFirst ? want : 0xffff) << i << " " << j;
        EXPECT_EQ(seen[16 * i + 8 + j], want) << i << " " << j;
      }
  }
}

__global__ void coords_kernel(int* out, int width) {
  const unsigned x = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned y = blockIdx.y * blockDim.y + threadIdx.y;
  out[y * static_cast<unsigned>(width) + x] =
      static_cast<int>(1000 * y + x + 1000000 * (gridDim.x * gridDim.y == 6 && blockDim.y == 4));
}

TEST(Simt, TwoDimensionalGridAndBlock) {
  const int width = 3 * 8, height = 2 * 4;
  std::vector<int> out(width * height, -1);
  AMSP_LAUNCH(coords_kernel, dim3(3, 2), dim3(8, 4), 0, nullptr)(out.data(), width);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) EXPECT_EQ(out[y * width + x], 1000000 + 1000 * y + x);
}

// Threads past n return before the barrier the others wait at.
__global__ void divergent_kernel(float* x, int n) {
  const int i = static_cast<int>(threadIdx.x);
  if (i >= n) return;
  __syncthreads();
  x[i] = 1.0f;
}

TEST(Simt, BarrierDivergenceFailsNamingTheKernel) {
  std::vector<float> x(64);
  try {
    AMSP_LAUNCH(divergent_kernel, 1, 64, 0, nullptr)(x.data(), 40);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("divergent_kernel"), std::string::npos) << what;
    EXPECT_NE(what.find("barrier divergence"), std::string::npos) << what;
  }
  // All threads present: the same kernel runs.
  AMSP_LAUNCH(divergent_kernel, 1, 64, 0, nullptr)(x.data(), 64);
  EXPECT_EQ(x[63], 1.0f);
}

// Each thread copies a pack of 4 floats starting `offset` floats in.
__global__ void pack_copy_kernel(const float* x, float* y, int offset) {
  using amsp::kernels::cuda::load_pack;
  using amsp::kernels::cuda::store_pack;
  const int i = 4 * static_cast<int>(threadIdx.x) + offset;
  store_pack<4>(y + i, load_pack<4>(x + i));
}

TEST(Simt, MisalignedPacksFailAsOnTheGpu) {
  std::vector<float> x(4 * 32 + 1), y(x.size());  // malloc's 16-byte alignment
  std::iota(x.begin(), x.end(), 1.0f);
  AMSP_LAUNCH(pack_copy_kernel, 1, 32, 0, nullptr)(x.data(), y.data(), 0);
  EXPECT_EQ(y[4 * 31 + 3], x[4 * 31 + 3]);
  try {
    AMSP_LAUNCH(pack_copy_kernel, 1, 32, 0, nullptr)(x.data(), y.data(), 1);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("pack_copy_kernel"), std::string::npos) << what;
    EXPECT_NE(what.find("misaligned address: a 16-byte access"), std::string::npos) << what;
  }
}

// ex2.approx as the emulation gives it: within 2 ulp of 2^x, moved in both
// directions (so the suite's tolerances meet the instruction's error, not only
// a correctly rounded exp2), the same for the same x, and .ftz's edges.
TEST(Simt, Exp2ApproxIsWithinTwoUlpAndFlushesAsFtz) {
  using amsp::kernels::cuda::exp2_approx;
  int below = 0, above = 0;
  for (float x = -126.0f; x < 127.9f; x += 0.0137f) {
    const float y = exp2_approx(x);
    const double exact = std::exp2(static_cast<double>(x));
    const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
    ASSERT_LE(std::fabs(y - exact), 2.5 * ulp) << x;
    ASSERT_EQ(y, exp2_approx(x)) << x;
    below += y < static_cast<float>(exact);
    above += y > static_cast<float>(exact);
  }
  EXPECT_GT(below, 1000);
  EXPECT_GT(above, 1000);
  EXPECT_EQ(exp2_approx(-INFINITY), 0.0f);
  EXPECT_EQ(exp2_approx(-126.5f), 0.0f);  // 2^-126.5 is below FLT_MIN: flushed
  EXPECT_EQ(exp2_approx(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(exp2_approx(NAN)));
}

// A pair packed and unpacked again is each value rounded as round_bf16 rounds
// it (nearest even).
TEST(Simt, PackedPairUnpacksToRoundBf16OfEach) {
  const float xs[] = {1.0f, 1.00390625f, 1.01171875f, -3.14159f, 1e-40f, 3.4e38f, 0.1f, -0.0f};
  for (float lo : xs)
    for (float hi : xs) {
      float a = 0.0f, b = 0.0f;
      amsp::kernels::cuda::unpack_bf16(amsp::kernels::cuda::pack_bf16(lo, hi), a, b);
      EXPECT_EQ(amsp::kernels::float_to_bits(a),
                amsp::kernels::float_to_bits(amsp::kernels::round_bf16(lo)))
          << lo;
      EXPECT_EQ(amsp::kernels::float_to_bits(b),
                amsp::kernels::float_to_bits(amsp::kernels::round_bf16(hi)))
          << hi;
    }
}

__global__ void warp_then_block_kernel() {
  if (threadIdx.x < 32) {
    __syncwarp();
  } else {
    __syncthreads();
  }
  if (threadIdx.x == 0) __syncthreads();
}

TEST(Simt, WaitingAtDifferentBarriersFails) {
  EXPECT_THROW(AMSP_LAUNCH(warp_then_block_kernel, 1, 64, 0, nullptr)(), std::runtime_error);
}

__global__ void short_warp_kernel(float* x) {
  x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1);
}

TEST(Simt, MaskNamingMissingLanesFails) {
  std::vector<float> x(32);
  try {
    AMSP_LAUNCH(short_warp_kernel, 1, 20, 0, nullptr)(x.data());  // lanes 20..31 do not exist
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("short_warp_kernel"), std::string::npos) << e.what();
  }
  AMSP_LAUNCH(short_warp_kernel, 1, 32, 0, nullptr)(x.data());
}

TEST(Simt, BadConfigurationFails) {
  std::vector<float> x(32);
  EXPECT_THROW(AMSP_LAUNCH(short_warp_kernel, 0, 32, 0, nullptr)(x.data()), std::runtime_error);
  EXPECT_THROW(AMSP_LAUNCH(short_warp_kernel, 1, 2048, 0, nullptr)(x.data()), std::runtime_error);
}

// ---- cost -------------------------------------------------------------------------

__global__ void scale_kernel(const float* x, float* y, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = 2.0f * x[i];
}

__global__ void row_sum_kernel(const float* x, float* out, int dim) {
  float s = 0.0f;
  for (int j = static_cast<int>(threadIdx.x); j < dim; j += static_cast<int>(blockDim.x))
    s += x[static_cast<int64_t>(blockIdx.x) * dim + j];
  s = block_sum(s);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// CPU time of this thread: the machine running the tests is often shared, and
// wall time would measure the neighbours.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

__global__ void barriers_kernel(int rounds) {
  for (int r = 0; r < rounds; ++r) __syncthreads();
}

// Not a check: prints what emulation costs, for the documentation.
TEST(Simt, Cost) {
  const int64_t b0 = amsp::emu::simt::switch_count();
  const double tb = cpu_seconds();
  AMSP_LAUNCH(barriers_kernel, 1, 256, 0, nullptr)(2000);
  const double barrier_seconds = cpu_seconds() - tb;
  const int64_t resumes = amsp::emu::simt::switch_count() - b0;
  std::printf("SIMT emulation: %.1f M fiber resumes/s at __syncthreads (each a switch in and out)\n",
              static_cast<double>(resumes) / barrier_seconds / 1e6);

  const int n = 1 << 20, threads = 256;
  std::vector<float> x(n, 1.0f), y(n);
  const int64_t s0 = amsp::emu::simt::switch_count();
  double t0 = cpu_seconds();
  AMSP_LAUNCH(scale_kernel, n / threads, threads, 0, nullptr)(x.data(), y.data(), n);
  const double elementwise = cpu_seconds() - t0;
  EXPECT_EQ(y[n - 1], 2.0f);

  const int rows = 1024, dim = 1024;  // the same 1M elements, one block per row
  std::vector<float> sums(rows);
  const int64_t s1 = amsp::emu::simt::switch_count();
  t0 = cpu_seconds();
  AMSP_LAUNCH(row_sum_kernel, rows, threads, 0, nullptr)(x.data(), sums.data(), dim);
  const double reduction = cpu_seconds() - t0;
  const int64_t switches = amsp::emu::simt::switch_count() - s1;
  EXPECT_EQ(sums[rows - 1], static_cast<float>(dim));
  std::printf(
      "SIMT emulation cost (CPU time): 1M-element elementwise kernel (4096 blocks of 256) "
      "%.3f s, %lld fiber resumes; block reduction of 1024 rows of 1024 (blocks of 256) %.3f s, "
      "%lld resumes, %.1f M resumes/s\n",
      elementwise, static_cast<long long>(s1 - s0), reduction, static_cast<long long>(switches),
      static_cast<double>(switches) / reduction / 1e6);
}

}  // namespace
