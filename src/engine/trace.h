// A timeline of training steps in the Chrome trace format (chrome://tracing,
// Perfetto): per rank, a track for compute (each unit's forward and backward,
// the optimizer), one for the time compute spent blocked waiting on
// communication, and one per communication group showing each collective from
// issue to completion. Written by `amsp train --trace FILE`.
//
// A collective's spans (its time in flight, and waits for it) carry its
// identity in their args, the same on every member of its group: the group
// (the mesh position of its first member) and the op's sequence number on the
// group's communicator. Those match one rank's spans with the others' for the
// same collective (benchmarks/plan_validation.py, `joined` and `late_ms`).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace amsp::engine {

// Which collective a span is about (see above).
struct Collective {
  int64_t group = -1;
  uint64_t seq = 0;  // 0: the span is not a collective's
};

class Trace {
 public:
  // Timestamps are taken against an origin agreed at a barrier of comm.
  explicit Trace(MPI_Comm comm);

  // Events are kept only while recording (the trainer records a few steps).
  void set_recording(bool on) { recording_ = on; }
  bool recording() const { return recording_; }

  // One span on `track`, times in comm::now_seconds(). Thread-safe.
  void span(const std::string& track, const std::string& name, double start_s, double end_s,
            Collective c = {});

  // Gathers every rank's events to rank 0, which writes the file (collective).
  void write(const std::string& path) const;

 private:
  struct Event {
    std::string track, name;
    double start_s, end_s;
    Collective c;
  };
  MPI_Comm comm_;
  double origin_s_ = 0;
  bool recording_ = false;
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

}  // namespace amsp::engine
