// A caching allocator of device memory, in outline PyTorch's CUDA allocator:
// cudaMalloc and cudaFree are slow and synchronise the device, so memory taken
// from the device is never given back during a run; it is split into blocks,
// handed out, and merged again when freed.
//
// Segments and blocks. Memory comes from the device in segments (one
// cudaMalloc each); a segment is a row of blocks, each free or handed out.
// A request is rounded up to a multiple of 512 bytes and takes the smallest
// free block that fits (best fit); a block larger than the request is split
// when the rest is worth keeping (>= 512 bytes for small requests, > 1 MiB for
// large ones, so that a large block is not shredded by small requests), and a
// freed block merges with free neighbours of its segment. Small requests (up
// to 1 MiB) and large ones come from separate pools, as in PyTorch, so that
// small, short-lived buffers do not fragment the segments of large ones. A new
// segment is 2 MiB for the small pool, the request rounded up to 2 MiB for the
// large one.
//
// The working set, once. reserve() takes one large segment at start-up, sized
// by the plan's predicted peak, so that the step splits it instead of asking
// the device; whatever the prediction misses is taken in the first step and
// cached for the rest. Nothing is given back to the device while the run goes
// on: an allocation that the device refuses fails at once, naming the request,
// what is in use, reserved and free, and the plan's predicted peak. (PyTorch
// frees its cache and retries; that is a device-wide synchronisation in the
// middle of a step, and with split blocks a retry rarely finds what the cache
// could not give.)
//
// Streams. A block released here may still be read by work queued on the
// stream that used it; handing it out again is safe only for work queued
// after that on the same stream. The CUDA backend has one compute stream and
// releases only memory whose work on other streams (communication) the engine
// has waited for, so it needs no per-stream bookkeeping.
//
// Counters: in_use and peak count the bytes of the blocks handed out (rounded
// sizes); reserved counts everything taken from the device; device_allocs the
// cudaMalloc calls so far. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

namespace amsp::backend {

class CachingAllocator {
 public:
  struct Stats {
    int64_t in_use = 0, peak = 0, reserved = 0;
    int64_t device_allocs = 0;  // cudaMalloc calls so far
  };

  // `device` names the device in errors ("cuda:0").
  explicit CachingAllocator(std::string device);
  ~CachingAllocator();  // gives every wholly free segment back; blocks still handed out leak
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (> 0) bytes, 256-byte aligned (cudaMalloc's
  // alignment, and sizes are multiples of 512). Error naming
  // the sizes if the device is out of memory.
  void* allocate(int64_t bytes);
  // Back to the cache; p must come from allocate().
  void release(void* p);
  // One segment of `bytes` for the large pool, now; false (and no segment) if
  // the device refuses it. `predicted_peak`, kept either way, is what an
  // out-of-memory error names as the plan's prediction.
  bool reserve(int64_t bytes, int64_t predicted_peak);
  // cudaFree of every wholly free segment (the device synchronises).
  void empty_cache();

  Stats stats() const;
  // A request's rounded size: a multiple of 512 bytes.
  static int64_t size_class(int64_t bytes);

 private:
  struct Block {
    int64_t size = 0;
    char* segment = nullptr;  // the segment's base
    bool free = true;
    bool large = false;       // its pool
  };
  using Free = std::set<std::pair<int64_t, char*>>;  // (size, address): best fit first

  char* take_free(int64_t rounded, bool large);         // caller holds mu_
  char* new_segment(int64_t bytes, bool large);         // caller holds mu_; null if refused
  void split(char* p, int64_t rounded);                 // caller holds mu_
  void merge_free(char* p);                             // caller holds mu_
  void free_segments();                                 // caller holds mu_
  [[noreturn]] void out_of_memory(int64_t bytes) const;  // caller holds mu_
  Free& pool(bool large) { return large ? large_free_ : small_free_; }

  std::string device_;
  mutable std::mutex mu_;
  std::map<char*, Block> blocks_;             // every block, by address
  std::map<char*, int64_t> segments_;         // base -> bytes
  Free small_free_, large_free_;
  int64_t predicted_peak_ = 0;
  Stats stats_;
};

}  // namespace amsp::backend
