// The CUDA emulation's runtime and its happens-before checker.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/api.h"
#include "kernels/cuda/emu/hb.h"

namespace {

// Kernel-like accesses, named by the line they are written on.
#define READS(s, p, bytes) AMSP_HB_ACCESS((s), (p), (bytes), false)
#define WRITES(s, p, bytes) AMSP_HB_ACCESS((s), (p), (bytes), true)

// "<file>:<line>" of a line of this file, for the death messages.
std::string at(int line) { return std::string("runtime_test.cpp:") + std::to_string(line); }

class HbDeath : public ::testing::Test {
 protected:
  void SetUp() override {
    // The child re-runs the test from the start: no threads of the parent.
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buf_), kBytes), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&a_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&b_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), cudaSuccess);
  }
  void TearDown() override {
    cudaDeviceSynchronize();
    cudaFree(buf_);
    cudaStreamDestroy(a_);
    cudaStreamDestroy(b_);
    cudaEventDestroy(e_);
  }
  static constexpr size_t kBytes = 4096;
  float* buf_ = nullptr;
  cudaStream_t a_ = nullptr, b_ = nullptr;
  cudaEvent_t e_ = nullptr;
};

TEST_F(HbDeath, ReadOnAnotherStreamWithoutEventDiesNamingBoth) {
  const int wline = __LINE__ + 1;
  WRITES(a_, buf_, kBytes);
  const int rline = __LINE__ + 1;
  EXPECT_DEATH(READS(b_, buf_, kBytes),
               ("happens-before violation on bytes \\[0, 4096\\) of allocation #[0-9]+.*read by "
                "stream [0-9]+ at .*" +
                at(rline) + ".*write by stream [0-9]+ at .*" + at(wline))
                   .c_str());
}

TEST_F(HbDeath, WriteAfterReadOnAnotherStreamDies) {
  READS(a_, buf_, 64);
  EXPECT_DEATH(WRITES(b_, buf_ + 8, 64), "write by stream .* not ordered after the read by");
}

TEST_F(HbDeath, WriteAfterWriteOnAnotherStreamDies) {
  WRITES(a_, buf_, 64);
  EXPECT_DEATH(WRITES(b_, buf_, 4), "write by stream .* not ordered after the write by");
}

TEST_F(HbDeath, EventRecordAndStreamWaitOrderTheRead) {
  const int64_t before = amsp::emu::hb_checked();
  WRITES(a_, buf_, kBytes);
  ASSERT_EQ(cudaEventRecord(e_, a_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b_, e_, 0), cudaSuccess);
  READS(b_, buf_, kBytes);
  WRITES(b_, buf_, kBytes);  // and a write after the read on the same stream
  EXPECT_EQ(amsp::emu::hb_checked() - before, 3);
}

TEST_F(HbDeath, EventRecordedBeforeTheWriteDoesNotOrderIt) {
  ASSERT_EQ(cudaEventRecord(e_, a_), cudaSuccess);
  WRITES(a_, buf_, kBytes);
  ASSERT_EQ(cudaStreamWaitEvent(b_, e_, 0), cudaSuccess);
  EXPECT_DEATH(READS(b_, buf_, kBytes), "not ordered after the write");
}

TEST_F(HbDeath, OrderIsTransitive) {
  cudaStream_t c = nullptr;
  cudaEvent_t e2 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e2), cudaSuccess);
  WRITES(a_, buf_, kBytes);
  ASSERT_EQ(cudaEventRecord(e_, a_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b_, e_, 0), cudaSuccess);
  READS(b_, buf_ + 1, 4);
  ASSERT_EQ(cudaEventRecord(e2, b_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(c, e2, 0), cudaSuccess);
  WRITES(c, buf_, kBytes);  // after a's write (through b) and b's read
  ASSERT_EQ(cudaEventDestroy(e2), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(c), cudaSuccess);
}

TEST_F(HbDeath, HostSynchronisationOrdersLaterWork) {
  WRITES(a_, buf_, kBytes);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  READS(b_, buf_, kBytes);
  ASSERT_EQ(cudaEventRecord(e_, b_), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(e_), cudaSuccess);
  WRITES(a_, buf_, kBytes);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  WRITES(b_, buf_, kBytes);
  ASSERT_EQ(cudaEventRecord(e_, b_), cudaSuccess);
  ASSERT_EQ(cudaEventQuery(e_), cudaSuccess);  // success: the host knows it finished
  READS(a_, buf_, kBytes);
}

TEST_F(HbDeath, DisjointRangesOfOneBufferDoNotMeet) {
  WRITES(a_, buf_, 1024);
  WRITES(b_, buf_ + 256, 1024);  // bytes [1024, 2048)
  READS(b_, buf_ + 512, 2048);   // bytes [2048, 4096)
  READS(a_, buf_ + 100, 4);
  // The neighbour of a range is still checked.
  EXPECT_DEATH(READS(a_, buf_ + 255, 8), "bytes \\[1024, 1028\\)");
}

