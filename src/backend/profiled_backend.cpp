#include "backend/profiled_backend.h"

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

}  // namespace

ProfiledBackend::ProfiledBackend(std::unique_ptr<Backend> inner)
    : Backend(inner->compute()), inner_(std::move(inner)), timer_(inner_->make_stream_timer()) {}

template <typename MakeName, typename Call>
auto ProfiledBackend::timed_as(const MakeName& make_name, const Call& call) {
  if (!timing_) return call();
  const int s = slot(make_name());
  timer_->start();
  const Stop stop(*timer_, s);
  return call();
}

template <typename Call>
auto ProfiledBackend::timed(const char* name, const Call& call) {
  return timed_as([name] { return std::string(name); }, call);
}

int ProfiledBackend::slot(const std::string& name) {
  const auto [it, added] = slots_.try_emplace(name, static_cast<int>(names_.size()));
  if (added) names_.push_back(name);
  return it->second;
}

std::vector<KernelTime> ProfiledBackend::take() {
  std::vector<KernelTime> by_slot(names_.size());
  for (const StreamTimer::Stretch& s : timer_->take()) {
    KernelTime& k = by_slot[static_cast<size_t>(s.slot)];
    k.calls += 1;
    k.ms += s.ms;
  }
  std::vector<KernelTime> out;
  for (size_t i = 0; i < by_slot.size(); ++i) {
    if (by_slot[i].calls == 0) continue;
    by_slot[i].name = names_[i];
    by_slot[i].op = names_[i].substr(0, names_[i].find('['));
    out.push_back(std::move(by_slot[i]));
  }
  return out;
}

// ---- memory and transfers ---------------------------------------------------------

Buffer ProfiledBackend::alloc(DType dtype, int64_t count) {
  return timed("alloc", [&] { return inner_->alloc(dtype, count); });
}

void ProfiledBackend::to_host(const View& src, float* dst) {
  timed("to_host", [&] { inner_->to_host(src, dst); });
}

void ProfiledBackend::from_host(const float* src, const View& dst) {
  timed("from_host", [&] { inner_->from_host(src, dst); });
}

void ProfiledBackend::from_host(const int32_t* src, const View& dst) {
  timed("from_host", [&] { inner_->from_host(src, dst); });
}

// ---- elementwise and reductions ---------------------------------------------------

void ProfiledBackend::fill_zero(const View& x) {
  timed("fill_zero", [&] { inner_->fill_zero(x); });
}

void ProfiledBackend::copy(const View& src, const View& dst) {
  const auto name = [&] {
    return src.dtype == dst.dtype ? std::string("copy")
                                  : cat("copy[", dtype_name(src.dtype), "->", dtype_name(dst.dtype), "]");
  };
  timed_as(name, [&] { inner_->copy(src, dst); });
}

void ProfiledBackend::add(const View& dst, const View& src) {
  timed("add", [&] { inner_->add(dst, src); });
}

double ProfiledBackend::sum_squares(const View& x) {
  return timed("sum_squares", [&] { return inner_->sum_squares(x); });
}

// ---- the model's kernels ----------------------------------------------------------

void ProfiledBackend::embedding_forward(const View& tokens, const View& table, const View& out,
                                        int64_t rows, int64_t dim) {
  timed("embedding_forward", [&] { inner_->embedding_forward(tokens, table, out, rows, dim); });
}

void ProfiledBackend::embedding_backward(const View& tokens, const View& dout, const View& dtable,
                                         int64_t rows, int64_t dim) {
  timed("embedding_backward", [&] { inner_->embedding_backward(tokens, dout, dtable, rows, dim); });
}

void ProfiledBackend::linear_forward(const View& x, const View& w, const View& y, int64_t M, int64_t in,
                                     int64_t out, float beta) {
  timed_as([&] { return linear_name("linear_forward", M, in, out); },
           [&] { inner_->linear_forward(x, w, y, M, in, out, beta); });
}

void ProfiledBackend::linear_backward_input(const View& dy, const View& w, const View& dx, int64_t M,
                                            int64_t in, int64_t out, float beta) {
  timed_as([&] { return linear_name("linear_backward_input", M, in, out); },
           [&] { inner_->linear_backward_input(dy, w, dx, M, in, out, beta); });
}

void ProfiledBackend::linear_backward_weight(const View& dy, const View& x, const View& dw, int64_t M,
                                             int64_t in, int64_t out) {
  timed_as([&] { return linear_name("linear_backward_weight", M, in, out); },
           [&] { inner_->linear_backward_weight(dy, x, dw, M, in, out); });
}

void ProfiledBackend::rmsnorm_forward(const View& x, const View& w, const View& y, const View& inv_rms,
                                      int64_t rows, int64_t dim, float eps) {
  timed("rmsnorm_forward", [&] { inner_->rmsnorm_forward(x, w, y, inv_rms, rows, dim, eps); });
}

