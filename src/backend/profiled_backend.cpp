#include "backend/profiled_backend.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace amsp::backend {

namespace {

// "linear_forward[M=4096,in=2048,out=5632]"
std::string linear_name(const char* op, int64_t M, int64_t in, int64_t out) {
  return cat(op, "[M=", M, ",in=", in, ",out=", out, "]");
}

// Stops the stretch when the call returns, or throws: pairs stay balanced.
class Stop {
 public:
  Stop(StreamTimer& timer, int slot) : timer_(timer), slot_(slot) {}
  ~Stop() { timer_.stop(slot_); }
  Stop(const Stop&) = delete;
  Stop& operator=(const Stop&) = delete;

 private:
  StreamTimer& timer_;
  int slot_;
};

int64_t size(const View& v) { return dtype_bytes(v.dtype); }

// RoPE rotates x in place (read and written) with a cos and a sin table of
// T x head_dim / 2 (the tables' dtype).
int64_t rope_bytes(const View& x, const View& cos, int64_t B, int64_t T, int64_t heads, int64_t head_dim) {
  return 2 * B * T * heads * head_dim * size(x) + 2 * T * (head_dim / 2) * size(cos);
}

// Bytes of the rope tables attention's backward reads: T rows of D/2 cos and
// sin values.
int64_t rope_table_bytes(const RopeTables& rope, int64_t T, int64_t D) {
  return rope.cos.empty() ? 0 : T * D * 4;
}

}  // namespace

ProfiledBackend::ProfiledBackend(std::unique_ptr<Backend> inner)
    : Backend(inner->compute()), inner_(std::move(inner)), timer_(inner_->make_stream_timer()) {}

template <typename MakeName, typename Call>
auto ProfiledBackend::timed_as(const MakeName& make_name, int64_t min_bytes, const Call& call) {
  if (!timing_ && !counting_) return call();
  const int s = slot(make_name());
  counts_[static_cast<size_t>(s)].calls += 1;
  counts_[static_cast<size_t>(s)].min_bytes += min_bytes;
  const DeviceCounts before = counting_ ? inner_->device_counts() : DeviceCounts{};
  struct Count {  // when the call returns, or throws
    ProfiledBackend& be;
    int s;
    DeviceCounts before;
    ~Count() {
      if (be.counting_) be.count(s, before);
    }
  } counted{*this, s, before};
  if (!timing_) return call();
  timer_->start();
  const Stop stop(*timer_, s);
  return call();
}

template <typename Call>
auto ProfiledBackend::timed(const char* name, int64_t min_bytes, const Call& call) {
  return timed_as([name] { return std::string(name); }, min_bytes, call);
}

int ProfiledBackend::slot(const std::string& name) {
  const auto [it, added] = slots_.try_emplace(name, static_cast<int>(names_.size()));
  if (added) {
    names_.push_back(name);
    counts_.emplace_back();
  }
  return it->second;
}

void ProfiledBackend::count(int s, const DeviceCounts& before) {
  const DeviceCounts now = inner_->device_counts();
  KernelTime& k = counts_[static_cast<size_t>(s)];
  k.counted = now.counted;
  k.launches += now.launches - before.launches;
  k.host_syncs += now.host_syncs - before.host_syncs;
  k.bytes += (now.bytes_read - before.bytes_read) + (now.bytes_written - before.bytes_written);
  k.tensor_flops += now.tensor_flops - before.tensor_flops;
  k.simt_flops += now.simt_flops - before.simt_flops;
}

std::vector<KernelTime> ProfiledBackend::take() {
  std::vector<KernelTime> by_slot(names_.size());
  by_slot.swap(counts_);
  counts_.resize(names_.size());
  const std::vector<StreamTimer::Stretch> stretches = timer_->take();
  for (const StreamTimer::Stretch& s : stretches) by_slot[static_cast<size_t>(s.slot)].ms += s.ms;
  idle_ = idle_by_pair(stretches);
  std::vector<KernelTime> out;
  for (size_t i = 0; i < by_slot.size(); ++i) {
    if (by_slot[i].calls == 0) continue;
    by_slot[i].name = names_[i];
    by_slot[i].op = names_[i].substr(0, names_[i].find('['));
    out.push_back(std::move(by_slot[i]));
  }
  return out;
}

