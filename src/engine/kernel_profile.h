// `amsp train --kernel-profile FILE.json`: the time of every backend call by
// name, summed over the run's steps, beside the step time (doc/metrics.md,
// "Kernel profile"). The backend's calls are timed by a ProfiledBackend
// (backend/profiled_backend.h); this adds them up per step and reports them.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/profiled_backend.h"

namespace amsp::engine {

class KernelProfile {
 public:
  explicit KernelProfile(backend::ProfiledBackend& backend) : be_(backend) {}

  // Around one optimizer step: the backend's calls are timed in between, and
  // end_step waits for the device to finish them (so that a step's time
  // covers its device work; profiling may synchronise, a normal run does not).
  void begin_step();
  void end_step();
  // The step's wall time, taken after end_step. A counted step adds its time
  // and its calls to the profile; an uncounted one (the warm-up) drops them.
  void add_step(int64_t step, double step_ms, bool counted);

  // After the last step (rank 0, before the profile is written at the end): the
  // device's copy bandwidth, the reference for each kernel's GB/s. A same-dtype
  // copy through the backend (cudaMemcpyAsync on CUDA, memcpy on the CPU) of
  // 128 MiB (16 MiB on the CPU), read and written: the best of 5 after one to
  // warm up; left out if the buffers do not fit. The
  // profile's memory figures are taken before it allocates.
  void measure_copy_bandwidth();

  // The whole profile (doc/metrics.md), kernels by total time, most first.
  nlohmann::ordered_json json() const;
  // The `rows` kernels that took longest, as a table for the console.
  std::string table(int rows) const;

 private:
  struct Total {
    std::string op;
    int64_t calls = 0;
    double ms = 0;
    int64_t min_bytes = 0;  // summed over the calls
  };
  backend::ProfiledBackend& be_;
  std::map<std::string, Total> totals_;  // by name
  std::map<std::pair<std::string, std::string>, backend::IdleTime> idle_;  // by (after, before)
  std::vector<double> step_ms_;          // counted steps
  int64_t first_step_ = 0, last_step_ = 0;
  double copy_gb_s_ = 0;                     // measure_copy_bandwidth's, 0 before
  std::optional<backend::MemoryStats> mem_;  // taken before it

  struct Summary {
    double steps = 1;        // counted steps, at least 1 (a divisor)
    double kernel_ms = 0;    // summed over kernels and steps
    double idle_ms = 0;      // between calls, summed over pairs and steps
    int64_t idle_gaps = 0;
    double step_mean = 0, step_median = 0;
  };
  Summary summary() const;
  // Names by total time, most first.
  std::vector<std::pair<std::string, Total>> ranked() const;
  // Pairs by total idle time, most first.
  std::vector<std::pair<std::pair<std::string, std::string>, backend::IdleTime>> ranked_idle()
      const;
  nlohmann::ordered_json idle_json(const Summary& s) const;
  // The idle time's line and its `rows` largest pairs, for the console.
  std::string idle_table(const Summary& s, int rows) const;
};

}  // namespace amsp::engine
