// The CUDA runtime subset of runtime.h on the CPU, and the state of the
// happens-before checker (hb.h): streams and events with their vector clocks,
// the host's clock, and the table of allocations with their access histories.
// One mutex guards all of it; the work itself (copies, sets) runs outside it.
#include "kernels/cuda/emu/runtime.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "kernels/cuda/emu/hb.h"
#include "kernels/cuda/emu/simt.h"

using amsp::emu::Clock;

struct CUstream_st {
  int id = 0;  // index into every clock; never reused
  unsigned flags = cudaStreamDefault;
  Clock clock;
};

struct CUevent_st {
  unsigned flags = cudaEventDefault;
  bool recorded = false;
  Clock clock;  // the recording stream's, at the record
  double time_s = 0;
};

namespace amsp::emu {
namespace {

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "amsp emu: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

// AMSP_EMU_DEVICE_MEMORY: bytes, optionally with a binary K/M/G/T suffix.
size_t device_memory() {
  static const size_t bytes = [] {
    const char* v = std::getenv("AMSP_EMU_DEVICE_MEMORY");
    if (!v || !*v) return size_t{16} << 30;
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    int shift = 0;
    if (*end) {
      const char* units = "KMGT";
      const char* u = std::strchr(units, *end);
      if (!u || end[1])
        shift = -1;
      else
        shift = 10 * static_cast<int>(u - units + 1);
    }
    if (end == v || shift < 0 || n == 0 || n > (~0ull >> shift))
      die(std::string("AMSP_EMU_DEVICE_MEMORY=") + v +
          ": expected a number of bytes > 0, optionally with K, M, G or T");
    return static_cast<size_t>(n << shift);
  }();
  return bytes;
}

// AMSP_EMU_DRIVER_CUDA_VERSION: the CUDA version the emulated driver supports.
int driver_cuda_version() {
  static const int version = [] {
    const char* v = std::getenv("AMSP_EMU_DRIVER_CUDA_VERSION");
    if (!v || !*v) return kEmulatedCudaVersion;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end || n < 1000 || n > 99990)
      die(std::string("AMSP_EMU_DRIVER_CUDA_VERSION=") + v +
          ": expected a CUDA version as 1000 * major + 10 * minor, e.g. 12040");
    return static_cast<int>(n);
  }();
  return version;
}

// AMSP_EMU_DEVICES: how many devices there are, default 8.
int device_count() {
  static const int count = [] {
    const char* v = std::getenv("AMSP_EMU_DEVICES");
    if (!v || !*v) return 8;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end || n < 1 || n > 1024)
      die(std::string("AMSP_EMU_DEVICES=") + v + ": expected a device count from 1 to 1024");
    return static_cast<int>(n);
  }();
  return count;
}

struct Block {
  size_t bytes = 0;
  int id = 0;  // "allocation #id" in reports
  int device = 0;
  bool pinned = false;
  History history;
};

struct State {
  std::mutex mu;
  CUstream_st legacy;  // id 0
  std::map<CUstream_st*, std::unique_ptr<CUstream_st>> streams;
  std::map<CUevent_st*, std::unique_ptr<CUevent_st>> events;
  Clock host;     // what the host has synchronised with
  Clock retired;  // the last clocks of destroyed streams
  int next_stream = 1;
  std::map<uintptr_t, Block> blocks;  // cudaMalloc'd and cudaMallocHost'd, by base
  int next_block = 1;
  std::map<int, size_t> used;  // device bytes allocated, per device
  int64_t checked = 0;
  bool profiling = false;       // inside cudaProfilerStart/Stop
  int64_t profiler_ranges = 0;  // capture ranges opened
};

// Never destroyed: static destructors elsewhere may still free memory.
State& state() {
  static State* s = new State;
  return *s;
}

thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local DeviceCounts t_counts;
thread_local bool t_dry_run = std::getenv("AMSP_EMU_DRY_RUN") != nullptr;  // runtime.h

// Counts an access of device memory: `traffic` bytes read or written.
void count_access(size_t traffic, bool write) {
  (write ? t_counts.bytes_written : t_counts.bytes_read) += static_cast<int64_t>(traffic);
}

void count_host_sync() { ++t_counts.host_syncs; }

