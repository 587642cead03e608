// The emulated device's counts (runtime.h, device_counts), which the roofline
// benchmark and the kernel profile read: every stream operation once, each
// access's bytes once, cuBLAS's FLOPs by the unit its types run on, host
// synchronisations; and a dry run counts the same while running nothing, in
// a thread that asks for it or in every thread of a program started with
// AMSP_EMU_DRY_RUN.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include "kernels/cuda/simt.h"

namespace {

using amsp::emu::DeviceCounts;

DeviceCounts since(const DeviceCounts& before) {
  const DeviceCounts now = amsp::emu::device_counts();
  return {now.launches - before.launches, now.host_syncs - before.host_syncs,
          now.bytes_read - before.bytes_read, now.bytes_written - before.bytes_written,
          now.tensor_flops - before.tensor_flops, now.simt_flops - before.simt_flops};
}

__global__ void scale_kernel(const float* x, float* y, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = 2.0f * x[i];
}

// y = 2 x, declared as a backend declares a kernel's accesses.
void scale(const float* x, float* y, int n, cudaStream_t s) {
  AMSP_HB_ACCESS(s, x, n * sizeof(float), false);
  AMSP_HB_ACCESS(s, y, n * sizeof(float), true);
  AMSP_DEVICE_FLOPS(n, false);
  AMSP_LAUNCH(scale_kernel, (n + 127) / 128, 128, 0, s)(x, y, n);
}

class CudaEmuCounts : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreate(&s_), cudaSuccess);
    ASSERT_EQ(cublasCreate(&h_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasSetStream(h_, s_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    amsp::emu::set_dry_run(false);
    cudaStreamSynchronize(s_);
    for (void* p : blocks_) cudaFree(p);
    cublasDestroy(h_);
    cudaStreamDestroy(s_);
  }
  template <class T>
  T* device(size_t n, const std::vector<T>& init = {}) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    if (!init.empty()) cudaMemcpy(p, init.data(), n * sizeof(T), cudaMemcpyHostToDevice);
    blocks_.push_back(p);
    return static_cast<T*>(p);
  }
  cudaStream_t s_ = nullptr;
  cublasHandle_t h_ = nullptr;
  std::vector<void*> blocks_;
};

TEST_F(CudaEmuCounts, KernelsCopiesAndSetsCountOnceWithTheirBytes) {
  const int n = 300;
  float* x = device<float>(n, std::vector<float>(n, 1.0f));
  float* y = device<float>(n);
  std::vector<float> host(n);
  const DeviceCounts before = amsp::emu::device_counts();
  scale(x, y, n, s_);
  cudaMemsetAsync(x, 0, n * sizeof(float), s_);
  cudaMemcpyAsync(host.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost, s_);
  cudaStreamSynchronize(s_);
  const DeviceCounts c = since(before);
  EXPECT_EQ(c.launches, 3) << "the kernel, the set and the copy";
  EXPECT_EQ(c.host_syncs, 1);
  EXPECT_EQ(c.bytes_read, 2 * n * 4) << "the kernel's x and the copy's y; host memory is not device memory";
  EXPECT_EQ(c.bytes_written, 2 * n * 4) << "the kernel's y and the set's x";
  EXPECT_EQ(c.simt_flops, n);
  EXPECT_EQ(c.tensor_flops, 0);
  EXPECT_EQ(host[0], 2.0f);
}

TEST_F(CudaEmuCounts, AGatherCountsItsRowsNotTheTable) {
  float* table = device<float>(1000);
  cudaMemsetAsync(table, 0, 1000 * sizeof(float), s_);
  const DeviceCounts before = amsp::emu::device_counts();
  amsp::emu::hb_access_sparse(s_, table, 1000 * sizeof(float), 40, false, __FILE__, __LINE__);
  EXPECT_EQ(since(before).bytes_read, 40);
}