std::vector<IdleTime> ProfiledBackend::idle_by_pair(
    const std::vector<StreamTimer::Stretch>& stretches) const {
  const auto name = [this](int slot) { return names_[static_cast<size_t>(slot)]; };
  std::vector<IdleTime> out;
  std::map<std::pair<int, int>, size_t> at;  // (after, before) slots -> index in out
  for (size_t i = 1; i < stretches.size(); ++i) {
    const StreamTimer::Stretch& s = stretches[i];
    if (s.idle_ms < 0) continue;  // a new chain
    const int after = stretches[i - 1].slot;
    const auto [it, added] = at.try_emplace({after, s.slot}, out.size());
    if (added) out.push_back({name(after), name(s.slot)});
    out[it->second].add({"", "", 1, s.idle_ms, s.idle_ms});
  }
  return out;
}

// ---- memory and transfers ---------------------------------------------------------

Buffer ProfiledBackend::alloc(DType dtype, int64_t count) {
  return timed("alloc", 0, [&] { return inner_->alloc(dtype, count); });
}

void ProfiledBackend::to_host(const View& src, float* dst) {
  timed("to_host", src.bytes(), [&] { inner_->to_host(src, dst); });
}

void ProfiledBackend::to_host(const View& src, int32_t* dst) {
  timed("to_host", src.bytes(), [&] { inner_->to_host(src, dst); });
}

void ProfiledBackend::from_host(const float* src, const View& dst) {
  timed("from_host", dst.bytes(), [&] { inner_->from_host(src, dst); });
}

void ProfiledBackend::from_host(const int32_t* src, const View& dst) {
  timed("from_host", dst.bytes(), [&] { inner_->from_host(src, dst); });
}

// ---- elementwise and reductions ---------------------------------------------------

void ProfiledBackend::fill_zero(const View& x) {
  timed("fill_zero", x.bytes(), [&] { inner_->fill_zero(x); });
}

void ProfiledBackend::copy(const View& src, const View& dst) {
  const auto name = [&] {
    return src.dtype == dst.dtype ? std::string("copy")
                                  : cat("copy[", dtype_name(src.dtype), "->", dtype_name(dst.dtype), "]");
  };
  timed_as(name, src.bytes() + dst.bytes(), [&] { inner_->copy(src, dst); });
}

void ProfiledBackend::add(const View& dst, const View& src) {
  timed("add", src.bytes() + 2 * dst.bytes(), [&] { inner_->add(dst, src); });
}

double ProfiledBackend::sum_squares(const View& x) {
  return timed("sum_squares", x.bytes(), [&] { return inner_->sum_squares(x); });
}

// ---- compression: the values read or written once, the records likewise -----------

void ProfiledBackend::quantize(const View& src, int64_t n, int64_t records, const View& dst,
                               const kernels::quant::Spec& spec) {
  timed("quantize", records * (n * size(src) + kernels::quant::record_bytes(n, spec)),
        [&] { inner_->quantize(src, n, records, dst, spec); });
}

void ProfiledBackend::dequantize(const View& src, int64_t n, int64_t records, const View& dst,
                                 const kernels::quant::Spec& spec) {
  timed("dequantize", records * (n * size(dst) + kernels::quant::record_bytes(n, spec)),
        [&] { inner_->dequantize(src, n, records, dst, spec); });
}

void ProfiledBackend::dequantize_sum(const View& src, int64_t n, int64_t records, const View& dst,
                                     const kernels::quant::Spec& spec) {
  timed("dequantize_sum", n * size(dst) + records * kernels::quant::record_bytes(n, spec),
        [&] { inner_->dequantize_sum(src, n, records, dst, spec); });
}

// ---- the model's kernels ----------------------------------------------------------

void ProfiledBackend::embedding_forward(const View& tokens, const View& table, const View& out,
                                        int64_t rows, int64_t dim) {
  timed("embedding_forward", rows * 4 + rows * dim * (size(table) + size(out)), [&] { inner_->embedding_forward(tokens, table, out, rows, dim); });
}

void ProfiledBackend::embedding_backward(const View& tokens, const View& dout, const View& dtable,
                                         int64_t rows, int64_t dim) {
  timed("embedding_backward", rows * 4 + rows * dim * (size(dout) + 2 * size(dtable)), [&] { inner_->embedding_backward(tokens, dout, dtable, rows, dim); });
}

