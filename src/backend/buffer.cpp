#include "backend/buffer.h"

#include "core/error.h"

namespace amsp::backend {

namespace {

// Host code may only dereference host memory: a device view's pointer is
// meaningless here (and, under the CUDA emulation, would bypass the
// happens-before checker). Device data goes through Backend::to_host.
void expect_dtype(const View& v, DType want) {
  if (v.device != Device::kCpu)
    fail("view: asked for host ", dtype_name(want), " data of a ", device_name(v.device), " view of ",
         v.count, " elements; copy it with the backend's to_host");
  if (v.dtype != want)
    fail("view: asked for ", dtype_name(want), " data of a ", dtype_name(v.dtype), " view of ",
         v.count, " elements");
}

}  // namespace

View View::at(int64_t offset, int64_t n) const {
  // offset + n is computed only once both are known to be in [0, count], so it
  // cannot overflow.
  if (offset < 0 || n < 0 || offset > count || n > count - offset)
    fail("view: ", n, " elements at offset ", offset, " do not fit in a ", dtype_name(dtype),
         " view of ", count, " elements");
  View v = *this;
  v.data = data == nullptr ? nullptr : static_cast<char*>(data) + offset * dtype_bytes(dtype);
  v.count = n;
  return v;
}

float* View::f32() const {
  expect_dtype(*this, DType::kF32);
  return static_cast<float*>(data);
}

uint16_t* View::bf16() const {
  expect_dtype(*this, DType::kBF16);
  return static_cast<uint16_t*>(data);
}

int32_t* View::i32() const {
  expect_dtype(*this, DType::kI32);
  return static_cast<int32_t*>(data);
}

View host_view(float* p, int64_t n) { return View{p, DType::kF32, n, Device::kCpu}; }
View host_view(const float* p, int64_t n) { return host_view(const_cast<float*>(p), n); }
View host_view(int32_t* p, int64_t n) { return View{p, DType::kI32, n, Device::kCpu}; }
View host_view(const int32_t* p, int64_t n) { return host_view(const_cast<int32_t*>(p), n); }

}  // namespace amsp::backend
