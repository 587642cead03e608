// The happens-before checker of the CUDA emulation, inside the emulation:
// vector clocks, the access history of one allocation (hb.cpp), and the calls
// by which the emulated libraries (runtime.cpp, cublas.cpp, nccl.cpp) order
// their ops and record their accesses. Not for code outside kernels/cuda/emu.
//
// The model. Every stream has an id (0: the legacy default stream) and a
// vector clock: entry i is the last tick of stream i known to have happened
// before the stream's next op. Every recorded access ticks its stream. The host
// has a clock too: what it has synchronised with. Anything the host issues on a
// stream is ordered after what the host knows, so issuing joins the host's
// clock into the stream's. An access is well ordered when every earlier
// conflicting access (a write, or a read when this one writes) to the same
// bytes has a tick no later than the accessing stream's entry for its stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "kernels/cuda/emu/runtime.h"

namespace amsp::emu {

using Clock = std::vector<uint64_t>;  // indexed by stream id; missing entries are 0

inline uint64_t clock_at(const Clock& c, size_t id) { return id < c.size() ? c[id] : 0; }
void clock_join(Clock& into, const Clock& from);

// One access recorded by the checker.
struct Access {
  int stream = 0;     // stream id; 0 is the legacy default stream
  uint64_t tick = 0;  // the stream's tick of this access
  bool write = false;
  const char* what = "";  // "kernel", "cudaMemcpyAsync", "ncclAllReduce", ...
  const char* file = "";
  int line = 0;
};

// An earlier access that a new one is not ordered after, and where they meet.
struct Conflict {
  Access earlier;
  size_t begin = 0, end = 0;  // byte offsets in the allocation
};

// The accesses of one allocation, by byte range: for each range the last write
// and the reads since it that no later read is known to follow (at most one
// per stream). Accesses to disjoint ranges never meet.
class History {
 public:
  // Checks an access to bytes [begin, end) by a stream whose clock is `seen`
  // (seen[a.stream] == a.tick) and records it. Returns the first conflict
  // found; nothing is recorded then.
  std::optional<Conflict> access(size_t begin, size_t end, const Access& a, const Clock& seen);
  // The first recorded access not ordered before `seen` (the host, at a free).
  std::optional<Conflict> pending(const Clock& seen) const;
  size_t segments() const { return segs_.size(); }

 private:
  struct Segment {
    size_t end = 0;
    std::optional<Access> write;
    std::vector<Access> reads;
  };
  void split(size_t at);                 // a segment boundary at `at`
  void cover(size_t begin, size_t end);  // segments tile [begin, end), gaps filled
  std::optional<Conflict> check(size_t begin, size_t end, const Access& a, const Clock& seen) const;
  std::map<size_t, Segment> segs_;  // by first byte; disjoint
};

// ---- for the emulated libraries ---------------------------------------------------

// Is `stream` a live stream (or nullptr, the legacy default stream)?
bool stream_valid(cudaStream_t stream);

// Where [ptr, ptr + bytes) lies.
enum class Memory {
  kDevice,   // inside one cudaMalloc'd block: tracked
  kPinned,   // inside one cudaMallocHost'd block: device-accessible, not tracked
  kHost,     // outside both tables: the host's, not tracked
  kOutside,  // starts in a block and runs past its end
};
Memory memory_of(const void* ptr, size_t bytes);

// An op issued on `stream` (valid) accesses [ptr, ptr + bytes): orders the
// stream after the host, ticks it, and checks and records the access if the
// bytes are device memory; aborts the process on a violation. Returns false,
// recording nothing, when the range runs past the end of its block.
bool op_access(cudaStream_t stream, const void* ptr, size_t bytes, bool write, const char* what,
               const char* file, int line);

}  // namespace amsp::emu
