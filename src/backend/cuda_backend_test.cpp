// The CUDA backend, on the CPU emulation of CUDA in this build: every kernel
// against the CPU reference (backend/compare.h), its checks, its transfers, its
// events and its caching allocator.
#include "backend/cuda_backend.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

#include "backend/compare.h"
#include "core/error.h"

namespace amsp::backend {
namespace {

TEST(CudaBackend, EveryKernelMatchesTheCpuBackend) {
  for (DType compute : {DType::kF32, DType::kBF16}) {
    auto cpu = make_cpu_backend(compute);
    auto cuda = make_cuda_backend(compute, 0);
    const CompareReport report = compare_backends(*cpu, *cuda);
    std::ostringstream out;
    print_report(report, out);
    EXPECT_TRUE(report.ok()) << dtype_name(compute) << "\n" << out.str();
    // The worst error of each kernel, for the test log.
    std::cout << "compute " << dtype_name(compute) << ":\n" << out.str();
    EXPECT_GT(report.rows.size(), 100u);
  }
}

TEST(CudaBackend, DescribesItsDevice) {
  auto be = make_cuda_backend(DType::kF32, 0);
  EXPECT_EQ(be->device(), Device::kCuda);
  EXPECT_EQ(be->describe().rfind("cuda:0 (", 0), 0u) << be->describe();
  EXPECT_NE(be->describe().find(", sm_"), std::string::npos) << be->describe();
}

TEST(CudaBackend, HostCodeCannotTouchDeviceMemory) {
  auto be = make_cuda_backend(DType::kF32, 0);
  Buffer b = be->alloc(DType::kF32, 8);
  EXPECT_THROW(b.f32(), Error);
  EXPECT_THROW(b.view().f32(), Error);
  std::vector<float> host(8, 1.0f);
  try {
    be->fill_zero(host_view(host.data(), 8));
    ADD_FAILURE() << "a host view was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fill_zero: x is cpu memory"), std::string::npos) << e.what();
  }
}

// Host staging memory is page-locked (cudaHostAlloc: the emulation keeps it
// as pinned, so cudaFreeHost accepts it and cudaFree would not), is host
// memory the host reads and writes, takes copies from the device, and is
// counted in memory().host while it lives, not in the device's in_use.
TEST(CudaBackend, HostStagingIsPinnedAndCounted) {
  auto be = make_cuda_backend(DType::kF32, 0);
  const int64_t device_before = be->memory().in_use;
  {
    Buffer h = be->alloc_host(6);
    EXPECT_EQ(h.view().device, Device::kCpu);
    EXPECT_EQ(be->memory().host, 6 * 4);
    EXPECT_EQ(be->memory().in_use, device_before);
    Buffer d = be->alloc(DType::kF32, 6);
    const std::vector<float> src{1, 2, 3, 4, 5, 6};
    be->from_host(src.data(), d.view());
    be->to_host(d.view(), h.f32());
    for (int i = 0; i < 6; ++i) EXPECT_EQ(h.f32()[i], src[static_cast<size_t>(i)]);
    EXPECT_EQ(be->alloc_host(0).count(), 0);
    EXPECT_EQ(be->memory().host, 6 * 4);
  }
  EXPECT_EQ(be->memory().host, 0);
}

TEST(CudaBackend, TransfersConvertAndZeroFill) {
  auto be = make_cuda_backend(DType::kF32, 0);
  Buffer b = be->alloc(DType::kBF16, 5);
  std::vector<float> got(5, -1.0f);
  be->to_host(b.view(), got.data());
  for (float x : got) EXPECT_EQ(x, 0.0f);
  const std::vector<float> in = {1.0f, 1.00390625f, -3.0f, 0.1f, 65504.0f};
  be->from_host(in.data(), b.view());
  be->to_host(b.view(), got.data());
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 1.0f);  // halfway: to even
  EXPECT_EQ(got[2], -3.0f);
  EXPECT_EQ(got[3], 0.10009765625f);
  EXPECT_EQ(got[4], 65536.0f);
}

