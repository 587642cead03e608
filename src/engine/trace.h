// A timeline of training steps in the Chrome trace format (chrome://tracing,
// Perfetto): per rank, a track for compute (each unit's forward and backward,
// the optimizer), one for the time compute spent blocked waiting on
// communication, and one per communication group showing each collective from
// issue to completion. Written by `amsp train --trace FILE`.
#pragma once

#include <mpi.h>

#include <mutex>
#include <string>
#include <vector>

namespace amsp::engine {

class Trace {
 public:
  // Timestamps are taken against an origin agreed at a barrier of comm.
  explicit Trace(MPI_Comm comm);

  // Events are kept only while recording (the trainer records a few steps).
  void set_recording(bool on) { recording_ = on; }
  bool recording() const { return recording_; }

  // One span on `track`, times in comm::now_seconds(). Thread-safe.
  void span(const std::string& track, const std::string& name, double start_s, double end_s);

  // Gathers every rank's events to rank 0, which writes the file (collective).
  void write(const std::string& path) const;

 private:
  struct Event {
    std::string track, name;
    double start_s, end_s;
  };
  MPI_Comm comm_;
  double origin_s_ = 0;
  bool recording_ = false;
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

}  // namespace amsp::engine
