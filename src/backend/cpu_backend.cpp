// The CPU backend's memory, host transfers, ordering, communicators and
// peak, the elementwise operations, and the kernels that take activations
// only. The kernels whose parameters or gradients may be bf16 are in
// cpu_backend_params.cpp. cpu_backend.h states the semantics.
#include "backend/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/checks.h"
#include "backend/cpu_convert.h"
#include "backend/stream_timer.h"
#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace amsp::backend {

using namespace cpu;

namespace {

constexpr Checks check(Device::kCpu);

constexpr int64_t kAlign = 64;

// Bytes rounded up to a multiple of kAlign (std::aligned_alloc wants that), at least kAlign.
int64_t padded(int64_t bytes) { return std::max(kAlign, (bytes + kAlign - 1) / kAlign * kAlign); }

void* aligned_or_fail(int64_t bytes, const char* what) {
  void* p = std::aligned_alloc(kAlign, static_cast<size_t>(padded(bytes)));
  if (p == nullptr) fail("cpu backend: cannot allocate ", bytes, " bytes for ", what);
  return p;
}

}  // namespace

struct CpuBackend::Counters {
  std::atomic<int64_t> in_use{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> host{0};  // alloc_host's live bytes
};

CpuBackend::CpuBackend(DType compute) : Backend(compute), counters_(std::make_shared<Counters>()) {
  check.compute(compute);
}

CpuBackend::~CpuBackend() {
  for (Block& b : scratch_) std::free(b.data);
}

std::string CpuBackend::describe() const {
  const int threads = omp_get_max_threads();
  return cat("cpu (OpenBLAS ", kernels::blas_core_name(), ", ", threads,
             threads == 1 ? " thread)" : " threads)");
}

// ---- memory ----------------------------------------------------------------------

Buffer CpuBackend::alloc(DType dtype, int64_t count) {
  const int64_t bytes = check.alloc_bytes(dtype, count);
  if (count == 0) return Buffer(View{nullptr, dtype, 0, Device::kCpu}, {});
  void* p = aligned_or_fail(bytes, cat(count, " ", dtype_name(dtype), " elements").c_str());
  std::memset(p, 0, static_cast<size_t>(bytes));
  const int64_t now = counters_->in_use.fetch_add(bytes) + bytes;
  int64_t peak = counters_->peak.load();
  while (now > peak && !counters_->peak.compare_exchange_weak(peak, now)) {
  }
  std::shared_ptr<Counters> counters = counters_;
  return Buffer(View{p, dtype, count, Device::kCpu}, [counters](void* data, int64_t n) {
    std::free(data);
    counters->in_use.fetch_sub(n);
  });
}

MemoryStats CpuBackend::memory() const {
  return MemoryStats{counters_->in_use.load(), counters_->peak.load(), 0, counters_->host.load()};
}

// Host memory is all the CPU backend has: ordinary aligned memory, counted
// apart from alloc()'s (it is not model state).
Buffer CpuBackend::alloc_host(int64_t count) {
  const int64_t bytes = check.alloc_bytes(DType::kF32, count);
  if (count == 0) return Buffer(View{nullptr, DType::kF32, 0, Device::kCpu}, {});
  void* p = aligned_or_fail(bytes, cat(count, " fp32 elements of host staging").c_str());
  counters_->host.fetch_add(bytes);
  std::shared_ptr<Counters> counters = counters_;
  return Buffer(View{p, DType::kF32, count, Device::kCpu}, [counters](void* data, int64_t n) {
    std::free(data);
    counters->host.fetch_sub(n);
  });
}

void* CpuBackend::scratch(Slot slot, int64_t bytes) {
  Block& b = scratch_[slot];
  if (b.bytes < bytes) {
    std::free(b.data);
    b = Block{};
    b.data = aligned_or_fail(bytes, "the conversion workspace");
    b.bytes = padded(bytes);
  }
  return b.data;
}

int64_t CpuBackend::workspace_bytes() const {
  int64_t total = 0;
  for (const Block& b : scratch_) total += b.bytes;
  return total;
}

void CpuBackend::to_host(const View& src, float* dst) {
  check.expect_float("to_host", "src", src);
  if (src.count == 0) return;
  if (src.dtype == DType::kF32)
    std::memcpy(dst, src.data, static_cast<size_t>(src.bytes()));
  else
    widen(src.bf16(), dst, src.count);
}

void CpuBackend::to_host(const View& src, int32_t* dst) {
  check.expect("to_host", "src", src, DType::kI32);
  if (src.count > 0) std::memcpy(dst, src.data, static_cast<size_t>(src.bytes()));
}

void CpuBackend::from_host(const float* src, const View& dst) {
  check.expect_float("from_host", "dst", dst);
  if (dst.count == 0) return;
  if (dst.dtype == DType::kF32)
    std::memcpy(dst.data, src, static_cast<size_t>(dst.bytes()));
  else
    round_to_bf16(src, dst.bf16(), dst.count);
}

void CpuBackend::from_host(const int32_t* src, const View& dst) {
  check.expect("from_host", "dst", dst, DType::kI32);
  if (dst.count > 0) std::memcpy(dst.data, src, static_cast<size_t>(dst.bytes()));
}

// ---- ordering: every call has finished its work when it returns ---------------------

Event CpuBackend::record() { return Event{++last_event_}; }

void CpuBackend::wait(const Event& event) {
  check.event(event.id, last_event_);
}

void CpuBackend::synchronize() {}

std::unique_ptr<StreamTimer> CpuBackend::make_stream_timer() { return make_host_timer(); }

std::unique_ptr<comm::Communicator> CpuBackend::make_communicator(comm::Group group) {
  return comm::make_mpi_communicator(std::move(group));
}

double CpuBackend::peak_flops() {
  const int n = 1536, repeats = 4;
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  double best = 0.0;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::max(best, 2.0 * n * n * static_cast<double>(n) / s);  // r = 0 warms up
  }
  return best;
}