TEST(CudaBackend, EventsOrderTheHost) {
  auto be = make_cuda_backend(DType::kF32, 0);
  const Event a = be->record(), b = be->record();
  EXPECT_LT(a.id, b.id);
  be->wait(b);
  be->wait(a);  // already known complete
  EXPECT_THROW(be->wait(Event{b.id + 10}), Error);
  for (int i = 0; i < 200; ++i) be->record();  // recycled, not accumulated
  be->synchronize();
}

// --cuda-profiler-step's capture range: one range per open, a second open
// inside it none (as cudaProfilerStart inside a range has no effect).
TEST(CudaBackend, ProfilerCaptureOpensOneRangeUntilClosed) {
  auto be = make_cuda_backend(DType::kF32, 0);
  const int64_t before = amsp::emu::profiler_ranges();
  be->profiler_capture(true);
  be->profiler_capture(true);
  EXPECT_EQ(amsp::emu::profiler_ranges(), before + 1);
  be->profiler_capture(false);
  be->profiler_capture(true);
  be->profiler_capture(false);
  EXPECT_EQ(amsp::emu::profiler_ranges(), before + 2);
}

TEST(CudaBackend, CrossEntropyNamesATargetOutsideTheVocabulary) {
  auto be = make_cuda_backend(DType::kF32, 0);
  const int64_t rows = 3, V = 4;
  Buffer logits = be->alloc(DType::kF32, rows * V), lse = be->alloc(DType::kF32, rows);
  Buffer targets = be->alloc(DType::kI32, rows);
  const std::vector<int32_t> t = {1, 7, -1};
  be->from_host(t.data(), targets.view());
  try {
    be->cross_entropy_forward(logits.view(), targets.view(), lse.view(), rows, V);
    ADD_FAILURE() << "target 7 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 7 at row 1 is outside the vocabulary of 4"), std::string::npos)
        << e.what();
  }
  const std::vector<int32_t> ok = {1, 3, -1};
  be->from_host(ok.data(), targets.view());
  const LossSum l = be->cross_entropy_forward(logits.view(), targets.view(), lse.view(), rows, V);
  EXPECT_EQ(l.count, 2);
  EXPECT_NEAR(l.sum, 2 * std::log(4.0), 1e-6);
}

