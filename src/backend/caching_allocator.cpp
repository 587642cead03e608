#include "backend/caching_allocator.h"

#include <algorithm>

#include "core/error.h"
#include "gpu/check.h"

namespace amsp::backend {

namespace {

constexpr int64_t kSmall = int64_t{1} << 20;       // up to here: 512-byte classes
constexpr int64_t kSmallRound = 512;
constexpr int64_t kLargeRound = int64_t{2} << 20;  // above: 2 MiB classes

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

}  // namespace

CachingAllocator::CachingAllocator(std::string device) : device_(std::move(device)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mu_);
  free_cached();
}

int64_t CachingAllocator::size_class(int64_t bytes) {
  return bytes <= kSmall ? round_up(bytes, kSmallRound) : round_up(bytes, kLargeRound);
}

void* CachingAllocator::take_cached(int64_t rounded) {
  auto it = cached_.lower_bound(rounded);
  if (it == cached_.end()) return nullptr;
  // Small classes match exactly; a large block may be at most 1/8 too big, so
  // that one huge cached block is not spent on a small request.
  const int64_t limit = rounded <= kSmall ? rounded : rounded + rounded / 8;
  if (it->first > limit) return nullptr;
  void* p = it->second;
  live_[p] = it->first;
  stats_.in_use += it->first;
  cached_.erase(it);
  return p;
}

void CachingAllocator::free_cached() {
  for (const auto& [bytes, p] : cached_) {
    AMSP_CUDA_CHECK(cudaFree(p));
    stats_.reserved -= bytes;
  }
  cached_.clear();
}

void* CachingAllocator::allocate(int64_t bytes) {
  if (bytes <= 0) fail("caching allocator: asked for ", bytes, " bytes");
  const int64_t rounded = size_class(bytes);
  std::lock_guard lock(mu_);
  void* p = take_cached(rounded);
  if (p == nullptr) {
    cudaError_t rc = cudaMalloc(&p, static_cast<size_t>(rounded));
    if (rc == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the sticky-looking error before retrying
      free_cached();
      rc = cudaMalloc(&p, static_cast<size_t>(rounded));
    }
    if (rc == cudaErrorMemoryAllocation)
      fail(device_, ": out of memory allocating ", bytes, " bytes (", stats_.in_use,
           " bytes in use, ", stats_.reserved, " reserved)");
    AMSP_CUDA_CHECK(rc);
    stats_.reserved += rounded;
    live_[p] = rounded;
    stats_.in_use += rounded;
  }
  stats_.peak = std::max(stats_.peak, stats_.in_use);
  return p;
}

void CachingAllocator::release(void* p) {
  std::lock_guard lock(mu_);
  const auto it = live_.find(p);
  if (it == live_.end()) fail("caching allocator: ", p, " was not allocated here");
  stats_.in_use -= it->second;
  cached_.emplace(it->second, p);
  live_.erase(it);
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mu_);
  free_cached();
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace amsp::backend
