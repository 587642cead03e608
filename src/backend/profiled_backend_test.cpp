// The kernel profile's backend: it times calls by name only while timing is on,
// gives the results of the backend it wraps, and keeps every stretch when a
// step makes more calls than the CUDA timer's event pool holds.
#include "backend/profiled_backend.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace amsp::backend {
namespace {

// "cpu" or "cuda" (the emulation in this build).
std::unique_ptr<Backend> make(const std::string& device) {
  return device == "cpu" ? make_cpu_backend(DType::kF32) : make_cuda_backend(DType::kF32, 0);
}

class ProfiledBackendTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ProfiledBackendTest, TimesCallsByNameWhileOn) {
  ProfiledBackend be(make(GetParam()));
  const int64_t M = 3, in = 4, out = 5;
  std::vector<float> host(static_cast<size_t>(M * in), 0.5f);
  Buffer x = be.alloc(DType::kF32, M * in), w = be.alloc(DType::kF32, out * in),
         y = be.alloc(DType::kF32, M * out), y16 = be.alloc(DType::kBF16, M * out);
  be.from_host(host.data(), x.view());
  EXPECT_TRUE(be.take().empty()) << "timing is off until set_timing(true)";

  be.set_timing(true);
  for (int i = 0; i < 2; ++i) be.linear_forward(x.view(), w.view(), y.view(), M, in, out, 0.0f);
  be.copy(y.view(), y16.view());
  be.copy(y.view(), y.view());
  const double ss = be.sum_squares(x.view());
  be.set_timing(false);
  be.fill_zero(y.view());

  EXPECT_DOUBLE_EQ(ss, 0.25 * M * in);
  const std::vector<KernelTime> times = be.take();
  ASSERT_EQ(times.size(), 4u);
  const char* names[] = {"linear_forward[M=3,in=4,out=5]", "copy[fp32->bf16]", "copy", "sum_squares"};
  const char* ops[] = {"linear_forward", "copy", "copy", "sum_squares"};
  const int64_t calls[] = {2, 1, 1, 1};
  for (size_t i = 0; i < times.size(); ++i) {
    EXPECT_EQ(times[i].name, names[i]);
    EXPECT_EQ(times[i].op, ops[i]);
    EXPECT_EQ(times[i].calls, calls[i]) << names[i];
    EXPECT_GE(times[i].ms, 0.0) << names[i];
  }
  EXPECT_TRUE(be.take().empty()) << "take() starts over";
}

// More calls than the CUDA timer holds pending (4096) between two takes.
TEST_P(ProfiledBackendTest, KeepsEveryCallOfALongStep) {
  ProfiledBackend be(make(GetParam()));
  Buffer x = be.alloc(DType::kF32, 16);
  be.set_timing(true);
  for (int i = 0; i < 5000; ++i) be.fill_zero(x.view());
  const std::vector<KernelTime> times = be.take();
  ASSERT_EQ(times.size(), 1u);
  EXPECT_EQ(times[0].calls, 5000);
  ASSERT_EQ(be.idle().size(), 1u);
  EXPECT_EQ(be.idle()[0].gaps, 4999)
      << "a gap before every call but the first, also across the timer's reads";
}

// The time between timed calls, by the pair of names around it: a host pause
// between two calls is idle time on either device (the CUDA stream is empty
// while the host sleeps), and a take ends the chain.
TEST_P(ProfiledBackendTest, IdleBetweenCallsByPairOfNames) {
  ProfiledBackend be(make(GetParam()));
  Buffer x = be.alloc(DType::kF32, 16), y = be.alloc(DType::kF32, 16);
  be.set_timing(true);
  be.fill_zero(x.view());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  be.copy(x.view(), y.view());
  be.fill_zero(x.view());
  be.copy(x.view(), y.view());
  EXPECT_EQ(be.take().size(), 2u);
  const std::vector<IdleTime> idle = be.idle();
  ASSERT_EQ(idle.size(), 2u);
  EXPECT_EQ(idle[0].after, "fill_zero");
  EXPECT_EQ(idle[0].before, "copy");
  EXPECT_EQ(idle[0].gaps, 2);
  EXPECT_GE(idle[0].max_ms, 19.9) << "the pause";
  EXPECT_GE(idle[0].ms, idle[0].max_ms);
  EXPECT_EQ(idle[1].after, "copy");
  EXPECT_EQ(idle[1].before, "fill_zero");
  EXPECT_EQ(idle[1].gaps, 1);
  EXPECT_GE(idle[1].ms, 0.0);
  EXPECT_LT(idle[1].ms, idle[0].ms);

  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  be.copy(x.view(), y.view());
  be.take();
  EXPECT_TRUE(be.idle().empty()) << "a take ends the chain: the next call has no gap before it";
}