// The step's scalars stay on the device and come back in one read, equal to
// what the CPU backend computes on the host: the loss summed over the rows, the
// squared norm added unit by unit, the clipping factor; a bad target is
// recorded on the device and reported as cross_entropy_forward reports it.
TEST(CudaBackend, StepScalarsMatchTheCpuBackendAndCostOneSync) {
  const int64_t rows = 3, V = 4;
  const std::vector<float> z = {0.5f, -1, 2, 0.25f, 1, 1, -3, 0, 0.1f, 0.2f, 0.3f, 0.4f};
  const std::vector<float> g = {3, 4, 0.5f, -2, 1e-3f};
  const std::vector<int32_t> t = {1, 3, -1}, pinned_t = {2, 0, 1};
  std::vector<double> got[2];
  for (int k = 0; k < 2; ++k) {
    auto be = k == 0 ? make_cpu_backend(DType::kF32) : make_cuda_backend(DType::kF32, 0);
    Buffer logits = be->alloc(DType::kF32, rows * V), lse = be->alloc(DType::kF32, rows);
    Buffer targets = be->alloc(DType::kI32, rows), x = be->alloc(DType::kF32, 5);
    Buffer acc = be->alloc(DType::kF64, 5), scale = be->alloc(DType::kF32, 1);
    Buffer host = be->alloc_host(rows);
    std::copy(pinned_t.begin(), pinned_t.end(), static_cast<int32_t*>(host.data()));
    be->from_host(t.data(), targets.view());
    be->from_host(g.data(), x.view());
    const int64_t syncs = be->host_syncs();
    for (int micro = 0; micro < 2; ++micro) {
      be->from_host(z.data(), logits.view());
      be->cross_entropy_forward_into(logits.view(), targets.view(), lse.view(), rows, V, acc.at(0, 4));
      be->from_host_async(static_cast<const int32_t*>(host.data()), targets.view());
    }
    be->sum_squares_into(x.view(), acc.at(4, 1));
    be->sum_squares_into(x.at(1, 3), acc.at(4, 1));
    be->clip_scale(acc.at(4, 1), 2.0, 1.0, scale.view());
    got[k].resize(6);
    be->to_host_f64(acc.view(), got[k].data());
    float s = 0;
    be->to_host(scale.view(), &s);
    got[k][5] = s;
    // CPU: none; CUDA: the uploads of the logits (staged) and the two reads.
    EXPECT_EQ(be->host_syncs() - syncs, k == 0 ? 0 : 2 + 2) << k;
    if (k == 1) EXPECT_THROW(be->from_host_async(t.data(), targets.view()), Error) << "not alloc_host memory";
  }
  // The loss to the last bits of the fused log-sum-exp (a tree order on the
  // device); everything else exactly.
  EXPECT_NEAR(got[1][0], got[0][0], 1e-6 * got[0][0]);
  for (size_t i = 1; i < 6; ++i) EXPECT_EQ(got[1][i], got[0][i]) << i;
  EXPECT_EQ(got[1][1], 2.0 + 3.0);  // valid targets: {1, 3, -1}, then the pinned {2, 0, 1}
  const double sumsq = 9 + 16 + 0.25 + 4 + 1e-6 + 16 + 0.25 + 4;
  EXPECT_NEAR(got[1][4], sumsq, 1e-6);
  EXPECT_EQ(static_cast<float>(got[1][5]), static_cast<float>(1.0 / (std::sqrt(got[1][4] / 2) + 1e-6)));
  // A target outside the vocabulary: recorded on the device, reported at the read.
  auto be = make_cuda_backend(DType::kF32, 0);
  Buffer logits = be->alloc(DType::kF32, rows * V), lse = be->alloc(DType::kF32, rows);
  Buffer targets = be->alloc(DType::kI32, rows), acc = be->alloc(DType::kF64, 4);
  const std::vector<int32_t> bad = {1, 7, -1};
  be->from_host(bad.data(), targets.view());
  be->cross_entropy_forward_into(logits.view(), targets.view(), lse.view(), rows, V, acc.view());
  double a[4];
  be->to_host_f64(acc.view(), a);
  try {
    check_loss_acc(a, V);
    ADD_FAILURE() << "target 7 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 7 at row 1 is outside the vocabulary of 4"), std::string::npos)
        << e.what();
  }
}

