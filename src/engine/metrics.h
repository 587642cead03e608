// What a training step reports: one fixed-format console line on rank 0 and
// the same fields as a JSON line in --metrics FILE. Field names are stable;
// doc/metrics.md defines each.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/stats.h"
#include "engine/straggler.h"

namespace amsp::engine {

struct StepMetrics {
  int64_t step = 0;         // 1-based optimizer step
  int64_t total_steps = 0;
  double loss = 0;          // mean cross-entropy over the step's tokens
  double lr = 0;
  double grad_norm = 0;     // global L2 norm before clipping
  double step_ms = 0;
  double tokens_per_s = 0;
  double mfu = 0;           // fraction of peak
  int64_t tokens = 0;       // tokens consumed so far
  int64_t model_state_bytes = 0;   // this rank's P-, G- and OS-shards
  int64_t temporary_bytes = 0;     // its gathered units and reduction slots
  int64_t activation_bytes = 0;    // what its model allocated for activations
  int64_t mem_peak_bytes = 0;      // its backend allocator's high-water mark (Backend::memory().peak)
  int64_t mem_predicted_bytes = 0; // the plan's prediction of that peak (what the engine reserved)
  std::optional<int64_t> mem_reserved_bytes;  // a caching device allocator's bytes held from the device
  std::optional<int64_t> host_syncs;  // on a device: times the host waited for it during the step
  std::optional<double> host_issue_ms;  // on a device: the host's time to enqueue the step
  int64_t rss_peak_bytes = 0;      // the process's peak resident set (getrusage)
  std::vector<comm::Stats> comm;   // this rank's collectives during the step, per group
  double busy_ms = 0;              // on a device the step less its waits in collectives, on the CPU its computing threads' CPU time
  std::optional<BusySpread> busy;  // at the end of a straggler window: every rank's busy time
  std::optional<double> val_loss;
  // With a data mixture (several --data sources), keyed by the source's path:
  std::vector<std::pair<std::string, int64_t>> source_tokens;   // tokens drawn from it so far
  std::vector<std::pair<std::string, double>> val_loss_sources;  // its held-out loss, with val_loss
  // The compression guard's reading before this step (compress_guard.h):
  std::optional<double> compress_err_p;  // |compressed - exact| / |exact| with the P all-gathers compressed
  std::optional<double> compress_err_g;  // the same with the gradient reductions compressed
  std::optional<double> ckpt_stall_ms;  // a checkpoint was saved after this step: training blocked
  std::optional<double> ckpt_write_ms;  // a background write finished since the last step's report
  std::optional<double> ckpt_update_wait_ms;  // the step after a background save: its updates' wait for the snapshot
};

class MetricsSink {
 public:
  // path empty: console only. Throws UsageError naming --metrics if the file
  // cannot be created.
  // append: keep what the file holds (a resumed run continues its metrics).
  explicit MetricsSink(const std::string& path, bool append = false);
  void step(const StepMetrics& m);
  // sources: a mixture's held-out loss per source (empty for one dataset).
  void eval(int64_t step, double val_loss, int64_t windows,
            const std::vector<std::pair<std::string, double>>& sources = {});
  // The closing line: this attempt's steps first_step..last_step and time, and
  // the run's progress (a resumed attempt starts after step 1).
  void finish(double seconds, int64_t first_step, int64_t last_step, int64_t total_steps);

 private:
  std::ofstream file_;
  bool tty_ = false;
  bool status_shown_ = false;
  double elapsed_ms_ = 0;
  void clear_status();
  void draw_progress(const StepMetrics& m);
};

}  // namespace amsp::engine
