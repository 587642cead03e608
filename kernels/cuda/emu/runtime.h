// The subset of the CUDA runtime API amsp uses, for the emulation build: the
// same names and signatures as <cuda_runtime.h>, implemented on the CPU
// (runtime.cpp). Device memory is host memory; a stream is an in-order queue
// whose work runs at once, when it is issued, on the calling thread; events
// record a stream's position. What the emulation cannot show (real
// concurrency) the happens-before checker makes up for: hb_access records every
// read and write with the stream that does it, and fails the job when one is
// not ordered after the last conflicting access by the stream order, an event
// the stream waited on, or a host synchronisation (doc/gpu.md, "Emulation").
#pragma once

#include <cstddef>
#include <cstdint>

// ---- types --------------------------------------------------------------------------
struct CUstream_st;
struct CUevent_st;
typedef CUstream_st* cudaStream_t;  // nullptr: the legacy default stream
typedef CUevent_st* cudaEvent_t;

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

constexpr unsigned cudaStreamDefault = 0x0, cudaStreamNonBlocking = 0x1;
constexpr unsigned cudaHostAllocDefault = 0x0;
constexpr unsigned cudaEventDefault = 0x0, cudaEventBlockingSync = 0x1,
                   cudaEventDisableTiming = 0x2;

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The one function attribute and the one device attribute amsp sets or asks
// (CUDA's values).
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int multiProcessorCount;
  int major, minor;
  int clockRate;  // kHz
};

// ---- the API ---------------------------------------------------------------------------
cudaError_t cudaDriverGetVersion(int* version);
cudaError_t cudaRuntimeGetVersion(int* version);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
// A kernel's opt-in to more dynamic shared memory than the 48 KiB any launch
// may have (emu/simt.h checks each launch against it); CUDA's template overload
// takes the kernel itself.
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value);
template <typename... Params>
cudaError_t cudaFuncSetAttribute(void (*func)(Params...), cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(func), attr, value);
}
cudaError_t cudaDeviceSynchronize();
// The profiler's capture range (cuda_profiler_api.h): counted, nothing else;
// a second start before a stop has no effect, as on a GPU.
cudaError_t cudaProfilerStart();
cudaError_t cudaProfilerStop();

cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
// cudaMallocHost with flags; the emulation takes cudaHostAllocDefault only
// (portable, mapped and write-combined memory mean nothing without a device).
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* ptr);
// The copies and sets take the caller's file and line as defaulted trailing
// arguments (an emulation-only addition; calls read as CUDA's), so that the
// checker can name them.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                       const char* file = __builtin_FILE(), int line = __builtin_LINE());
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr, const char* file = __builtin_FILE(),
                            int line = __builtin_LINE());
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream = nullptr,
                            const char* file = __builtin_FILE(), int line = __builtin_LINE());

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags);
cudaError_t cudaStreamQuery(cudaStream_t stream);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);