// ---- elementwise and reductions ----------------------------------------------------

void CpuBackend::fill_zero(const View& x) {
  check.device("fill_zero", "x", x);
  if (x.count > 0) std::memset(x.data, 0, static_cast<size_t>(x.bytes()));
}

void CpuBackend::copy(const View& src, const View& dst) {
  check.copy(src, dst);
  if (src.dtype == dst.dtype) {
    if (src.count > 0) std::memmove(dst.data, src.data, static_cast<size_t>(src.bytes()));
    return;
  }
  check.expect_float("copy", "src", src);
  check.expect_float("copy", "dst", dst);
  if (src.dtype == DType::kF32)
    round_to_bf16(src.f32(), dst.bf16(), src.count);
  else
    widen(src.bf16(), dst.f32(), src.count);
}

void CpuBackend::add(const View& dst, const View& src) {
  check.add(dst, src);
  const int64_t n = dst.count;
  if (dst.dtype == DType::kF32 && src.dtype == DType::kF32) {
    kernels::add_inplace(dst.f32(), src.f32(), n);
  } else if (dst.dtype == DType::kF32) {
    float* d = dst.f32();
    const uint16_t* s = src.bf16();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] += kernels::bf16_to_float(s[i]);
  } else if (src.dtype == DType::kF32) {
    accumulate_gradient(dst, src.f32(), n);
  } else {
    uint16_t* d = dst.bf16();
    const uint16_t* s = src.bf16();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i)
      d[i] = kernels::float_to_bf16(kernels::bf16_to_float(d[i]) + kernels::bf16_to_float(s[i]));
  }
}