void ProfiledBackend::linear_forward(const View& x, const View& w, const View& y, int64_t M, int64_t in,
                                     int64_t out, float beta) {
  timed_as([&] { return linear_name("linear_forward", M, in, out); },
           M * in * size(x) + out * in * size(w) + M * out * size(y) * (beta != 0.0f ? 2 : 1),
           [&] { inner_->linear_forward(x, w, y, M, in, out, beta); });
}

// Named as linear_forward: the same product, its residual read from r.
void ProfiledBackend::linear_forward_residual(const View& x, const View& w, const View& r,
                                              const View& y, int64_t M, int64_t in, int64_t out) {
  timed_as([&] { return linear_name("linear_forward", M, in, out); },
           M * in * size(x) + out * in * size(w) + M * out * (size(r) + size(y)),
           [&] { inner_->linear_forward_residual(x, w, r, y, M, in, out); });
}

void ProfiledBackend::linear_backward_input(const View& dy, const View& w, const View& dx, int64_t M,
                                            int64_t in, int64_t out, float beta) {
  timed_as([&] { return linear_name("linear_backward_input", M, in, out); },
           M * out * size(dy) + out * in * size(w) + M * in * size(dx) * (beta != 0.0f ? 2 : 1),
           [&] { inner_->linear_backward_input(dy, w, dx, M, in, out, beta); });
}

void ProfiledBackend::linear_backward_weight(const View& dy, const View& x, const View& dw,
                                             int64_t M, int64_t in, int64_t out, float beta) {
  timed_as([&] { return linear_name("linear_backward_weight", M, in, out); },
           M * out * size(dy) + M * in * size(x) + out * in * size(dw) * (beta != 0.0f ? 2 : 1),
           [&] { inner_->linear_backward_weight(dy, x, dw, M, in, out, beta); });
}

void ProfiledBackend::rmsnorm_forward(const View& x, const View& w, const View& y, const View& inv_rms,
                                      int64_t rows, int64_t dim, float eps) {
  timed("rmsnorm_forward", rows * dim * (size(x) + size(y)) + dim * size(w) + rows * 4, [&] { inner_->rmsnorm_forward(x, w, y, inv_rms, rows, dim, eps); });
}

void ProfiledBackend::rmsnorm_apply(const View& x, const View& w, const View& inv_rms, const View& y,
                                    int64_t rows, int64_t dim) {
  timed("rmsnorm_apply", rows * dim * (size(x) + size(y)) + dim * size(w) + rows * 4, [&] { inner_->rmsnorm_apply(x, w, inv_rms, y, rows, dim); });
}

void ProfiledBackend::rmsnorm_backward(const View& dy, const View& x, const View& w,
                                       const View& inv_rms, const View& dx, const View& dw,
                                       int64_t rows, int64_t dim, const View& dx_bf16,
                                       float dw_beta) {
  const int64_t rounded = dx_bf16.empty() ? 0 : rows * dim * 2;
  timed("rmsnorm_backward",
        rows * dim * (size(dy) + size(x) + 2 * size(dx)) + rounded +
            dim * (size(w) + size(dw) * (dw_beta != 0.0f ? 2 : 1)) + rows * 4,
        [&] { inner_->rmsnorm_backward(dy, x, w, inv_rms, dx, dw, rows, dim, dx_bf16, dw_beta); });
}

void ProfiledBackend::rope_table(const View& cos, const View& sin, int64_t max_T, int64_t head_dim,
                                 double theta) {
  timed("rope_table", cos.bytes() + sin.bytes(), [&] { inner_->rope_table(cos, sin, max_T, head_dim, theta); });
}

void ProfiledBackend::rope_forward(const View& x, const View& cos, const View& sin, int64_t B, int64_t T,
                                   int64_t heads, int64_t head_dim, int64_t row_stride) {
  timed("rope_forward", rope_bytes(x, cos, B, T, heads, head_dim), [&] { inner_->rope_forward(x, cos, sin, B, T, heads, head_dim, row_stride); });
}