// AdamW over an OS-shard's parts: one launch for up to 16 parts, each with its
// own weight decay and dtypes, the same bits as the CPU backend's adamw per part.
TEST(CudaBackend, AdamWPartsInOneLaunchMatchTheCpuBackendPerPart) {
  const int64_t n[] = {5, 300, 1, 64};
  const float decay[] = {0.1f, 0.0f, 0.1f, 0.01f};
  AdamWStep step;
  step.lr = 1e-2f, step.bias_correction1 = 0.19f, step.bias_correction2 = 0.0975f, step.grad_scale = 0.5f;
  std::vector<float> got[4], want[4];
  for (int k = 0; k < 2; ++k) {
    auto be = k == 0 ? make_cpu_backend(DType::kBF16) : make_cuda_backend(DType::kBF16, 0);
    std::vector<Buffer> keep;
    std::vector<AdamWPart> parts;
    for (int i = 0; i < 4; ++i) {
      std::vector<float> init(static_cast<size_t>(n[i]));
      for (size_t e = 0; e < init.size(); ++e) init[e] = 0.01f * static_cast<float>((e * 7 + i * 3) % 23) - 0.1f;
      Buffer master = be->alloc(DType::kF32, n[i]), m = be->alloc(DType::kF32, n[i]);
      Buffer v = be->alloc(DType::kF32, n[i]), copy = be->alloc(DType::kBF16, n[i]);
      Buffer grad = be->alloc(i % 2 ? DType::kBF16 : DType::kF32, n[i]);
      be->from_host(init.data(), master.view());
      std::reverse(init.begin(), init.end());
      be->from_host(init.data(), grad.view());
      parts.push_back({master.view(), m.view(), v.view(), grad.view(), copy.view(), decay[i]});
      for (Buffer* b : {&master, &m, &v, &copy, &grad}) keep.push_back(std::move(*b));
    }
    const DeviceCounts before = be->device_counts();
    if (k == 0) {
      AdamWStep s = step;
      for (const AdamWPart& p : parts) {
        s.weight_decay = p.weight_decay;
        be->adamw(p.master, p.m, p.v, p.grad, p.param_copy, s);
      }
    } else {
      be->adamw_parts(parts, step);
      EXPECT_EQ(be->device_counts().launches - before.launches, 1) << "four parts, one launch";
    }
    for (int i = 0; i < 4; ++i) {
      std::vector<float> out(static_cast<size_t>(4 * n[i]));
      be->to_host(parts[static_cast<size_t>(i)].master, out.data());
      be->to_host(parts[static_cast<size_t>(i)].m, out.data() + n[i]);
      be->to_host(parts[static_cast<size_t>(i)].v, out.data() + 2 * n[i]);
      be->to_host(parts[static_cast<size_t>(i)].param_copy, out.data() + 3 * n[i]);
      (k == 0 ? want : got)[i] = out;
    }
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], want[i]) << "part " << i;
}

// Matrix products go through cuBLASLt with a plan per shape: the heuristic is
// asked once for each new shape and never again for it; a product then costs
// one launch, no host synchronisation and no allocation (the workspace was
// made with the backend), and a bf16 output with beta 1 is still one call.
TEST(CudaBackend, ProductsPlanOncePerShapeAndThenOnlyLaunch) {
  auto be = make_cuda_backend(DType::kBF16, 0);
  const int64_t M = 6, in = 8, out = 5;
  Buffer x = be->alloc(DType::kBF16, M * in), w = be->alloc(DType::kF32, out * in);
  Buffer y = be->alloc(DType::kF32, M * out), yb = be->alloc(DType::kBF16, M * out);
  Buffer dw = be->alloc(DType::kF32, out * in);
  const int64_t q0 = emu::lt_heuristic_queries();
  be->linear_forward(x.view(), w.view(), y.view(), M, in, out, 1.0f);
  EXPECT_EQ(emu::lt_heuristic_queries() - q0, 1);
  const DeviceCounts before = be->device_counts();
  const MemoryStats mem = be->memory();
  for (int i = 0; i < 3; ++i) be->linear_forward(x.view(), w.view(), y.view(), M, in, out, 1.0f);
  EXPECT_EQ(emu::lt_heuristic_queries() - q0, 1) << "the same shape, planned once";
  // Each call: w rounded to bf16 (one launch), then the product (one).
  EXPECT_EQ(be->device_counts().launches - before.launches, 3 * 2);
  EXPECT_EQ(be->device_counts().host_syncs, before.host_syncs);
  EXPECT_EQ(be->memory().in_use, mem.in_use);
  EXPECT_EQ(be->memory().reserved, mem.reserved);
  be->linear_forward(x.view(), w.view(), yb.view(), M, in, out, 1.0f);  // bf16 C: a new plan
  be->linear_backward_weight(y.view(), x.view(), dw.view(), M, in, out, 1.0f);
  EXPECT_EQ(emu::lt_heuristic_queries() - q0, 3);
}