cudaError_t fail(cudaError_t e) {
  t_last_error = e;
  return e;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The stream behind a handle, or nullptr if it is not a live stream. Locked.
CUstream_st* find_stream(State& st, cudaStream_t s) {
  if (!s) return &st.legacy;
  auto it = st.streams.find(s);
  return it == st.streams.end() ? nullptr : it->second.get();
}

CUevent_st* find_event(State& st, cudaEvent_t e) {
  auto it = st.events.find(e);
  return it == st.events.end() ? nullptr : it->second.get();
}

// Orders new work on s after what the host knows and, as CUDA's legacy
// default stream does, after the other side of the legacy/blocking pair.
void issue(State& st, CUstream_st& s) {
  clock_join(s.clock, st.host);
  if (&s == &st.legacy) {
    for (auto& [h, t] : st.streams)
      if (!(t->flags & cudaStreamNonBlocking)) clock_join(s.clock, t->clock);
  } else if (!(s.flags & cudaStreamNonBlocking)) {
    clock_join(s.clock, st.legacy.clock);
  }
}

uint64_t tick(CUstream_st& s) {
  const size_t id = static_cast<size_t>(s.id);
  if (s.clock.size() <= id) s.clock.resize(id + 1, 0);
  return ++s.clock[id];
}

Memory memory_locked(const State& st, uintptr_t p, size_t bytes) {
  auto next = st.blocks.upper_bound(p);
  if (next != st.blocks.end() && bytes > next->first - p) return Memory::kOutside;
  if (next == st.blocks.begin()) return Memory::kHost;
  const auto& [base, b] = *std::prev(next);
  if (p >= base + b.bytes) return Memory::kHost;
  if (bytes > base + b.bytes - p) return Memory::kOutside;
  return b.pinned ? Memory::kPinned : Memory::kDevice;
}

std::string stream_name(int id) {
  return id == 0 ? "the legacy default stream" : "stream " + std::to_string(id);
}

std::string describe(const Access& a) {
  return std::string(a.write ? "write" : "read") + " by " + stream_name(a.stream) + " at " +
         a.file + ":" + std::to_string(a.line) + " (" + a.what + ")";
}

std::string describe(const Block& b, uintptr_t base, const Conflict& c) {
  char where[160];
  std::snprintf(where, sizeof where, "bytes [%zu, %zu) of allocation #%d (%zu bytes at %p)",
                c.begin, c.end, b.id, b.bytes, reinterpret_cast<void*>(base));
  return where;
}

[[noreturn]] void report(const Block& b, uintptr_t base, const Access& now, const Conflict& c) {
  die("happens-before violation on " + describe(b, base, c) + ": the " + describe(now) +
      " is not ordered after the " + describe(c.earlier) +
      " (no event wait, stream order or host synchronisation between them)");
}

}  // namespace

// ---- the checker's interface (hb.h, runtime.h) ------------------------------------------

bool stream_valid(cudaStream_t stream) {
  State& st = state();
  std::lock_guard lock(st.mu);
  return find_stream(st, stream) != nullptr;
}

Memory memory_of(const void* ptr, size_t bytes) {
  State& st = state();
  std::lock_guard lock(st.mu);
  return memory_locked(st, reinterpret_cast<uintptr_t>(ptr), bytes);
}

namespace {

// op_access, counting `traffic` bytes of device memory for the access.
bool access_counted(cudaStream_t stream, const void* ptr, size_t bytes, size_t traffic, bool write,
                    const char* what, const char* file, int line) {
  if (bytes == 0) return true;
  State& st = state();
  std::lock_guard lock(st.mu);
  CUstream_st* s = find_stream(st, stream);
  if (!s)
    die(std::string(what) + " at " + file + ":" + std::to_string(line) + " on an invalid stream");
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  const Memory m = memory_locked(st, p, bytes);
  if (m == Memory::kOutside) return false;
  issue(st, *s);
  const uint64_t t = tick(*s);
  if (m != Memory::kDevice) return true;
  count_access(traffic, write);
  auto it = std::prev(st.blocks.upper_bound(p));
  const Access a{s->id, t, write, what, file, line};
  ++st.checked;
  const size_t off = p - it->first;
  if (auto c = it->second.history.access(off, off + bytes, a, s->clock))
    report(it->second, it->first, a, *c);
  return true;
}

}  // namespace

bool op_access(cudaStream_t stream, const void* ptr, size_t bytes, bool write, const char* what,
               const char* file, int line) {
  return access_counted(stream, ptr, bytes, bytes, write, what, file, line);
}

void hb_access(cudaStream_t stream, const void* ptr, size_t bytes, bool write, const char* file,
               int line) {
  hb_access_sparse(stream, ptr, bytes, bytes, write, file, line);
}

