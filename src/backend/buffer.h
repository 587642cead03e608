// Typed memory of a compute backend: a Buffer owns `count` elements of one
// dtype on one device; a View is a non-owning window into one (or into any
// memory the caller vouches for). Kernels take Views and check their dtypes,
// so a bf16 buffer can never be read as fp32 by mistake.
#pragma once

#include <cstdint>
#include <functional>

#include "core/dtype.h"

namespace amsp::backend {

struct View {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t count = 0;
  Device device = Device::kCpu;

  int64_t bytes() const { return count * dtype_bytes(dtype); }
  bool empty() const { return count == 0; }
  // Elements [offset, offset + n); fails if that leaves the view.
  View at(int64_t offset, int64_t n) const;
  // The data as a typed host pointer; fails on another dtype and on device
  // memory (read that through Backend::to_host).
  float* f32() const;
  uint16_t* bf16() const;
  int32_t* i32() const;
};

// Wraps host memory the caller owns.
View host_view(float* p, int64_t n);
View host_view(const float* p, int64_t n);  // the kernels promise not to write inputs
View host_view(int32_t* p, int64_t n);
View host_view(const int32_t* p, int64_t n);

class Buffer {
 public:
  using Deleter = std::function<void(void*, int64_t bytes)>;
  Buffer() = default;
  Buffer(View view, Deleter deleter) : view_(view), deleter_(std::move(deleter)) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept : view_(o.view_), deleter_(std::move(o.deleter_)) { o.view_ = {}; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      view_ = o.view_;
      deleter_ = std::move(o.deleter_);
      o.view_ = {};
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  const View& view() const { return view_; }
  View at(int64_t offset, int64_t n) const { return view_.at(offset, n); }
  DType dtype() const { return view_.dtype; }
  int64_t count() const { return view_.count; }
  int64_t bytes() const { return view_.bytes(); }
  void* data() const { return view_.data; }
  float* f32() const { return view_.f32(); }
  uint16_t* bf16() const { return view_.bf16(); }
  int32_t* i32() const { return view_.i32(); }

 private:
  void reset() {
    if (view_.data && deleter_) deleter_(view_.data, view_.bytes());
    view_ = {};
  }
  View view_;
  Deleter deleter_;
};

}  // namespace amsp::backend