// ---- emulation only ---------------------------------------------------------------------
namespace amsp::emu {

// What the emulated cudaRuntimeGetVersion reports: 1000 * major + 10 * minor.
inline constexpr int kEmulatedCudaVersion = 13000;

// How many profiler capture ranges (cudaProfilerStart after a stop) the
// process has opened.
int64_t profiler_ranges();

// Work about to be issued on `stream` reads or writes [ptr, ptr + bytes) of a
// cudaMalloc'd block: checked against the happens-before order and recorded.
// Host code touching device memory directly is a bug the checker reports too.
// Use through AMSP_HB_ACCESS (kernels/cuda/api.h).
void hb_access(cudaStream_t stream, const void* ptr, size_t bytes, bool write, const char* file,
               int line);

// The same for a gather or scatter whose rows depend on data: the whole range
// is checked and recorded, and `traffic` bytes (the rows it can touch at most)
// are counted (device_counts) instead of the range.
void hb_access_sparse(cudaStream_t stream, const void* ptr, size_t bytes, size_t traffic,
                      bool write, const char* file, int line);

// Happens-before accounting for the tests: accesses checked so far.
int64_t hb_checked();

// What this OS thread has asked of the emulated device since it started: the
// kernel profile's counts (backend/profiled_backend.h) and the roofline
// benchmark's (benchmarks/roofline_bench.cpp). Work runs on the thread that
// issues it, so a span of one thread's calls is the device work of that span.
//   launches      stream operations: kernels, cuBLAS calls, copies and sets
//   host_syncs    cudaStreamSynchronize, cudaEventSynchronize (and the queries),
//                 cudaDeviceSynchronize, cudaMemcpy
//   bytes_read, bytes_written
//                 device memory each operation reads and writes: the ranges
//                 its accesses name (AMSP_HB_ACCESS, cuBLAS's operands,
//                 copies and sets), each once per operation; re-reads inside a
//                 kernel (through shared memory or the caches) are not seen
//   tensor_flops, simt_flops
//                 cuBLAS's 2mnk by the unit its types run on (bf16 operands:
//                 tensor cores; fp32: CUDA cores), and what kernels declare
//                 (AMSP_DEVICE_FLOPS)
struct DeviceCounts {
  int64_t launches = 0;
  int64_t host_syncs = 0;
  int64_t bytes_read = 0, bytes_written = 0;
  double tensor_flops = 0, simt_flops = 0;
};
DeviceCounts device_counts();
void count_launch();
void count_flops(double flops, bool tensor);

// A dry run: kernels and cuBLAS calls are checked (configuration, operands,
// ordering) and counted, and do not run; copies and sets still do. For
// counting a step at sizes the emulation could not execute in time; every
// value computed on the device is garbage. Per OS thread, off by default; a
// thread starts dry if AMSP_EMU_DRY_RUN is set when it first uses the
// emulation, so that a whole program (`amsp train --device cuda`) can be timed
// on the host without its kernels: the host's own cost of issuing a step.
void set_dry_run(bool on);
bool dry_run();

// Makes `error` what cudaGetLastError returns next, as a failed launch would
// (for the emulated kernel launcher).
void set_last_error(cudaError_t error);

// Devices: cudaGetDeviceCount is AMSP_EMU_DEVICES (default 8, so that every
// rank of an MPI job on one host can select its own), each named "emulated
// CUDA device (CPU)" with AMSP_EMU_DEVICE_MEMORY bytes (default 16 GiB; a
// number of bytes, or with a K, M, G or T suffix, binary). cudaMalloc fails
// with cudaErrorMemoryAllocation past that, and fills new blocks with 0xff
// bytes (NaN as fp32 and bf16) so that a read of memory nobody wrote shows.
//
// Versions: the emulation's own, fixed, naming no installed library. The
// runtime is kEmulatedCudaVersion (CUDA 13.0, the API it follows); so is the
// driver, unless AMSP_EMU_DRIVER_CUDA_VERSION (a CUDA version as
// cudaDriverGetVersion writes it, e.g. 12040 for 12.4) says otherwise, so that
// a test can meet a driver too old for the runtime.
//
// Ordering, as CUDA's: the legacy default stream (nullptr) waits for the work
// issued so far on every live blocking stream, and blocking streams wait for
// the work issued so far on it; cudaStreamNonBlocking streams do neither.
// cudaMemcpy is a copy on the legacy stream followed by a host synchronisation
// with it. A successful cudaEventQuery or cudaStreamQuery synchronises the host
// as cudaEventSynchronize does (work runs at issue, so they always succeed).
// Stricter than CUDA: cudaFree does not synchronise; freeing a block that a
// stream accessed after the host's last synchronisation with that access is a
// violation. Pinned host memory (cudaMallocHost) is device-accessible but not
// tracked: the host touches it without telling the checker.
}  // namespace amsp::emu