// An empty sum (no rows) written (beta 0) is zeros and added (beta 1) leaves the
// gradient as it was, on both backends, for a product's and a norm's weight gradient.
TEST(Backends, EmptyWeightGradientsWrittenAreZeros) {
  const std::vector<float> old{1, -2, 3, -4, 5, 6};
  for (int k = 0; k < 2; ++k) {
    for (DType compute : {DType::kF32, DType::kBF16}) {
      auto be = k == 0 ? make_cpu_backend(compute) : make_cuda_backend(compute, 0);
      Buffer x = be->alloc(compute, 3), dy = be->alloc(compute, 2), inv = be->alloc(DType::kF32, 1);
      Buffer dx = be->alloc(DType::kF32, 6), w = be->alloc(DType::kF32, 6);
      for (float beta : {1.0f, 0.0f}) {
        Buffer dw = be->alloc(DType::kF32, 6), nw = be->alloc(DType::kF32, 6);
        be->from_host(old.data(), dw.view());
        be->from_host(old.data(), nw.view());
        be->linear_backward_weight(dy.view(), x.view(), dw.view(), 0, 3, 2, beta);
        be->rmsnorm_backward(dx.view(), dx.view(), w.view(), inv.view(), dx.view(), nw.view(), 0, 6,
                             View{}, beta);
        std::vector<float> got(6), norm(6);
        be->to_host(dw.view(), got.data());
        be->to_host(nw.view(), norm.data());
        const std::vector<float> want = beta == 0.0f ? std::vector<float>(6, 0.0f) : old;
        EXPECT_EQ(got, want) << "linear_backward_weight, backend " << k << ", beta " << beta;
        EXPECT_EQ(norm, want) << "rmsnorm_backward, backend " << k << ", beta " << beta;
      }
    }
  }
}

// A checkpoint's snapshot (Backend::begin_snapshot), on both backends: the
// destinations receive the sources as the compute stream left them at the call
// (after a kernel that wrote one, with no host wait between), and keep them
// when the next update overwrites a source. On CUDA the copies are issued on a
// stream of their own without the host waiting (no host synchronisation on the
// calling thread), the writer waits for them from another thread, and the
// happens-before checker accepts both orders: copy after the kernel, update
// after the copy (fence_snapshot).
TEST(Snapshot, CopiesTheSourcesAsTheyWereWithoutTheHostWaiting) {
  const std::vector<float> va{1, 2, 3, 4, 5}, vb{-1, -2, -3};
  for (int k = 0; k < 2; ++k) {
    auto be = k == 0 ? make_cpu_backend(DType::kF32) : make_cuda_backend(DType::kF32, 0);
    Buffer a = be->alloc(DType::kF32, 5), b = be->alloc(DType::kF32, 3);
    Buffer ha = be->alloc_host(5), hb = be->alloc_host(3);
    be->from_host(va.data(), a.view());
    be->from_host(vb.data(), b.view());
    be->add(a.view(), a.view());  // a kernel writes a source just before the snapshot
    const int64_t syncs = be->host_syncs();
    const DeviceCounts before = be->device_counts();
    be->begin_snapshot({{a.view(), ha.f32()}, {b.view(), hb.f32()}});
    EXPECT_EQ(be->host_syncs(), syncs) << k;
    EXPECT_EQ(be->device_counts().host_syncs, before.host_syncs) << k;
    be->fence_snapshot();
    be->fill_zero(a.view());  // the next optimizer update
    be->fill_zero(b.view());
    std::thread writer([&] { be->wait_snapshot(); });
    writer.join();
    EXPECT_EQ(std::vector<float>(ha.f32(), ha.f32() + 5), (std::vector<float>{2, 4, 6, 8, 10})) << k;
    EXPECT_EQ(std::vector<float>(hb.f32(), hb.f32() + 3), vb) << k;
    be->synchronize();
  }
}

// Without the fence the update's write meets the copy stream's read, and the
// checker names them; a destination that is not page-locked staging is refused.
TEST(Snapshot, AnUpdateNotFencedIsAHappensBeforeViolation) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto be = make_cuda_backend(DType::kF32, 0);
  Buffer a = be->alloc(DType::kF32, 4);
  Buffer h = be->alloc_host(4);
  std::vector<float> plain(4);
  try {
    be->begin_snapshot({{a.view(), plain.data()}});
    ADD_FAILURE() << "pageable memory accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("begin_snapshot: a destination is not memory from alloc_host"),
              std::string::npos) << e.what();
  }
  be->begin_snapshot({{a.view(), h.f32()}});
  EXPECT_DEATH(be->fill_zero(a.view()), "write by .* not ordered after the read by");
  be->fence_snapshot();
  be->fill_zero(a.view());
  be->wait_snapshot();
}

