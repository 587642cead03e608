// The CUDA backend's device, memory, host transfers, ordering, communicators
// and peak, and the elementwise operations. The model's kernels are in
// cuda_backend_kernels.cpp; cuda_backend.h states the semantics.
#include "backend/cuda_backend.h"

#include <cstdlib>
#include <cstring>

#include "backend/checks.h"
#include "comm/nccl/nccl_communicator.h"
#include "core/error.h"
#include "gpu/check.h"
#include "kernels/cuda/ops.h"

namespace amsp::backend {

namespace kc = amsp::kernels::cuda;

namespace {

constexpr Checks check(Device::kCuda);

// AMSP_ATTENTION_WARP_TILES, where set: the tensor-core attention's tiles of
// 16 rows a warp (kernels/cuda/ops.h), 1 by default, 2 to time the other
// layout beside it (doc/gpu.md, "The kernels").
void apply_attention_warp_tiles() {
  const char* v = std::getenv("AMSP_ATTENTION_WARP_TILES");
  if (v == nullptr) return;
  if (std::strcmp(v, "1") != 0 && std::strcmp(v, "2") != 0)
    fail_usage("AMSP_ATTENTION_WARP_TILES=", v,
               ": expected 1 or 2 (the tensor-core attention's tiles of 16 rows a warp)");
  kc::set_attention_warp_tiles(v[0] - '0');
}

}  // namespace

CudaBackend::CudaBackend(DType compute, int device)
    : Backend(compute), device_(device), allocator_(std::make_shared<CachingAllocator>(cat("cuda:", device))) {
  check.compute(compute);
  apply_attention_warp_tiles();
  int count = 0;
  AMSP_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count)
    fail_usage("cuda backend: device ", device, " does not exist (", count, " visible)");
  AMSP_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  AMSP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  name_ = prop.name;
  sm_ = prop.major * 10 + prop.minor;
  // Non-blocking: the legacy default stream, which other libraries may use,
  // must not serialise against the compute stream.
  AMSP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // cuBLASLt's workspace, once: 32 MiB on Hopper, 4 MiB before it (cuBLAS's
  // own recommendations for cublasSetWorkspace).
  gemm_workspace_ = alloc(DType::kBF16, (sm_ >= 90 ? int64_t{32} << 20 : int64_t{4} << 20) / 2);
  gemm_ = std::make_unique<LtGemm>(gemm_workspace_.view().data, static_cast<size_t>(gemm_workspace_.bytes()));
  AMSP_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  AMSP_CUDA_CHECK(cudaEventCreateWithFlags(&snap_from_, cudaEventDisableTiming));
  AMSP_CUDA_CHECK(cudaEventCreateWithFlags(&snap_done_, cudaEventDisableTiming));
}

CudaBackend::~CudaBackend() {
  AMSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  AMSP_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  AMSP_CUDA_CHECK(cudaEventDestroy(snap_from_));
  AMSP_CUDA_CHECK(cudaEventDestroy(snap_done_));
  AMSP_CUDA_CHECK(cudaStreamDestroy(copy_stream_));
  for (auto& [id, e] : events_) AMSP_CUDA_CHECK(cudaEventDestroy(e));
  for (cudaEvent_t e : free_events_) AMSP_CUDA_CHECK(cudaEventDestroy(e));
  if (staging_) AMSP_CUDA_CHECK(cudaFreeHost(staging_));
  gemm_.reset();
  AMSP_CUDA_CHECK(cudaStreamDestroy(stream_));
}

std::string CudaBackend::describe() const {
  // The attention's warp layout only where it is not the default, for a run timed beside it.
  const std::string tiles =
      kc::attention_warp_tiles() == 1 ? "" : "; attention: two tiles of 16 rows a warp";
  return cat("cuda:", device_, " (", name_, ", sm_", sm_, tiles, ")");
}

double CudaBackend::peak_flops() {
  if (AMSP_CUDA_EMULATION) return make_cpu_backend(DType::kF32)->peak_flops();
  return gpu_peak_flops(name_);
}

std::unique_ptr<Backend> make_cuda_backend(DType compute, int device) {
  return std::make_unique<CudaBackend>(compute, device);
}

