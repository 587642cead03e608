// How a backend times the work of its calls for the kernel profile
// (backend/profiled_backend.h, `amsp train --kernel-profile`). Each backend
// makes its own (Backend::make_stream_timer): the time a call's work took is
// the host's wall time around the call on a backend whose calls finish before
// they return (the CPU), and the time between two events on the compute stream
// on one whose calls only enqueue (CUDA).
#pragma once

#include <memory>
#include <vector>

namespace amsp::backend {

class StreamTimer {
 public:
  virtual ~StreamTimer() = default;

  // What one call's work took: `slot` is the caller's name for the call.
  // `idle_ms`: the time from the previous stretch's end to this one's start,
  // on the same clock (the device's between events, the host's between
  // calls), where nothing timed ran: -1 for the first stretch after a take.
  struct Stretch {
    int slot = 0;
    double ms = 0;
    double idle_ms = -1;
  };

  // start() just before a call and stop(slot) just after it returned; pairs
  // do not nest. Neither waits for the device.
  virtual void start() = 0;
  virtual void stop(int slot) = 0;
  // Every stretch stopped since the last take, in stop order; waits for the
  // device to finish the work they cover. The next stretch starts a new
  // chain: its idle_ms is -1.
  virtual std::vector<Stretch> take() = 0;
};

// Wall time around each call, for a backend whose calls have finished their
// work when they return.
std::unique_ptr<StreamTimer> make_host_timer();

}  // namespace amsp::backend