void hb_access_sparse(cudaStream_t stream, const void* ptr, size_t bytes, size_t traffic,
                      bool write, const char* file, int line) {
  if (bytes == 0) return;
  const Memory m = memory_of(ptr, bytes);
  char range[96];
  std::snprintf(range, sizeof range, "[%p, +%zu bytes)", ptr, bytes);
  const std::string where = std::string(" at ") + file + ":" + std::to_string(line);
  if (m == Memory::kHost)
    die(std::string("a kernel") + where + " accesses " + range +
        ", which is neither cudaMalloc'd nor cudaMallocHost'd memory");
  if (!access_counted(stream, ptr, bytes, std::min(traffic, bytes), write, "kernel", file, line))
    die(std::string("a kernel") + where + " accesses " + range +
        ", which runs past the end of its allocation");
}

DeviceCounts device_counts() { return t_counts; }
void count_launch() { ++t_counts.launches; }
void count_flops(double flops, bool tensor) {
  (tensor ? t_counts.tensor_flops : t_counts.simt_flops) += flops;
}
void set_dry_run(bool on) { t_dry_run = on; }
bool dry_run() { return t_dry_run; }

int64_t hb_checked() {
  State& st = state();
  std::lock_guard lock(st.mu);
  return st.checked;
}

void set_last_error(cudaError_t error) { t_last_error = error; }

}  // namespace amsp::emu

using namespace amsp::emu;

// ---- versions and devices -------------------------------------------------------------

cudaError_t cudaDriverGetVersion(int* version) {
  if (!version) return fail(cudaErrorInvalidValue);
  *version = driver_cuda_version();
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (!version) return fail(cudaErrorInvalidValue);
  *version = kEmulatedCudaVersion;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "emulated CUDA device (CPU)");
  prop->totalGlobalMem = device_memory();
  prop->multiProcessorCount = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  prop->major = 8;  // what the kernels are compiled for first (sm_80)
  prop->minor = 0;
  prop->clockRate = 1000000;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value || attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  *value = static_cast<int>(amsp::emu::simt::device_shared_optin());
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      !amsp::emu::simt::set_max_dynamic_shared(func, static_cast<size_t>(value)))
    return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (!free || !total) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard lock(st.mu);
  *total = device_memory();
  *free = *total - st.used[t_device];
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  count_host_sync();
  State& st = state();
  std::lock_guard lock(st.mu);
  clock_join(st.host, st.legacy.clock);
  clock_join(st.host, st.retired);
  for (auto& [h, s] : st.streams) clock_join(st.host, s->clock);
  return cudaSuccess;
}

cudaError_t cudaProfilerStart() {
  std::lock_guard lock(state().mu);
  if (!state().profiling) ++state().profiler_ranges;
  state().profiling = true;
  return cudaSuccess;
}

cudaError_t cudaProfilerStop() {
  std::lock_guard lock(state().mu);
  state().profiling = false;
  return cudaSuccess;
}

int64_t amsp::emu::profiler_ranges() {
  std::lock_guard lock(state().mu);
  return state().profiler_ranges;
}

// ---- memory ----------------------------------------------------------------------------

namespace {

constexpr size_t kAlign = 256;  // cudaMalloc's guarantee

cudaError_t allocate(void** ptr, size_t bytes, bool pinned) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  State& st = state();
  std::lock_guard lock(st.mu);
  size_t& used = st.used[t_device];
  if (!pinned && bytes > device_memory() - used) return fail(cudaErrorMemoryAllocation);
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) return fail(cudaErrorMemoryAllocation);
  std::memset(p, 0xff, bytes);
  Block b;
  b.bytes = bytes;
  b.id = st.next_block++;
  b.device = t_device;
  b.pinned = pinned;
  st.blocks.emplace(reinterpret_cast<uintptr_t>(p), std::move(b));
  if (!pinned) used += bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t release(void* ptr, bool pinned) {
  if (!ptr) return cudaSuccess;
  State& st = state();
  std::lock_guard lock(st.mu);
  auto it = st.blocks.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == st.blocks.end() || it->second.pinned != pinned) return fail(cudaErrorInvalidValue);
  const Block& b = it->second;
  if (auto c = b.history.pending(st.host))
    die("happens-before violation on " + describe(b, it->first, *c) + ": cudaFree while the " +
        describe(c->earlier) + " is not known to the host to have finished");
  if (!pinned) st.used[b.device] -= b.bytes;
  st.blocks.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

bool valid_kind(cudaMemcpyKind kind) {
  return kind >= cudaMemcpyHostToHost && kind <= cudaMemcpyDefault;
}