DeviceCounts CudaBackend::device_counts() const {
#if AMSP_CUDA_EMULATION
  const emu::DeviceCounts c = emu::device_counts();
  return {true, c.launches, c.host_syncs, c.bytes_read, c.bytes_written, c.tensor_flops, c.simt_flops};
#else
  return {};
#endif
}

// ---- happens-before declarations ------------------------------------------------

// AMSP_HB_ACCESS with the caller's file and line instead of this one's.
// `traffic` of the `bytes` are counted (runtime.h, device_counts).
#if AMSP_CUDA_EMULATION
#define AMSP_HB_ACCESS_AT(stream, ptr, bytes, traffic, write, file, line)                     \
  ::amsp::emu::hb_access_sparse((stream), (ptr), static_cast<size_t>(bytes),                 \
                                static_cast<size_t>(traffic), (write), (file), (line))
#else
#define AMSP_HB_ACCESS_AT(stream, ptr, bytes, traffic, write, file, line) ((void)0)
#endif

void CudaBackend::reads(const void* p, int64_t bytes, const char* file, int line) {
  if (bytes > 0) AMSP_HB_ACCESS_AT(stream_, p, bytes, bytes, false, file, line);
}

void CudaBackend::writes(const void* p, int64_t bytes, const char* file, int line) {
  if (bytes > 0) AMSP_HB_ACCESS_AT(stream_, p, bytes, bytes, true, file, line);
}

void CudaBackend::reads_rows(const View& v, int64_t traffic, const char* file, int line) {
  if (v.bytes() > 0) AMSP_HB_ACCESS_AT(stream_, v.data, v.bytes(), traffic, false, file, line);
}

void CudaBackend::writes_rows(const View& v, int64_t traffic, const char* file, int line) {
  if (v.bytes() > 0) AMSP_HB_ACCESS_AT(stream_, v.data, v.bytes(), traffic, true, file, line);
}

// ---- memory ----------------------------------------------------------------------

Buffer CudaBackend::alloc(DType dtype, int64_t count) {
  const int64_t bytes = check.alloc_bytes(dtype, count);
  if (count == 0) return Buffer(View{nullptr, dtype, 0, Device::kCuda}, {});
  void* p = allocator_->allocate(bytes);
  AMSP_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), stream_));
  std::shared_ptr<CachingAllocator> a = allocator_;
  return Buffer(View{p, dtype, count, Device::kCuda}, [a](void* data, int64_t) { a->release(data); });
}

// The prediction (which counts what this backend holds already, its GEMM
// workspace), less what is already reserved, as one segment; if the device
// refuses it, the step takes what it needs as it goes (and an out-of-memory
// names the prediction).
void CudaBackend::reserve(int64_t predicted_peak) {
  const int64_t more = predicted_peak - allocator_->stats().reserved;
  (void)allocator_->reserve(std::max<int64_t>(more, 0), predicted_peak);  // keeps the prediction either way
}

MemoryStats CudaBackend::memory() const {
  const CachingAllocator::Stats s = allocator_->stats();
  std::lock_guard lock(host_blocks_->mu);
  return MemoryStats{s.in_use, s.peak, s.reserved, host_blocks_->bytes};
}

// Free on the device, and what this process's allocator holds unused.
int64_t CudaBackend::device_memory_free() const {
  size_t free = 0, total = 0;
  AMSP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const CachingAllocator::Stats s = allocator_->stats();
  return static_cast<int64_t>(free) + (s.reserved - s.in_use);
}

// Page-locked host memory (cudaHostAlloc): the device copies into it by DMA,
// at full bus speed and asynchronously, where pageable memory goes through a
// driver bounce buffer. The buffer may outlive the backend (cudaFreeHost
// needs no stream of it).
Buffer CudaBackend::alloc_host(int64_t count) {
  const int64_t bytes = check.alloc_bytes(DType::kF32, count);
  if (count == 0) return Buffer(View{nullptr, DType::kF32, 0, Device::kCpu}, {});
  void* p = nullptr;
  AMSP_CUDA_CHECK(cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocDefault));
  {
    std::lock_guard lock(host_blocks_->mu);
    host_blocks_->blocks[reinterpret_cast<uintptr_t>(p)] = bytes;
    host_blocks_->bytes += bytes;
  }
  std::shared_ptr<HostBlocks> blocks = host_blocks_;
  return Buffer(View{p, DType::kF32, count, Device::kCpu}, [blocks](void* data, int64_t n) {
    {
      std::lock_guard lock(blocks->mu);
      blocks->blocks.erase(reinterpret_cast<uintptr_t>(data));
      blocks->bytes -= n;
    }
    AMSP_CUDA_CHECK(cudaFreeHost(data));
  });
}