TEST_F(CudaEmuCounts, CublasCountsTwoMnkByUnit) {
  const int m = 8, n = 6, k = 5;
  float* a = device<float>(m * k);
  float* b = device<float>(k * n);
  float* c = device<float>(m * n);
  uint16_t* a16 = device<uint16_t>(m * k);
  uint16_t* b16 = device<uint16_t>(k * n);
  cudaMemsetAsync(a, 0, m * k * 4, s_);
  cudaMemsetAsync(b, 0, k * n * 4, s_);
  cudaMemsetAsync(a16, 0, m * k * 2, s_);
  cudaMemsetAsync(b16, 0, k * n * 2, s_);
  const float one = 1, zero = 0;
  DeviceCounts before = amsp::emu::device_counts();
  ASSERT_EQ(cublasSgemm(h_, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a, m, b, k, &zero, c, m),
            CUBLAS_STATUS_SUCCESS);
  DeviceCounts got = since(before);
  EXPECT_EQ(got.launches, 1);
  EXPECT_EQ(got.simt_flops, 2.0 * m * n * k);
  EXPECT_EQ(got.tensor_flops, 0);
  EXPECT_EQ(got.bytes_read, (m * k + k * n) * 4) << "beta = 0: C is not read";
  EXPECT_EQ(got.bytes_written, m * n * 4);

  before = amsp::emu::device_counts();
  ASSERT_EQ(cublasGemmEx(h_, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a16, CUDA_R_16BF, m, b16, CUDA_R_16BF, k,
                         &one, c, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  got = since(before);
  EXPECT_EQ(got.launches, 1);
  EXPECT_EQ(got.tensor_flops, 2.0 * m * n * k) << "bf16 operands run on tensor cores";
  EXPECT_EQ(got.simt_flops, 0);
  EXPECT_EQ(got.bytes_read, (m * k + k * n) * 2 + m * n * 4) << "beta = 1 reads C";
}

TEST_F(CudaEmuCounts, ADryRunCountsTheSameAndRunsNothing) {
  const int n = 256, m = 4;
  float* x = device<float>(n, std::vector<float>(n, 1.0f));
  float* y = device<float>(n, std::vector<float>(n, 5.0f));
  float* c = device<float>(m * m, std::vector<float>(m * m, 7.0f));
  const float one = 1, zero = 0;
  auto work = [&] {
    scale(x, y, n, s_);
    cublasSgemm(h_, CUBLAS_OP_N, CUBLAS_OP_T, m, m, 1, &one, x, m, x, m, &zero, c, m);
  };
  amsp::emu::set_dry_run(true);
  DeviceCounts before = amsp::emu::device_counts();
  work();
  const DeviceCounts dry = since(before);
  amsp::emu::set_dry_run(false);
  float yh = 0, ch = 0;
  cudaMemcpy(&yh, y, 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(&ch, c, 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(yh, 5.0f) << "a dry run launches no kernel";
  EXPECT_EQ(ch, 7.0f) << "nor computes a product";

  before = amsp::emu::device_counts();
  work();
  const DeviceCounts wet = since(before);
  cudaMemcpy(&yh, y, 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(yh, 2.0f);
  EXPECT_EQ(dry.launches, wet.launches);
  EXPECT_EQ(dry.bytes_read, wet.bytes_read);
  EXPECT_EQ(dry.bytes_written, wet.bytes_written);
  EXPECT_EQ(dry.simt_flops, wet.simt_flops);
}

TEST_F(CudaEmuCounts, TheEnvironmentMakesNewThreadsDry) {
  const int n = 64;
  float* x = device<float>(n, std::vector<float>(n, 1.0f));
  float* y = device<float>(n, std::vector<float>(n, 5.0f));
  auto scale_in_a_new_thread = [&] {
    bool dry = false;
    std::thread([&] {
      dry = amsp::emu::dry_run();
      scale(x, y, n, s_);
      cudaStreamSynchronize(s_);
    }).join();
    float yh = 0;
    cudaMemcpy(&yh, y, 4, cudaMemcpyDeviceToHost);
    return std::make_pair(dry, yh);
  };
  setenv("AMSP_EMU_DRY_RUN", "1", 1);
  const auto [dry, unchanged] = scale_in_a_new_thread();
  unsetenv("AMSP_EMU_DRY_RUN");
  EXPECT_TRUE(dry);
  EXPECT_EQ(unchanged, 5.0f) << "a thread started under AMSP_EMU_DRY_RUN launches no kernel";
  EXPECT_FALSE(amsp::emu::dry_run()) << "a thread that used the emulation before keeps its setting";
  const auto [wet, scaled] = scale_in_a_new_thread();
  EXPECT_FALSE(wet);
  EXPECT_EQ(scaled, 2.0f);
}

}  // namespace