// The device's own timer: a take ends a chain, so the first stretch after it
// has no idle time before it (the time between two steps is not a gap).
TEST_P(ProfiledBackendTest, TimerEndsItsChainAtATake) {
  const std::unique_ptr<Backend> be = make(GetParam());
  const std::unique_ptr<StreamTimer> timer = be->make_stream_timer();
  for (int slot = 0; slot < 2; ++slot) {
    timer->start();
    timer->stop(slot);
  }
  const std::vector<StreamTimer::Stretch> first = timer->take();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].idle_ms, -1.0);
  EXPECT_GE(first[1].idle_ms, 0.0);
  timer->start();
  timer->stop(2);
  const std::vector<StreamTimer::Stretch> second = timer->take();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].slot, 2);
  EXPECT_EQ(second[0].idle_ms, -1.0) << "the first stretch after a take";
}

// Counting: per name, what the device did and the call's least traffic. On
// the emulated device, a bf16 linear_forward over fp32 activations converts x
// and w to bf16, multiplies on tensor cores into y and rounds y: four stream
// operations and more bytes than x, w and y once each. The CPU counts nothing.
TEST_P(ProfiledBackendTest, CountsWhatTheDeviceDidBesideTheLeast) {
  const bool cuda = GetParam() == "cuda";
  ProfiledBackend be(cuda ? make_cuda_backend(DType::kBF16, 0) : make_cpu_backend(DType::kBF16));
  const int64_t M = 4, in = 8, out = 6;
  Buffer x = be.alloc(DType::kF32, M * in), w = be.alloc(DType::kF32, out * in), y = be.alloc(DType::kF32, M * out);
  be.set_counting(true);
  be.linear_forward(x.view(), w.view(), y.view(), M, in, out, 0.0f);
  be.fill_zero(y.view());
  be.set_counting(false);
  be.fill_zero(x.view());
  const std::vector<KernelTime> got = be.take();
  ASSERT_EQ(got.size(), 2u) << "nothing is kept while neither timing nor counting";
  const KernelTime& lin = got[0];
  EXPECT_EQ(lin.name, "linear_forward[M=4,in=8,out=6]");
  EXPECT_EQ(lin.min_bytes, (M * in + out * in + M * out) * 4);
  EXPECT_EQ(got[1].min_bytes, M * out * 4);
  EXPECT_EQ(lin.ms, 0.0) << "counting does not time";
  EXPECT_EQ(lin.counted, cuda);
  if (!cuda) {
    EXPECT_EQ(lin.launches, 0);
    EXPECT_EQ(lin.bytes, 0);
    return;
  }
  EXPECT_EQ(lin.launches, 3);
  EXPECT_EQ(lin.tensor_flops, 2.0 * M * in * out);
  EXPECT_EQ(lin.simt_flops, 0.0);
  // x and w read and written as bf16 copies, the copies read, y written in
  // fp32 by the product (beta 0: not read).
  EXPECT_EQ(lin.bytes, (M * in + out * in) * (4 + 2 + 2) + M * out * 4);
  EXPECT_EQ(got[1].launches, 1);
  EXPECT_EQ(got[1].bytes, M * out * 4);
}

INSTANTIATE_TEST_SUITE_P(Devices, ProfiledBackendTest, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace amsp::backend