bool CudaBackend::in_host_block(const void* p, int64_t bytes) const {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(host_blocks_->mu);
  auto it = host_blocks_->blocks.upper_bound(at);
  if (it == host_blocks_->blocks.begin()) return false;
  --it;
  return at + static_cast<uintptr_t>(bytes) <= it->first + static_cast<uintptr_t>(it->second);
}

void* CudaBackend::staging(int64_t bytes) {
  if (staging_bytes_ < bytes) {
    if (staging_) AMSP_CUDA_CHECK(cudaFreeHost(staging_));
    staging_ = nullptr;
    AMSP_CUDA_CHECK(cudaMallocHost(&staging_, static_cast<size_t>(bytes)));
    staging_bytes_ = bytes;
  }
  return staging_;
}

void CudaBackend::sync_host() {
  ++host_syncs_;
  AMSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

const void* CudaBackend::download(const void* src, int64_t bytes) {
  void* host = staging(bytes);
  AMSP_CUDA_CHECK(cudaMemcpyAsync(host, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_));
  sync_host();
  return host;
}

void CudaBackend::to_host(const View& src, float* dst) {
  check.expect_float("to_host", "src", src);
  if (src.count == 0) return;
  const int64_t bytes = src.count * int64_t{sizeof(float)};
  // Into alloc_host memory the device copies directly (it is page-locked);
  // anything else goes through the pinned staging buffer.
  const bool direct = in_host_block(dst, bytes);
  auto fetch = [&](const void* from) {
    if (!direct) {
      std::memcpy(dst, download(from, bytes), static_cast<size_t>(bytes));
      return;
    }
    AMSP_CUDA_CHECK(cudaMemcpyAsync(dst, from, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_));
    sync_host();
  };
  if (src.dtype == DType::kF32) {
    fetch(src.data);
    return;
  }
  Scratch wide = scratch(bytes);
  reads(src);
  writes(wide.as<float>(), bytes);
  kc::to_f32(static_cast<const uint16_t*>(src.data), wide.as<float>(), src.count, stream_);
  AMSP_CUDA_CHECK_LAUNCH("to_f32");
  fetch(wide.as<float>());
}

void CudaBackend::from_host(const float* src, const View& dst) {
  check.expect_float("from_host", "dst", dst);
  if (dst.count == 0) return;
  const int64_t bytes = dst.count * int64_t{sizeof(float)};
  void* host = staging(bytes);
  std::memcpy(host, src, static_cast<size_t>(bytes));
  Scratch wide = scratch(dst.dtype == DType::kF32 ? 0 : bytes);
  float* target = dst.dtype == DType::kF32 ? static_cast<float*>(dst.data) : wide.as<float>();
  AMSP_CUDA_CHECK(cudaMemcpyAsync(target, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
  if (dst.dtype == DType::kBF16) {
    reads(target, bytes);
    writes(dst);
    kc::to_bf16(target, static_cast<uint16_t*>(dst.data), dst.count, stream_);
    AMSP_CUDA_CHECK_LAUNCH("to_bf16");
  }
  // The staging buffer is reused by the next transfer.
  sync_host();
}

void CudaBackend::from_host(const int32_t* src, const View& dst) {
  check.expect("from_host", "dst", dst, DType::kI32);
  if (dst.count == 0) return;
  void* host = staging(dst.bytes());
  std::memcpy(host, src, static_cast<size_t>(dst.bytes()));
  AMSP_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, static_cast<size_t>(dst.bytes()),
                                  cudaMemcpyHostToDevice, stream_));
  sync_host();
}

// No staging and no wait: the caller's buffer is page-locked (alloc_host) and
// left alone until a later synchronisation.
void CudaBackend::from_host_async(const int32_t* src, const View& dst) {
  check.expect("from_host_async", "dst", dst, DType::kI32);
  if (dst.count == 0) return;
  if (!in_host_block(src, dst.bytes()))
    fail("from_host_async: the source is not memory from alloc_host");
  AMSP_CUDA_CHECK(cudaMemcpyAsync(dst.data, src, static_cast<size_t>(dst.bytes()), cudaMemcpyHostToDevice,
                                  stream_));
}

void CudaBackend::to_host(const View& src, int32_t* dst) {
  check.expect("to_host", "src", src, DType::kI32);
  if (src.count == 0) return;
  std::memcpy(dst, download(src.data, src.bytes()), static_cast<size_t>(src.bytes()));
}

void CudaBackend::to_host_f64(const View& src, double* dst) {
  check.expect("to_host_f64", "src", src, DType::kF64);
  if (src.count == 0) return;
  std::memcpy(dst, download(src.data, src.bytes()), static_cast<size_t>(src.bytes()));
}

// ---- snapshots ------------------------------------------------------------------------

// DMA into page-locked memory on the copy stream, ordered after everything the
// compute stream was given: the copies overlap what the compute stream does next.
void CudaBackend::begin_snapshot(const std::vector<HostCopy>& copies) {
  for (const HostCopy& c : copies) {
    check.expect("begin_snapshot", "src", c.src, DType::kF32);
    if (c.src.count > 0 && !in_host_block(c.dst, c.src.bytes()))
      fail("begin_snapshot: a destination is not memory from alloc_host");
  }
  AMSP_CUDA_CHECK(cudaEventRecord(snap_from_, stream_));
  AMSP_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, snap_from_, 0));
  for (const HostCopy& c : copies)
    if (c.src.count > 0)
      AMSP_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src.data, static_cast<size_t>(c.src.bytes()),
                                      cudaMemcpyDeviceToHost, copy_stream_));
  AMSP_CUDA_CHECK(cudaEventRecord(snap_done_, copy_stream_));
  snap_fence_due_ = true;
}