TEST_F(HbDeath, ReadsDoNotConflictWithReads) {
  WRITES(a_, buf_, kBytes);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  READS(a_, buf_, kBytes);
  READS(b_, buf_, kBytes);
  // A write must follow both reads.
  ASSERT_EQ(cudaEventRecord(e_, b_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(a_, e_, 0), cudaSuccess);
  WRITES(a_, buf_, kBytes);
}

TEST_F(HbDeath, WriteMustFollowEveryEarlierRead) {
  WRITES(a_, buf_, kBytes);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  READS(a_, buf_, kBytes);
  READS(b_, buf_, kBytes);
  ASSERT_EQ(cudaEventRecord(e_, b_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(a_, e_, 0), cudaSuccess);
  // a follows b's read but c follows neither read.
  cudaStream_t c = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_DEATH(WRITES(c, buf_, 4), "not ordered after the read by");
  WRITES(a_, buf_, kBytes);
  cudaStreamDestroy(c);
}

TEST_F(HbDeath, CopiesRecordTheirAccesses) {
  std::vector<float> host(kBytes / 4, 1.0f);
  const int cline = __LINE__ + 1;
  ASSERT_EQ(cudaMemcpyAsync(buf_, host.data(), kBytes, cudaMemcpyHostToDevice, a_), cudaSuccess);
  EXPECT_DEATH(READS(b_, buf_, 4),
               ("write by stream [0-9]+ at .*" + at(cline) + " \\(cudaMemcpyAsync\\)").c_str());
  EXPECT_DEATH(cudaMemsetAsync(buf_, 0, 8, b_), "write by .*cudaMemsetAsync.* not ordered");
  // cudaMemcpy synchronises the host with the legacy stream, which follows a.
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  WRITES(blocking, buf_, kBytes);
  ASSERT_EQ(cudaMemcpy(host.data(), buf_, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  READS(b_, buf_, kBytes);
  cudaStreamDestroy(blocking);
}

TEST_F(HbDeath, LegacyStreamSynchronisesWithBlockingStreamsOnly) {
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  WRITES(blocking, buf_, 64);
  READS(nullptr, buf_, 64);    // the legacy stream waits for blocking streams
  WRITES(blocking, buf_, 64);  // and they wait for it
  WRITES(a_, buf_ + 64, 64);   // a is non-blocking
  EXPECT_DEATH(READS(nullptr, buf_ + 64, 4), "read by the legacy default stream");
  cudaStreamDestroy(blocking);
}

TEST_F(HbDeath, FreeWithUnsynchronisedAccessDies) {
  float* p = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), 64), cudaSuccess);
  WRITES(a_, p, 64);
  EXPECT_DEATH(cudaFree(p), "cudaFree while the write by stream");
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(HbDeath, KernelOnHostMemoryOrPastTheEndDies) {
  std::vector<float> host(16);
  EXPECT_DEATH(READS(a_, host.data(), 64), "neither cudaMalloc'd nor cudaMallocHost'd");
  EXPECT_DEATH(READS(a_, buf_ + 1, kBytes), "runs past the end of its allocation");
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 64), cudaSuccess);
  READS(a_, pinned, 64);  // pinned memory is device-accessible
  ASSERT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

// The history of a buffer written whole, again and again, stays one segment;
// slices read in between split it, and the next whole write joins it again.
TEST(CudaEmuHistory, WholeWritesKeepItSmall) {
  amsp::emu::History h;
  uint64_t tick = 0;
  auto next = [&](bool write) {
    ++tick;
    return amsp::emu::Access{1, tick, write, "test", "here", 0};
  };
  for (int k = 0; k < 100; ++k) {
    const auto a = next(true);
    ASSERT_FALSE(h.access(0, 4096, a, {0, tick}));
  }
  EXPECT_EQ(h.segments(), 1u);
  for (size_t i = 0; i < 256; ++i) {
    const auto a = next(false);
    ASSERT_FALSE(h.access(i * 16, i * 16 + 16, a, {0, tick}));
  }
  EXPECT_EQ(h.segments(), 256u);
  const auto w = next(true);
  ASSERT_FALSE(h.access(0, 4096, w, {0, tick}));
  EXPECT_EQ(h.segments(), 1u);
  // Stream 2 has seen stream 1 up to the last write but one: it conflicts.
  const auto late = amsp::emu::Access{2, 1, false, "test", "there", 0};
  const auto c = h.access(100, 200, late, {0, tick - 1, 1});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->earlier.tick, tick);
  EXPECT_EQ(c->begin, 100u);
  EXPECT_EQ(c->end, 200u);
}