// A copy on `stream`: the read of src and the write of dst, then the bytes.
cudaError_t copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream,
                 const char* what, const char* file, int line) {
  if (!valid_kind(kind) || (bytes && (!dst || !src))) return fail(cudaErrorInvalidValue);
  if (!stream_valid(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (!op_access(stream, src, bytes, false, what, file, line) ||
      !op_access(stream, dst, bytes, true, what, file, line))
    return fail(cudaErrorInvalidValue);
  if (bytes) count_launch();
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

}  // namespace

cudaError_t cudaMalloc(void** ptr, size_t bytes) { return allocate(ptr, bytes, false); }
cudaError_t cudaFree(void* ptr) { return release(ptr, false); }
cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return allocate(ptr, bytes, true); }
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned flags) {
  if (flags != cudaHostAllocDefault) {
    if (ptr) *ptr = nullptr;
    return fail(cudaErrorInvalidValue);
  }
  return allocate(ptr, bytes, true);
}
cudaError_t cudaFreeHost(void* ptr) { return release(ptr, true); }

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                       const char* file, int line) {
  const cudaError_t rc = copy(dst, src, bytes, kind, nullptr, "cudaMemcpy", file, line);
  if (rc != cudaSuccess) return rc;
  count_host_sync();
  State& st = state();
  std::lock_guard lock(st.mu);
  clock_join(st.host, st.legacy.clock);  // synchronous for the host
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream, const char* file, int line) {
  return copy(dst, src, bytes, kind, stream, "cudaMemcpyAsync", file, line);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream,
                            const char* file, int line) {
  if (bytes && !ptr) return fail(cudaErrorInvalidValue);
  if (!stream_valid(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (!op_access(stream, ptr, bytes, true, "cudaMemsetAsync", file, line))
    return fail(cudaErrorInvalidValue);
  if (bytes) count_launch();
  if (bytes) std::memset(ptr, value, bytes);
  return cudaSuccess;
}

// ---- streams ----------------------------------------------------------------------------

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (!stream || (flags & ~cudaStreamNonBlocking)) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard lock(st.mu);
  auto s = std::make_unique<CUstream_st>();
  s->id = st.next_stream++;
  s->flags = flags;
  *stream = s.get();
  st.streams.emplace(s.get(), std::move(s));
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  State& st = state();
  std::lock_guard lock(st.mu);
  auto it = stream ? st.streams.find(stream) : st.streams.end();
  if (it == st.streams.end()) return fail(cudaErrorInvalidResourceHandle);
  // Its work still completes; a device synchronisation must still see it.
  clock_join(st.retired, it->second->clock);
  st.streams.erase(it);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  count_host_sync();
  State& st = state();
  std::lock_guard lock(st.mu);
  CUstream_st* s = find_stream(st, stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  clock_join(st.host, s->clock);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  return cudaStreamSynchronize(stream);  // all work is done when issued
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
  if (flags != 0) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard lock(st.mu);
  CUstream_st* s = find_stream(st, stream);
  CUevent_st* e = find_event(st, event);
  if (!s || !e) return fail(cudaErrorInvalidResourceHandle);
  issue(st, *s);
  if (e->recorded) clock_join(s->clock, e->clock);  // never recorded: nothing to wait for
  return cudaSuccess;
}

// ---- events -----------------------------------------------------------------------------

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (!event || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)))
    return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard lock(st.mu);
  auto e = std::make_unique<CUevent_st>();
  e->flags = flags;
  *event = e.get();
  st.events.emplace(e.get(), std::move(e));
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  State& st = state();
  std::lock_guard lock(st.mu);
  if (!st.events.erase(event)) return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  State& st = state();
  std::lock_guard lock(st.mu);
  CUstream_st* s = find_stream(st, stream);
  CUevent_st* e = find_event(st, event);
  if (!s || !e) return fail(cudaErrorInvalidResourceHandle);
  issue(st, *s);
  e->clock = s->clock;
  e->recorded = true;
  e->time_s = now_s();
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  count_host_sync();
  State& st = state();
  std::lock_guard lock(st.mu);
  CUevent_st* e = find_event(st, event);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  if (e->recorded) clock_join(st.host, e->clock);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  return cudaEventSynchronize(event);  // all work is done when issued
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard lock(st.mu);
  CUevent_st* a = find_event(st, start);
  CUevent_st* b = find_event(st, end);
  if (!a || !b || !a->recorded || !b->recorded || ((a->flags | b->flags) & cudaEventDisableTiming))
    return fail(cudaErrorInvalidResourceHandle);
  *ms = static_cast<float>((b->time_s - a->time_s) * 1e3);
  return cudaSuccess;
}

// ---- errors -----------------------------------------------------------------------------

cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return t_last_error; }

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unrecognized error code";
}