void CudaBackend::fence_snapshot() {
  if (!snap_fence_due_) return;
  AMSP_CUDA_CHECK(cudaStreamWaitEvent(stream_, snap_done_, 0));
  snap_fence_due_ = false;
}

// Not counted in host_syncs(): the caller is the checkpoint's writer, not the step.
void CudaBackend::wait_snapshot() { AMSP_CUDA_CHECK(cudaEventSynchronize(snap_done_)); }

// ---- ordering ------------------------------------------------------------------------

Event CudaBackend::record() {
  cudaEvent_t e = nullptr;
  if (!free_events_.empty()) {
    e = free_events_.back();
    free_events_.pop_back();
  } else {
    AMSP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  AMSP_CUDA_CHECK(cudaEventRecord(e, stream_));
  events_.emplace(++last_event_, e);
  // Events the stream has passed are recycled, so a caller that records many
  // and waits for few does not grow the map without bound.
  while (events_.size() > 64) {
    auto oldest = events_.begin();
    const cudaError_t rc = cudaEventQuery(oldest->second);
    if (rc == cudaErrorNotReady) break;
    AMSP_CUDA_CHECK(rc);
    free_events_.push_back(oldest->second);
    events_.erase(oldest);
  }
  return Event{last_event_};
}

void CudaBackend::wait(const Event& event) {
  check.event(event.id, last_event_);
  const auto it = events_.find(event.id);
  if (it == events_.end()) return;  // already known complete
  ++host_syncs_;
  AMSP_CUDA_CHECK(cudaEventSynchronize(it->second));
  // The stream is in order: every earlier event is complete too.
  for (auto e = events_.begin(); e != events_.end() && e->first <= event.id;) {
    free_events_.push_back(e->second);
    e = events_.erase(e);
  }
}

void CudaBackend::synchronize() {
  sync_host();
  for (auto& [id, e] : events_) free_events_.push_back(e);
  events_.clear();
}

void CudaBackend::profiler_capture(bool on) {
  if (on) {
    AMSP_CUDA_CHECK(cudaProfilerStart());
  } else {
    AMSP_CUDA_CHECK(cudaProfilerStop());
  }
}

std::unique_ptr<comm::Communicator> CudaBackend::make_communicator(comm::Group group) {
  return std::make_unique<comm::NcclCommunicator>(std::move(group), stream_);
}

// ---- elementwise and reductions ----------------------------------------------------

void CudaBackend::fill_zero(const View& x) {
  check.device("fill_zero", "x", x);
  if (x.count == 0) return;
  AMSP_CUDA_CHECK(cudaMemsetAsync(x.data, 0, static_cast<size_t>(x.bytes()), stream_));
}

void CudaBackend::copy(const View& src, const View& dst) {
  check.copy(src, dst);
  if (src.count == 0) return;
  if (src.dtype != dst.dtype) {
    check.expect_float("copy", "src", src);
    check.expect_float("copy", "dst", dst);
  }
  if (src.dtype == dst.dtype) {
    AMSP_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(src.bytes()),
                                    cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  reads(src);
  writes(dst);
  if (src.dtype == DType::kF32)
    kc::to_bf16(static_cast<const float*>(src.data), static_cast<uint16_t*>(dst.data), src.count, stream_);
  else
    kc::to_f32(static_cast<const uint16_t*>(src.data), static_cast<float*>(dst.data), src.count, stream_);
  AMSP_CUDA_CHECK_LAUNCH("copy");
}

void CudaBackend::add(const View& dst, const View& src) {
  check.add(dst, src);
  if (dst.count == 0) return;
  reads(src);
  reads(dst);
  writes(dst);
  const int64_t n = dst.count;
  const bool d16 = dst.dtype == DType::kBF16, s16 = src.dtype == DType::kBF16;
  using bf = uint16_t;
  if (!d16 && !s16) kc::add(static_cast<float*>(dst.data), static_cast<const float*>(src.data), n, stream_);
  if (!d16 && s16) kc::add(static_cast<float*>(dst.data), static_cast<const bf*>(src.data), n, stream_);
  if (d16 && !s16) kc::add(static_cast<bf*>(dst.data), static_cast<const float*>(src.data), n, stream_);
  if (d16 && s16) kc::add(static_cast<bf*>(dst.data), static_cast<const bf*>(src.data), n, stream_);
  AMSP_CUDA_CHECK_LAUNCH("add");
}

void CudaBackend::sum_squares_into(const View& x, const View& acc) {
  check.expect_float("sum_squares_into", "x", x);
  check.expect("sum_squares_into", "acc", acc, DType::kF64);
  if (x.count == 0) return;
  Scratch partials = scratch(kc::sum_squares_chunks(x.count) * int64_t{sizeof(double)});
  reads(x);
  reads(acc);
  writes(acc);
  writes(partials.as<double>(), kc::sum_squares_chunks(x.count) * int64_t{sizeof(double)});
  auto* a = static_cast<double*>(acc.data);
  if (x.dtype == DType::kF32)
    kc::sum_squares_add(static_cast<const float*>(x.data), x.count, partials.as<double>(), a, stream_);
  else
    kc::sum_squares_add(static_cast<const uint16_t*>(x.data), x.count, partials.as<double>(), a, stream_);
  AMSP_CUDA_CHECK_LAUNCH("sum_squares_into");
}

void CudaBackend::clip_scale(const View& sumsq, double divisor, double max_norm, const View& scale) {
  check.expect("clip_scale", "sumsq", sumsq, DType::kF64);
  check.expect("clip_scale", "scale", scale, DType::kF32);
  reads(sumsq);
  writes(scale);
  kc::clip_scale(static_cast<const double*>(sumsq.data), divisor, max_norm, static_cast<float*>(scale.data),
                 stream_);
  AMSP_CUDA_CHECK_LAUNCH("clip_scale");
}

double CudaBackend::sum_squares(const View& x) {
  check.expect_float("sum_squares", "x", x);
  if (x.count == 0) return 0.0;
  const int64_t chunks = kc::sum_squares_chunks(x.count);
  Scratch partials = scratch(chunks * int64_t{sizeof(double)});
  Scratch total = scratch(sizeof(double));
  reads(x);
  writes(partials.as<double>(), chunks * int64_t{sizeof(double)});
  writes(total.as<double>(), sizeof(double));
  if (x.dtype == DType::kF32)
    kc::sum_squares(static_cast<const float*>(x.data), x.count, partials.as<double>(), total.as<double>(), stream_);
  else
    kc::sum_squares(static_cast<const uint16_t*>(x.data), x.count, partials.as<double>(), total.as<double>(),
                    stream_);
  AMSP_CUDA_CHECK_LAUNCH("sum_squares");
  double result = 0;
  std::memcpy(&result, download(total.as<double>(), sizeof(double)), sizeof(double));
  return result;
}

}  // namespace amsp::backend