TEST(CachingAllocator, SplitsASegmentAndMergesFreedNeighbours) {
  CachingAllocator a("cuda:0");
  constexpr int64_t MiB = int64_t{1} << 20;
  ASSERT_TRUE(a.reserve(16 * MiB, 0));
  EXPECT_EQ(a.stats().reserved, 16 * MiB);
  char* p1 = static_cast<char*>(a.allocate(3 * MiB));
  char* p2 = static_cast<char*>(a.allocate(3 * MiB));
  char* p3 = static_cast<char*>(a.allocate(3 * MiB - 100));  // rounded to 512 bytes
  EXPECT_EQ(p2, p1 + 3 * MiB) << "split from the reserved segment, one after the other";
  EXPECT_EQ(p3, p2 + 3 * MiB);
  EXPECT_EQ(a.stats().in_use, 9 * MiB);
  a.release(p1);
  a.release(p2);
  EXPECT_EQ(a.allocate(5 * MiB), p1) << "two freed neighbours merge into one block";
  a.release(p1);
  a.release(p3);
  EXPECT_EQ(a.allocate(16 * MiB), p1) << "the whole segment again";
  EXPECT_EQ(a.stats().device_allocs, 1) << "nothing asked of the device after the reserve";
  EXPECT_EQ(a.stats().peak, 16 * MiB);
  a.release(p1);

  // Small requests come from 2 MiB segments of their own, split in 512-byte steps.
  char* s1 = static_cast<char*>(a.allocate(1000));
  char* s2 = static_cast<char*>(a.allocate(1000));
  EXPECT_EQ(s2, s1 + 1024);
  EXPECT_EQ(a.stats().device_allocs, 2);
  EXPECT_EQ(a.stats().reserved, 18 * MiB);
  a.release(s1);
  a.release(s2);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0) << "empty_cache gives back the wholly free segments";
  EXPECT_EQ(CachingAllocator::size_class(1), 512);
  EXPECT_EQ(CachingAllocator::size_class(513), 1024);
}

// Out of memory: the error names the request, the reserve and the prediction,
// and nothing cached is given back (no device synchronisation mid-step).
TEST(CachingAllocator, OutOfMemoryNamesTheRequestAndThePlanAndFreesNothing) {
  CachingAllocator a("cuda:0");
  constexpr int64_t GiB = int64_t{1} << 30;
  ASSERT_TRUE(a.reserve(0, 5 * GiB));
  a.release(a.allocate(4 << 20));
  const CachingAllocator::Stats before = a.stats();
  try {
    a.allocate(64 * GiB);  // past the emulated device's 16 GiB
    ADD_FAILURE() << "64 GiB allocated";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cuda:0: out of memory asking for 68719476736 bytes (64.00 GiB): 0.00 GiB in use, 0.00 GiB "
                     "reserved (largest free block 0.00 GiB)"), std::string::npos) << m;
    EXPECT_NE(m.find("the plan predicted a peak of 5.00 GiB per rank"), std::string::npos) << m;
  }
  EXPECT_EQ(a.stats().reserved, before.reserved);
  EXPECT_EQ(a.stats().device_allocs, before.device_allocs);
}

TEST(CudaBackend, PeaksComeFromATableByDeviceName) {
  EXPECT_EQ(gpu_peak_flops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA A10"), 125e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA L40S"), 362e12);
  EXPECT_EQ(gpu_peak_flops("Tesla V100-SXM2-16GB"), 125e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA GeForce RTX 4090"), 165e12);
  EXPECT_EQ(gpu_peak_flops("Some Future GPU"), 0);
}

}  // namespace
}  // namespace amsp::backend
