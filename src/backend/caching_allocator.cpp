#include "backend/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <iterator>

#include "core/error.h"
#include "gpu/check.h"

namespace amsp::backend {

namespace {

constexpr int64_t kRound = 512;                    // every size is a multiple of this
constexpr int64_t kSmall = int64_t{1} << 20;       // up to here: the small pool
constexpr int64_t kSegment = int64_t{2} << 20;     // a small segment; large ones round to it

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// "1.50 GiB"
std::string gib(double bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", bytes / double(int64_t{1} << 30));
  return s;
}

}  // namespace

CachingAllocator::CachingAllocator(std::string device) : device_(std::move(device)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mu_);
  free_segments();
}

int64_t CachingAllocator::size_class(int64_t bytes) { return round_up(bytes, kRound); }

char* CachingAllocator::new_segment(int64_t bytes, bool large) {
  void* base = nullptr;
  const cudaError_t rc = cudaMalloc(&base, static_cast<size_t>(bytes));
  if (rc == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it
    return nullptr;
  }
  AMSP_CUDA_CHECK(rc);
  char* p = static_cast<char*>(base);
  stats_.device_allocs += 1;
  stats_.reserved += bytes;
  segments_[p] = bytes;
  blocks_[p] = Block{bytes, p, true, large};
  pool(large).insert({bytes, p});
  return p;
}

// The rest of block p beyond `rounded` becomes a free block of its own, when
// it is worth keeping.
void CachingAllocator::split(char* p, int64_t rounded) {
  Block& b = blocks_.at(p);
  const int64_t rest = b.size - rounded;
  if (b.large ? rest <= kSmall : rest < kRound) return;
  b.size = rounded;
  blocks_[p + rounded] = Block{rest, b.segment, true, b.large};
  pool(b.large).insert({rest, p + rounded});
}

char* CachingAllocator::take_free(int64_t rounded, bool large) {
  Free& f = pool(large);
  const auto it = f.lower_bound({rounded, nullptr});
  if (it == f.end()) return nullptr;
  char* p = it->second;
  f.erase(it);
  split(p, rounded);
  blocks_.at(p).free = false;
  return p;
}

// Block p, just freed, joins its free neighbours in the same segment.
void CachingAllocator::merge_free(char* p) {
  auto it = blocks_.find(p);
  auto joins = [&](std::map<char*, Block>::iterator other) {
    return other->second.free && other->second.segment == it->second.segment;
  };
  if (const auto next = std::next(it); next != blocks_.end() && joins(next)) {
    pool(next->second.large).erase({next->second.size, next->first});
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    if (const auto prev = std::prev(it); joins(prev)) {
      pool(prev->second.large).erase({prev->second.size, prev->first});
      prev->second.size += it->second.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  pool(it->second.large).insert({it->second.size, it->first});
}

void CachingAllocator::free_segments() {
  for (auto s = segments_.begin(); s != segments_.end();) {
    const Block& b = blocks_.at(s->first);
    if (!b.free || b.size != s->second) {
      ++s;
      continue;
    }
    pool(b.large).erase({b.size, s->first});
    blocks_.erase(s->first);
    AMSP_CUDA_CHECK(cudaFree(s->first));
    stats_.reserved -= s->second;
    s = segments_.erase(s);
  }
}

void CachingAllocator::out_of_memory(int64_t bytes) const {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) (void)cudaGetLastError();
  int64_t largest = 0;
  for (const Free* f : {&small_free_, &large_free_})
    if (!f->empty()) largest = std::max(largest, f->rbegin()->first);
  fail(device_, ": out of memory asking for ", bytes, " bytes (", gib(double(bytes)), "): ", gib(double(stats_.in_use)),
       " in use, ", gib(double(stats_.reserved)), " reserved (largest free block ", gib(double(largest)), "), ",
       gib(double(free)), " free on the device of ", gib(double(total)), "; the plan predicted a peak of ",
       predicted_peak_ > 0 ? gib(double(predicted_peak_)) : std::string("(none given)"),
       " per rank: choose a plan that shards more, or a smaller micro-batch");
}

void* CachingAllocator::allocate(int64_t bytes) {
  if (bytes <= 0) fail("caching allocator: asked for ", bytes, " bytes");
  const int64_t rounded = size_class(bytes);
  const bool large = rounded > kSmall;
  std::lock_guard lock(mu_);
  char* p = take_free(rounded, large);
  if (p == nullptr) {
    if (!new_segment(large ? round_up(rounded, kSegment) : kSegment, large)) out_of_memory(bytes);
    p = take_free(rounded, large);
  }
  stats_.in_use += blocks_.at(p).size;
  stats_.peak = std::max(stats_.peak, stats_.in_use);
  return p;
}

void CachingAllocator::release(void* p) {
  std::lock_guard lock(mu_);
  const auto it = blocks_.find(static_cast<char*>(p));
  if (it == blocks_.end() || it->second.free) fail("caching allocator: ", p, " was not allocated here");
  stats_.in_use -= it->second.size;
  it->second.free = true;
  merge_free(it->first);
}

bool CachingAllocator::reserve(int64_t bytes, int64_t predicted_peak) {
  std::lock_guard lock(mu_);
  predicted_peak_ = predicted_peak;
  if (bytes <= 0) return true;
  return new_segment(round_up(bytes, kSegment), true) != nullptr;
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mu_);
  free_segments();
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace amsp::backend