void ProfiledBackend::rmsnorm_apply(const View& x, const View& w, const View& inv_rms, const View& y,
                                    int64_t rows, int64_t dim) {
  timed("rmsnorm_apply", [&] { inner_->rmsnorm_apply(x, w, inv_rms, y, rows, dim); });
}

void ProfiledBackend::rmsnorm_backward(const View& dy, const View& x, const View& w, const View& inv_rms,
                                       const View& dx, const View& dw, int64_t rows, int64_t dim) {
  timed("rmsnorm_backward", [&] { inner_->rmsnorm_backward(dy, x, w, inv_rms, dx, dw, rows, dim); });
}

void ProfiledBackend::rope_table(const View& cos, const View& sin, int64_t max_T, int64_t head_dim,
                                 double theta) {
  timed("rope_table", [&] { inner_->rope_table(cos, sin, max_T, head_dim, theta); });
}

void ProfiledBackend::rope_forward(const View& x, const View& cos, const View& sin, int64_t B, int64_t T,
                                   int64_t heads, int64_t head_dim, int64_t row_stride) {
  timed("rope_forward", [&] { inner_->rope_forward(x, cos, sin, B, T, heads, head_dim, row_stride); });
}

void ProfiledBackend::rope_backward(const View& dx, const View& cos, const View& sin, int64_t B, int64_t T,
                                    int64_t heads, int64_t head_dim, int64_t row_stride) {
  timed("rope_backward", [&] { inner_->rope_backward(dx, cos, sin, B, T, heads, head_dim, row_stride); });
}

void ProfiledBackend::attention_forward(const View& q, const View& k, const View& v, const View& saved,
                                        const View& out, int64_t B, int64_t T, int64_t H, int64_t KV,
                                        int64_t D) {
  timed("attention_forward", [&] { inner_->attention_forward(q, k, v, saved, out, B, T, H, KV, D); });
}

void ProfiledBackend::attention_backward(const View& q, const View& k, const View& v, const View& saved,
                                         const View& out, const View& dout, const View& dq, const View& dk,
                                         const View& dv, int64_t B, int64_t T, int64_t H, int64_t KV,
                                         int64_t D) {
  timed("attention_backward",
        [&] { inner_->attention_backward(q, k, v, saved, out, dout, dq, dk, dv, B, T, H, KV, D); });
}

void ProfiledBackend::swiglu_forward(const View& gate, const View& up, const View& out) {
  timed("swiglu_forward", [&] { inner_->swiglu_forward(gate, up, out); });
}

void ProfiledBackend::swiglu_backward(const View& gate, const View& up, const View& dout, const View& dgate,
                                      const View& dup) {
  timed("swiglu_backward", [&] { inner_->swiglu_backward(gate, up, dout, dgate, dup); });
}

LossSum ProfiledBackend::cross_entropy_forward(const View& logits, const View& targets, const View& lse,
                                               int64_t rows, int64_t V) {
  return timed("cross_entropy_forward", [&] { return inner_->cross_entropy_forward(logits, targets, lse, rows, V); });
}

void ProfiledBackend::cross_entropy_forward_into(const View& logits, const View& targets, const View& lse,
                                                 int64_t rows, int64_t V, const View& acc) {
  timed("cross_entropy_forward", [&] { inner_->cross_entropy_forward_into(logits, targets, lse, rows, V, acc); });
}

// ---- the step's scalars ------------------------------------------------------------

void ProfiledBackend::from_host_async(const int32_t* src, const View& dst) {
  timed("from_host", [&] { inner_->from_host_async(src, dst); });
}

void ProfiledBackend::to_host_f64(const View& src, double* dst) {
  timed("to_host", [&] { inner_->to_host_f64(src, dst); });
}

void ProfiledBackend::sum_squares_into(const View& x, const View& acc) {
  timed("sum_squares", [&] { inner_->sum_squares_into(x, acc); });
}

void ProfiledBackend::clip_scale(const View& sumsq, double divisor, double max_norm, const View& scale) {
  timed("clip_scale", [&] { inner_->clip_scale(sumsq, divisor, max_norm, scale); });
}

void ProfiledBackend::cross_entropy_backward(const View& logits, const View& targets, const View& lse,
                                             int64_t rows, int64_t V, float scale) {
  timed("cross_entropy_backward", [&] { inner_->cross_entropy_backward(logits, targets, lse, rows, V, scale); });
}

void ProfiledBackend::adamw(const View& master, const View& m, const View& v, const View& grad,
                            const View& param_copy, const AdamWStep& step) {
  timed("adamw", [&] { inner_->adamw(master, m, v, grad, param_copy, step); });
}

}  // namespace amsp::backend