namespace {

// Squares summed in double over fixed chunks, then the chunks in order: the
// order the engine's gradient norm has always used.
template <typename Load>
double chunked_sum_squares(int64_t n, Load load) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    double s = 0.0;
    for (int64_t i = lo; i < hi; ++i) {
      const double x = load(i);
      s += x * x;
    }
    partial[static_cast<size_t>(c)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace

double CpuBackend::sum_squares(const View& x) {
  check.expect_float("sum_squares", "x", x);
  if (x.dtype == DType::kF32) {
    const float* p = x.f32();
    return chunked_sum_squares(x.count, [p](int64_t i) { return static_cast<double>(p[i]); });
  }
  const uint16_t* p = x.bf16();
  return chunked_sum_squares(
      x.count, [p](int64_t i) { return static_cast<double>(kernels::bf16_to_float(p[i])); });
}

// ---- compression -----------------------------------------------------------------------

void CpuBackend::quantize(const View& src, int64_t n, int64_t records, const View& dst,
                          const kernels::quant::Spec& spec) {
  check.quant("quantize", spec, n, records, src, "src", records, dst, "dst");
  if (src.dtype == DType::kF32)
    kernels::quantize(src.f32(), n, records, spec, dst.i32());
  else
    kernels::quantize(src.bf16(), n, records, spec, dst.i32());
}

void CpuBackend::dequantize(const View& src, int64_t n, int64_t records, const View& dst,
                            const kernels::quant::Spec& spec) {
  check.quant("dequantize", spec, n, records, dst, "dst", records, src, "src");
  if (dst.dtype == DType::kF32)
    kernels::dequantize(src.i32(), n, records, spec, dst.f32());
  else
    kernels::dequantize(src.i32(), n, records, spec, dst.bf16());
}

void CpuBackend::dequantize_sum(const View& src, int64_t n, int64_t records, const View& dst,
                                const kernels::quant::Spec& spec) {
  check.quant("dequantize_sum", spec, n, records, dst, "dst", 1, src, "src");
  if (dst.dtype == DType::kF32)
    kernels::dequantize_sum(src.i32(), n, records, spec, dst.f32());
  else
    kernels::dequantize_sum(src.i32(), n, records, spec, dst.bf16());
}

// ---- RoPE ---------------------------------------------------------------------------

void CpuBackend::rope_table(const View& cos, const View& sin, int64_t max_T, int64_t head_dim,
                            double theta) {
  check.rope_table(cos, sin, max_T, head_dim);
  kernels::rope_table(cos.f32(), sin.f32(), max_T, head_dim, theta);
}

void CpuBackend::rope_forward(const View& x, const View& cos, const View& sin, int64_t B, int64_t T,
                              int64_t heads, int64_t head_dim, int64_t row_stride) {
  check.rope("rope_forward", x, cos, sin, B, T, heads, head_dim, row_stride);
  if (x.dtype == DType::kF32)
    kernels::rope_forward(x.f32(), cos.f32(), sin.f32(), B, T, heads, head_dim, row_stride);
  else
    kernels::rope_forward(x.bf16(), cos.f32(), sin.f32(), B, T, heads, head_dim, row_stride);
}

void CpuBackend::rope_backward(const View& dx, const View& cos, const View& sin, int64_t B,
                               int64_t T, int64_t heads, int64_t head_dim, int64_t row_stride) {
  check.rope("rope_backward", dx, cos, sin, B, T, heads, head_dim, row_stride);
  if (dx.dtype == DType::kF32)
    kernels::rope_backward(dx.f32(), cos.f32(), sin.f32(), B, T, heads, head_dim, row_stride);
  else
    kernels::rope_backward(dx.bf16(), cos.f32(), sin.f32(), B, T, heads, head_dim, row_stride);
}

// ---- attention ------------------------------------------------------------------------

const float* CpuBackend::attention_input(const View& x, Slot slot) {
  return compute() == DType::kBF16 ? bf16_values(x, slot) : f32_values(x, slot);
}

float* CpuBackend::attention_output(const View& x, Slot slot) {
  return x.dtype == DType::kF32 ? x.f32() : scratch_f32(slot, x.count);
}

void CpuBackend::finish_attention_output(const View& x, const float* values) {
  if (x.dtype == DType::kBF16) round_to_bf16(values, x.bf16(), x.count);
}

int64_t CpuBackend::attention_saved_count(int64_t B, int64_t T, int64_t H) const {
  return Checks::product("attention_saved_count", {B, H, T, T});
}

void CpuBackend::attention_forward(const View& qkv, const View& saved, const View& out, int64_t B,
                                   int64_t T, int64_t H, int64_t KV, int64_t D) {
  check.attention_forward(*this, qkv, saved, out, B, T, H, KV, D);
  const View o = out.at(0, B * T * H * D);
  const float* q = attention_input(qkv.at(0, B * T * (H + 2 * KV) * D), kSlotQkv);
  float* ov = attention_output(o, kSlotOut);
  const int64_t ld = (H + 2 * KV) * D;
  kernels::attention_forward(q, q + H * D, q + (H + KV) * D, ld, ld, saved.f32(), ov, B, T, H, KV,
                             D);
  finish_attention_output(o, ov);
}

void CpuBackend::attention_backward(const View& qkv, const RopeTables& rope, const View& saved,
                                    const View& /*out: not needed*/, const View& dout,
                                    const View& dqkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                                    int64_t D) {
  check.attention_backward(*this, qkv, rope, saved, nullptr, dout, dqkv, B, T, H, KV, D);
  const int64_t ld = (H + 2 * KV) * D, k_at = H * D, v_at = (H + KV) * D;
  const View g = dqkv.at(0, B * T * ld);
  const float* q = attention_input(qkv.at(0, B * T * ld), kSlotQkv);
  float* dq = attention_output(g, kSlotOut);
  kernels::attention_backward(q, q + k_at, q + v_at, ld, ld, rope.rotary(), saved.f32(),
                              attention_input(dout.at(0, B * T * H * D), kSlotDout), dq, dq + k_at,
                              dq + v_at, B, T, H, KV, D);
  finish_attention_output(g, dq);
}

// ---- SwiGLU ---------------------------------------------------------------------------

void CpuBackend::swiglu_forward(const View& gate_up, const View& out, int64_t rows, int64_t I) {
  check.swiglu_forward(gate_up, out, rows, I);
  if (gate_up.dtype == DType::kF32) {
    const float* g = gate_up.f32();
    kernels::swiglu_forward(g, g + I, 2 * I, out.f32(), rows, I);
  } else {
    const uint16_t* g = gate_up.bf16();
    kernels::swiglu_forward(g, g + I, 2 * I, out.bf16(), rows, I);
  }
}

void CpuBackend::swiglu_backward(const View& gate_up, const View& dout, const View& dgate_up,
                                 int64_t rows, int64_t I) {
  check.swiglu_backward(gate_up, dout, dgate_up, rows, I);
  if (gate_up.dtype == DType::kF32) {
    const float* g = gate_up.f32();
    float* d = dgate_up.f32();
    kernels::swiglu_backward(g, g + I, 2 * I, dout.f32(), d, d + I, rows, I);
  } else {
    const uint16_t* g = gate_up.bf16();
    uint16_t* d = dgate_up.bf16();
    kernels::swiglu_backward(g, g + I, 2 * I, dout.bf16(), d, d + I, rows, I);
  }
}

// ---- cross-entropy ----------------------------------------------------------------------

LossSum CpuBackend::cross_entropy_forward(const View& logits, const View& targets, const View& lse,
                                          int64_t rows, int64_t V) {
  check.cross_entropy("cross_entropy_forward", logits, targets, lse, rows, V);
  LossSum loss;
  loss.sum = logits.dtype == DType::kF32
                 ? kernels::cross_entropy_forward(logits.f32(), targets.i32(), lse.f32(), rows, V, &loss.count)
                 : kernels::cross_entropy_forward(logits.bf16(), targets.i32(), lse.f32(), rows, V, &loss.count);
  return loss;
}

void CpuBackend::cross_entropy_forward_into(const View& logits, const View& targets, const View& lse,
                                            int64_t rows, int64_t V, const View& acc) {
  check.expect("cross_entropy_forward_into", "acc", acc, DType::kF64);
  const LossSum loss = cross_entropy_forward(logits, targets, lse, rows, V);
  double* a = static_cast<double*>(acc.data);
  a[0] += loss.sum;
  a[1] += static_cast<double>(loss.count);
}

// ---- the step's scalars -----------------------------------------------------------------

void CpuBackend::from_host_async(const int32_t* src, const View& dst) { from_host(src, dst); }

void CpuBackend::to_host_f64(const View& src, double* dst) {
  check.expect("to_host_f64", "src", src, DType::kF64);
  if (src.count > 0) std::memcpy(dst, src.data, static_cast<size_t>(src.bytes()));
}

void CpuBackend::begin_snapshot(const std::vector<HostCopy>& copies) {
  for (const HostCopy& c : copies) {
    check.expect("begin_snapshot", "src", c.src, DType::kF32);
    if (c.src.count > 0) std::memcpy(c.dst, c.src.data, static_cast<size_t>(c.src.bytes()));
  }
}

void CpuBackend::sum_squares_into(const View& x, const View& acc) {
  check.expect("sum_squares_into", "acc", acc, DType::kF64);
  static_cast<double*>(acc.data)[0] += sum_squares(x);
}

void CpuBackend::clip_scale(const View& sumsq, double divisor, double max_norm, const View& scale) {
  check.expect("clip_scale", "sumsq", sumsq, DType::kF64);
  check.expect("clip_scale", "scale", scale, DType::kF32);
  const double norm = std::sqrt(static_cast<const double*>(sumsq.data)[0] / divisor);
  scale.f32()[0] = max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
}

void CpuBackend::cross_entropy_backward(const View& logits, const View& targets, const View& lse,
                                        int64_t rows, int64_t V, float scale) {
  check.cross_entropy("cross_entropy_backward", logits, targets, lse, rows, V);
  // The forward rejected targets >= V; a backward called without it must too.
  const int32_t* t = targets.i32();
  for (int64_t r = 0; r < rows; ++r)
    if (t[r] >= V)
      fail("cross_entropy_backward: target ", t[r], " at row ", r, " is outside the vocabulary of ",
           V);
  if (logits.dtype == DType::kF32)
    kernels::cross_entropy_backward(logits.f32(), t, lse.f32(), rows, V, scale);
  else
    kernels::cross_entropy_backward(logits.bf16(), t, lse.f32(), rows, V, scale);
}

std::unique_ptr<Backend> make_cpu_backend(DType compute) {
  return std::make_unique<CpuBackend>(compute);
}

}  // namespace amsp::backend