// Host threads issuing on their own streams at once share the checker's state.
TEST(CudaEmu, ThreadsIssueConcurrently) {
  const int64_t before = amsp::emu::hb_checked();
  auto work = [] {
    cudaStream_t s = nullptr;
    void* p = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&p, 256), cudaSuccess);
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(cudaMemsetAsync(p, i, 256, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(cudaFree(p), cudaSuccess);
    ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  EXPECT_EQ(amsp::emu::hb_checked() - before, 2000);
}

// ---- the runtime itself ---------------------------------------------------------------

// The emulation's own versions (api.h brings cuBLAS's and NCCL's too); the
// driver's moves with AMSP_EMU_DRIVER_CUDA_VERSION, which gpu-info's test sets.
TEST(CudaEmu, Versions) {
  int v = 0;
  ASSERT_EQ(cudaRuntimeGetVersion(&v), cudaSuccess);
  EXPECT_EQ(v, 13000);
  ASSERT_EQ(cudaDriverGetVersion(&v), cudaSuccess);
  EXPECT_EQ(v, 13000);
  int major = 0, minor = -1, patch = -1;
  ASSERT_EQ(cublasGetProperty(MAJOR_VERSION, &major), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasGetProperty(MINOR_VERSION, &minor), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasGetProperty(PATCH_LEVEL, &patch), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(major * 10000 + minor * 100 + patch, 130000);
  ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, 22800);
  EXPECT_EQ(cudaRuntimeGetVersion(nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

TEST(CudaEmu, DevicesAndProperties) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  EXPECT_GE(n, 1);
  EXPECT_EQ(cudaSetDevice(n), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // reading resets it
  ASSERT_EQ(cudaSetDevice(n - 1), cudaSuccess);
  int d = -1;
  ASSERT_EQ(cudaGetDevice(&d), cudaSuccess);
  EXPECT_EQ(d, n - 1);
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_STREQ(prop.name, "emulated CUDA device (CPU)");
  EXPECT_GT(prop.totalGlobalMem, 0u);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST(CudaEmu, MemGetInfoTracksAllocations) {
  size_t free0 = 0, total = 0, free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1000), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_EQ(free0 - free1, 1000u);
  void* huge = nullptr;
  EXPECT_EQ(cudaMalloc(&huge, total), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_EQ(free1, free0);
}

TEST(CudaEmu, InvalidPointersAndHandles) {
  int x = 0;
  EXPECT_EQ(cudaFree(&x), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  EXPECT_EQ(cudaFree(static_cast<char*>(p) + 4), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFreeHost(p), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(p, &x, 128, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // past the end
  ASSERT_EQ(cudaFree(p), cudaSuccess);

  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamDestroy(nullptr), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, 0x8), cudaErrorInvalidValue);

  cudaEvent_t a = nullptr, b = nullptr;
  ASSERT_EQ(cudaEventCreate(&a), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&b, cudaEventDisableTiming), cudaSuccess);
  float ms = 0;
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, a), cudaErrorInvalidResourceHandle);  // not recorded
  ASSERT_EQ(cudaEventRecord(a, nullptr), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(b, nullptr), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, a), cudaSuccess);
  EXPECT_EQ(ms, 0.0f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, b), cudaErrorInvalidResourceHandle);  // no timing
  ASSERT_EQ(cudaEventDestroy(a), cudaSuccess);
  ASSERT_EQ(cudaEventDestroy(b), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(a, nullptr), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
}

TEST(CudaEmu, CopiesAndSets) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 10 * sizeof(float)), cudaSuccess);
  uint32_t bits = 0;
  ASSERT_EQ(cudaMemcpy(&bits, d, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(bits, 0xffffffffu);  // fresh memory is NaN, not zero
  std::vector<float> in(10), out(10, 0.0f);
  for (int i = 0; i < 10; ++i) in[i] = 0.5f * i;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d, in.data(), 40, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d + 5, 0, 8, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out.data(), d, 40, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(out[i], (i == 5 || i == 6) ? 0.0f : in[i]) << i;
  EXPECT_EQ(cudaMemcpyAsync(out.data(), d, 4, static_cast<cudaMemcpyKind>(9), s),
            cudaErrorInvalidValue);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  ASSERT_EQ(cudaFree(d), cudaSuccess);
  cudaGetLastError();
}

TEST(CudaEmu, ErrorStrings) {
  EXPECT_STREQ(cudaGetErrorString(cudaSuccess), "no error");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidResourceHandle), "invalid resource handle");
  EXPECT_STREQ(cudaGetErrorString(static_cast<cudaError_t>(12345)), "unrecognized error code");
}

}  // namespace
