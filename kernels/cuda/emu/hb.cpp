// The access history of one allocation (hb.h). The streams, events and the
// allocation table that feed it are runtime.cpp's.
#include "kernels/cuda/emu/hb.h"

#include <algorithm>

namespace amsp::emu {
namespace {

// Did `earlier` happen before the access of a stream whose clock is `seen`?
bool ordered(const Access& earlier, const Clock& seen) {
  return clock_at(seen, static_cast<size_t>(earlier.stream)) >= earlier.tick;
}

}  // namespace

void clock_join(Clock& into, const Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

void History::split(size_t at) {
  auto it = segs_.upper_bound(at);
  if (it == segs_.begin()) return;
  --it;
  if (it->first == at || it->second.end <= at) return;
  Segment tail = it->second;
  it->second.end = at;
  segs_.emplace(at, std::move(tail));
}

void History::cover(size_t begin, size_t end) {
  split(begin);
  split(end);
  size_t pos = begin;
  auto it = segs_.lower_bound(begin);
  while (pos < end) {
    const size_t next = (it == segs_.end() || it->first >= end) ? end : it->first;
    if (pos < next) segs_.emplace_hint(it, pos, Segment{next, std::nullopt, {}});
    if (it == segs_.end() || it->first >= end) break;
    pos = it->second.end;
    ++it;
  }
}

std::optional<Conflict> History::check(size_t begin, size_t end, const Access& a,
                                       const Clock& seen) const {
  auto it = segs_.upper_bound(begin);
  if (it != segs_.begin()) --it;
  for (; it != segs_.end() && it->first < end; ++it) {
    const Segment& s = it->second;
    if (s.end <= begin) continue;
    const size_t lo = std::max(begin, it->first), hi = std::min(end, s.end);
    if (s.write && !ordered(*s.write, seen)) return Conflict{*s.write, lo, hi};
    if (!a.write) continue;
    for (const Access& r : s.reads)
      if (!ordered(r, seen)) return Conflict{r, lo, hi};
  }
  return std::nullopt;
}

std::optional<Conflict> History::access(size_t begin, size_t end, const Access& a,
                                        const Clock& seen) {
  if (begin >= end) return std::nullopt;
  if (auto c = check(begin, end, a, seen)) return c;
  cover(begin, end);
  auto first = segs_.find(begin), last = segs_.lower_bound(end);
  if (a.write) {
    // Everything before this write is ordered before it: one segment remains.
    segs_.erase(first, last);
    segs_.emplace(begin, Segment{end, a, {}});
    return std::nullopt;
  }
  for (auto it = first; it != last; ++it) {
    // Reads ordered before this one need not be kept: a later write ordered
    // after this read is ordered after them too.
    auto& reads = it->second.reads;
    std::erase_if(reads, [&](const Access& r) { return ordered(r, seen); });
    reads.push_back(a);
  }
  return std::nullopt;
}

std::optional<Conflict> History::pending(const Clock& seen) const {
  for (const auto& [begin, s] : segs_) {
    if (s.write && !ordered(*s.write, seen)) return Conflict{*s.write, begin, s.end};
    for (const Access& r : s.reads)
      if (!ordered(r, seen)) return Conflict{r, begin, s.end};
  }
  return std::nullopt;
}

}  // namespace amsp::emu
