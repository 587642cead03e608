// A caching allocator of device memory, as PyTorch's CUDA allocator is in
// outline: cudaMalloc is slow and synchronises the device, so freed blocks are
// kept on free lists by size class and handed out again instead of returned.
//
// Size classes: requests up to 1 MiB are rounded up to a multiple of 512
// bytes, larger ones to a multiple of 2 MiB. A request takes a cached block of
// its own class, or (large requests) the smallest cached block at most 1/8
// larger; otherwise a new cudaMalloc. When cudaMalloc fails, every cached
// block is freed and the allocation tried once more before it fails.
//
// Streams. A block released here may still be read by work queued on the
// stream that used it; handing it out again is safe only for work queued
// after that on the same stream. The CUDA backend has one compute stream and
// releases only memory whose work on other streams (communication) the engine
// has waited for, so it needs no per-stream bookkeeping.
//
// Counters: in_use and peak count the bytes of the blocks handed out (rounded
// sizes); reserved counts everything cudaMalloc'd, cached blocks included.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

namespace amsp::backend {

class CachingAllocator {
 public:
  struct Stats {
    int64_t in_use = 0, peak = 0, reserved = 0;
  };

  // `device` names the device in errors ("cuda:0").
  explicit CachingAllocator(std::string device);
  ~CachingAllocator();  // frees the cached blocks; blocks still handed out leak
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (> 0) bytes, 256-byte aligned (cudaMalloc's
  // alignment). Error naming the sizes if the device is out of memory.
  void* allocate(int64_t bytes);
  // Back to the cache; p must come from allocate().
  void release(void* p);
  // cudaFree of every cached block.
  void empty_cache();

  Stats stats() const;
  static int64_t size_class(int64_t bytes);

 private:
  void* take_cached(int64_t rounded);  // caller holds mu_
  void free_cached();                  // caller holds mu_

  std::string device_;
  mutable std::mutex mu_;
  std::unordered_map<void*, int64_t> live_;  // handed out: block -> rounded size
  std::multimap<int64_t, void*> cached_;     // free: rounded size -> block
  Stats stats_;
};

}  // namespace amsp::backend
