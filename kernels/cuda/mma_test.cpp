// The tensor-core product of kernels/cuda/mma.h under the emulation: one warp
// loads A (16 x 16) and B (16 x 8) into fragments by the header's loads, from
// both of B's storage orders, multiplies, and stores D by the C layout; the
// result must be the exact product of the bf16 inputs added to C (each output
// is 16 products, exact in double, rounded once). a_from_c must turn two C
// tiles into the A fragment of their 16 x 16 block.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/cuda/emu/simt.h"
#include "kernels/cuda/mma.h"
#include "src/core/rng.h"

namespace amsp::kernels::cuda {
namespace {

// d = c + a b with B read as [n][k] (transposed) or [k][n]; then D is also
// stored back through a_from_c as the left half of an A block and reloaded.
__global__ void mma_kernel(const uint16_t* a, const uint16_t* b_nk, const uint16_t* b_kn,
                           const float* c, float* d_nk, float* d_kn, uint16_t* d_as_a) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  uint32_t af[4], bf[2];
  load_a(af, a, 16);
  float acc[2][4];
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 0)
      load_b_nk(bf, b_nk, 16);
    else
      load_b_kn(bf, b_kn, 8);
    for (int i = 0; i < 4; ++i) acc[pass][i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
    mma_bf16_16x8x16(acc[pass], af, bf);
    float* d = pass == 0 ? d_nk : d_kn;
    for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = acc[pass][i];
  }
  // acc[0] as columns 0-7 and acc[1] as columns 8-15 of a 16 x 16 A block.
  uint32_t packed[4];
  a_from_c(packed, acc[0], acc[1]);
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

TEST(CudaMma, Bf16TileIsTheExactProductFromEitherOrderOfB) {
  const auto a = random_bf16(16 * 16, 1), b = random_bf16(16 * 8, 2);  // b as [k][n]
  std::vector<uint16_t> b_nk(16 * 8);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) b_nk[n * 16 + k] = b[k * 8 + n];
  std::vector<float> c(16 * 8);
  for (int i = 0; i < 16 * 8; ++i) c[i] = static_cast<float>(random_normal(5, 3, i));
  std::vector<float> d_nk(16 * 8), d_kn(16 * 8);
  std::vector<uint16_t> d_as_a(16 * 16);
  AMSP_LAUNCH(mma_kernel, 1, 32, 0, nullptr)(a.data(), b_nk.data(), b.data(), c.data(),
                                             d_nk.data(), d_kn.data(), d_as_a.data());
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      double sum = 0;
      for (int k = 0; k < 16; ++k)
        sum += static_cast<double>(bf16_to_float(a[m * 16 + k])) * bf16_to_float(b[k * 8 + n]);
      const float want = static_cast<float>(c[m * 8 + n] + sum);
      EXPECT_EQ(d_nk[m * 8 + n], want) << "row " << m << " col " << n;
      EXPECT_EQ(d_kn[m * 8 + n], want) << "row " << m << " col " << n;
      EXPECT_EQ(d_as_a[m * 16 + n], float_to_bf16(want)) << "row " << m << " col " << n;
      EXPECT_EQ(d_as_a[m * 16 + 8 + n], float_to_bf16(want)) << "row " << m << " col " << n;
    }
}

}  // namespace
}  // namespace amsp::kernels::cuda
