// The tensor-core product of kernels/cuda/mma.h under the emulation: one warp
// loads A (16 x 16) and B (16 x 16: two 16 x 8 tiles along n) into fragments
// by the header's loads, from both of B's storage orders (the paired loads,
// one ldmatrix.x4 for both tiles, and load_b_kn's one tile at a time),
// multiplies, and stores D by the C layout; the result must be the exact
// product of the bf16 inputs added to C (each output is 16 products, exact in
// double, rounded once). a_from_c must turn two C tiles into the A fragment of
// their 16 x 16 block.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/cuda/emu/simt.h"
#include "kernels/cuda/mma.h"
#include "src/core/rng.h"

namespace amsp::kernels::cuda {
namespace {

// d = c + a b for both 8-column tiles of B, with B read as [n][k] (transposed,
// both tiles in one load), as [k][n] (both in one load) and as [k][n] a tile at
// a time; then the first pass's D stored back through a_from_c as an A block.
__global__ void mma_kernel(const uint16_t* a, const uint16_t* b_nk, const uint16_t* b_kn,
                           const float* c, float* d, uint16_t* d_as_a) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  uint32_t af[4], bf[2][2];
  load_a(af, a, 16);
  float acc[3][2][4];
  for (int pass = 0; pass < 3; ++pass) {
    if (pass == 0) load_b_nk_n2(bf, b_nk, 16);
    if (pass == 1) load_b_kn_n2(bf, b_kn, 16);
    if (pass == 2)
      for (int n = 0; n < 2; ++n) load_b_kn(bf[n], b_kn + 8 * n, 16);
    for (int n = 0; n < 2; ++n) {
      for (int i = 0; i < 4; ++i)
        acc[pass][n][i] = c[(g + 8 * (i / 2)) * 16 + 8 * n + 2 * t + i % 2];
      mma_bf16_16x8x16(acc[pass][n], af, bf[n]);
      for (int i = 0; i < 4; ++i)
        d[pass * 256 + (g + 8 * (i / 2)) * 16 + 8 * n + 2 * t + i % 2] = acc[pass][n][i];
    }
  }
  // The two tiles of the first pass as columns 0-7 and 8-15 of an A block.
  uint32_t packed[4];
  a_from_c(packed, acc[0][0], acc[0][1]);
  for (int r = 0; r < 4; ++r) {
    const int row = g + 8 * (r % 2), col = 8 * (r / 2) + 2 * t;
    d_as_a[row * 16 + col] = static_cast<uint16_t>(packed[r] & 0xffffu);
    d_as_a[row * 16 + col + 1] = static_cast<uint16_t>(packed[r] >> 16);
  }
}

std::vector<uint16_t> random_bf16(int n, uint64_t stream) {
  std::vector<uint16_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = float_to_bf16(static_cast<float>(random_normal(5, stream, i)));
  return v;
}

TEST(CudaMma, Bf16TilesAreTheExactProductFromEitherOrderOfB) {
  const auto a = random_bf16(16 * 16, 1), b = random_bf16(16 * 16, 2);  // b as [k][n]
  std::vector<uint16_t> b_nk(16 * 16);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) b_nk[n * 16 + k] = b[k * 16 + n];
  std::vector<float> c(16 * 16);
  for (int i = 0; i < 16 * 16; ++i) c[i] = static_cast<float>(random_normal(5, 3, i));
  std::vector<float> d(3 * 16 * 16);
  std::vector<uint16_t> d_as_a(16 * 16);
  AMSP_LAUNCH(mma_kernel, 1, 32, 0, nullptr)
  (a.data(), b_nk.data(), b.data(), c.data(), d.data(), d_as_a.data());
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      double sum = 0;
      for (int k = 0; k < 16; ++k)
        sum += static_cast<double>(bf16_to_float(a[m * 16 + k])) * bf16_to_float(b[k * 16 + n]);
      const float want = static_cast<float>(c[m * 16 + n] + sum);
      for (int pass = 0; pass < 3; ++pass)
        EXPECT_EQ(d[pass * 256 + m * 16 + n], want)
            << "pass " << pass << " row " << m << " col " << n;
      EXPECT_EQ(d_as_a[m * 16 + n], float_to_bf16(want)) << "row " << m << " col " << n;
    }
}

}  // namespace
}  // namespace amsp::kernels::cuda
