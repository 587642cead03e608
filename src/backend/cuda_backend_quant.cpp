// The CUDA backend's block quantization (backend.h; kernels/cuda/quant.cu), with
// the CPU backend's checks.
#include "backend/checks.h"
#include "backend/cuda_backend.h"
#include "gpu/check.h"
#include "kernels/cuda/ops.h"

namespace amsp::backend {

namespace kc = amsp::kernels::cuda;
using kernels::quant::Spec;

namespace {

constexpr Checks check(Device::kCuda);

const int32_t* i32p(const View& v) { return static_cast<const int32_t*>(v.data); }
int32_t* i32w(const View& v) { return static_cast<int32_t*>(v.data); }

}  // namespace

void CudaBackend::quantize(const View& src, int64_t n, int64_t records, const View& dst, const Spec& spec) {
  const char* kn = "quantize";
  const int64_t words = check.quant(kn, spec, n, records, src, "src", records, dst, "dst");
  if (n == 0 || records == 0) return;
  reads(src.data, records * n * dtype_bytes(src.dtype));
  writes(dst.data, records * words * 4);
  if (src.dtype == DType::kF32)
    kc::quantize(static_cast<const float*>(src.data), n, records, spec, i32w(dst), stream_);
  else
    kc::quantize(static_cast<const uint16_t*>(src.data), n, records, spec, i32w(dst), stream_);
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

void CudaBackend::dequantize(const View& src, int64_t n, int64_t records, const View& dst, const Spec& spec) {
  const char* kn = "dequantize";
  const int64_t words = check.quant(kn, spec, n, records, dst, "dst", records, src, "src");
  if (n == 0 || records == 0) return;
  reads(src.data, records * words * 4);
  writes(dst.data, records * n * dtype_bytes(dst.dtype));
  if (dst.dtype == DType::kF32)
    kc::dequantize(i32p(src), n, records, spec, static_cast<float*>(dst.data), stream_);
  else
    kc::dequantize(i32p(src), n, records, spec, static_cast<uint16_t*>(dst.data), stream_);
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

void CudaBackend::dequantize_sum(const View& src, int64_t n, int64_t records, const View& dst,
                                 const Spec& spec) {
  const char* kn = "dequantize_sum";
  const int64_t words = check.quant(kn, spec, n, records, dst, "dst", 1, src, "src");
  if (n == 0) return;
  if (records > 0) reads(src.data, records * words * 4);
  writes(dst.data, n * dtype_bytes(dst.dtype));
  if (dst.dtype == DType::kF32)
    kc::dequantize_sum(i32p(src), n, records, spec, static_cast<float*>(dst.data), stream_);
  else
    kc::dequantize_sum(i32p(src), n, records, spec, static_cast<uint16_t*>(dst.data), stream_);
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

}  // namespace amsp::backend