void ProfiledBackend::rope_backward(const View& dx, const View& cos, const View& sin, int64_t B, int64_t T,
                                    int64_t heads, int64_t head_dim, int64_t row_stride) {
  timed("rope_backward", rope_bytes(dx, cos, B, T, heads, head_dim), [&] { inner_->rope_backward(dx, cos, sin, B, T, heads, head_dim, row_stride); });
}

void ProfiledBackend::attention_forward(const View& qkv, const View& saved, const View& out,
                                        int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  timed("attention_forward", B * T * ((2 * H + 2 * KV) * D * size(qkv) + H * 4),
        [&] { inner_->attention_forward(qkv, saved, out, B, T, H, KV, D); });
}

void ProfiledBackend::attention_backward(const View& qkv, const RopeTables& rope, const View& saved,
                                         const View& out, const View& dout, const View& dqkv,
                                         int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  timed("attention_backward",
        B * T * ((4 * H + 4 * KV) * D * size(qkv) + H * 4) + rope_table_bytes(rope, T, D),
        [&] { inner_->attention_backward(qkv, rope, saved, out, dout, dqkv, B, T, H, KV, D); });
}

void ProfiledBackend::swiglu_forward(const View& gate_up, const View& out, int64_t rows, int64_t I) {
  timed("swiglu_forward", rows * 3 * I * size(gate_up),
        [&] { inner_->swiglu_forward(gate_up, out, rows, I); });
}

void ProfiledBackend::swiglu_backward(const View& gate_up, const View& dout, const View& dgate_up,
                                      int64_t rows, int64_t I) {
  timed("swiglu_backward", rows * 5 * I * size(gate_up),
        [&] { inner_->swiglu_backward(gate_up, dout, dgate_up, rows, I); });
}

LossSum ProfiledBackend::cross_entropy_forward(const View& logits, const View& targets, const View& lse,
                                               int64_t rows, int64_t V) {
  return timed("cross_entropy_forward", rows * (V * size(logits) + 8), [&] { return inner_->cross_entropy_forward(logits, targets, lse, rows, V); });
}

void ProfiledBackend::cross_entropy_forward_into(const View& logits, const View& targets, const View& lse,
                                                 int64_t rows, int64_t V, const View& acc) {
  timed("cross_entropy_forward", rows * (V * size(logits) + 8), [&] { inner_->cross_entropy_forward_into(logits, targets, lse, rows, V, acc); });
}

// ---- the step's scalars ------------------------------------------------------------

void ProfiledBackend::from_host_async(const int32_t* src, const View& dst) {
  timed("from_host", dst.bytes(), [&] { inner_->from_host_async(src, dst); });
}

void ProfiledBackend::to_host_f64(const View& src, double* dst) {
  timed("to_host", src.bytes(), [&] { inner_->to_host_f64(src, dst); });
}

void ProfiledBackend::sum_squares_into(const View& x, const View& acc) {
  timed("sum_squares", x.bytes(), [&] { inner_->sum_squares_into(x, acc); });
}

void ProfiledBackend::clip_scale(const View& sumsq, double divisor, double max_norm, const View& scale) {
  timed("clip_scale", sumsq.bytes() + scale.bytes(), [&] { inner_->clip_scale(sumsq, divisor, max_norm, scale); });
}

void ProfiledBackend::cross_entropy_backward(const View& logits, const View& targets, const View& lse,
                                             int64_t rows, int64_t V, float scale) {
  timed("cross_entropy_backward", rows * (2 * V * size(logits) + 8), [&] { inner_->cross_entropy_backward(logits, targets, lse, rows, V, scale); });
}

void ProfiledBackend::adamw(const View& master, const View& m, const View& v, const View& grad,
                            const View& param_copy, const AdamWStep& step) {
  timed("adamw", 2 * (master.bytes() + m.bytes() + v.bytes()) + grad.bytes() + param_copy.bytes(), [&] { inner_->adamw(master, m, v, grad, param_copy, step); });
}

void ProfiledBackend::adamw_parts(const std::vector<AdamWPart>& parts, const AdamWStep& step) {
  int64_t bytes = 0;
  for (const AdamWPart& p : parts)
    bytes += 2 * (p.master.bytes() + p.m.bytes() + p.v.bytes()) + p.grad.bytes() + p.param_copy.bytes();
  timed("adamw", bytes, [&] { inner_->adamw_parts(parts, step); });
}

}  // namespace amsp::backend
