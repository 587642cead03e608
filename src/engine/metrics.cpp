#include "engine/metrics.h"

#include <unistd.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace amsp::engine {
namespace {

// {"a.h5": 2.81, ...}; a source without a held-out window has null (NaN).
nlohmann::json loss_object(const std::vector<std::pair<std::string, double>>& losses) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [path, loss] : losses) j[path] = std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json();
  return j;
}

// The step's console line.
void print_line(const StepMetrics& m) {
  double sent = 0, exposed_ms = 0;
  for (const auto& g : m.comm) {
    const comm::OpStats t = g.total();
    sent += static_cast<double>(t.bytes_sent);
    exposed_ms += t.exposed_s * 1e3;
  }
  const int width = static_cast<int>(std::to_string(m.total_steps).size());
  std::printf("step %*lld/%lld | loss %.4f | lr %.3e | grad norm %.4f | %8.1f ms | %9.0f tok/s | MFU %5.1f%%",
              width, static_cast<long long>(m.step), static_cast<long long>(m.total_steps), m.loss,
              m.lr, m.grad_norm, m.step_ms, m.tokens_per_s, 100.0 * m.mfu);
  if (!m.comm.empty()) std::printf(" | comm %.2f MB, exposed %.1f ms", sent / 1e6, exposed_ms);
  if (m.ckpt_stall_ms) std::printf(" | ckpt stall %.1f ms", *m.ckpt_stall_ms);
  if (m.ckpt_write_ms) std::printf(" | ckpt write %.1f ms", *m.ckpt_write_ms);
  if (m.ckpt_update_wait_ms && *m.ckpt_update_wait_ms >= 0.1)
    std::printf(" | ckpt wait %.1f ms", *m.ckpt_update_wait_ms);
  std::printf("\n");
}

// Per group and op: calls, bytes and time, and their sums over the step.
void add_comm(const StepMetrics& m, nlohmann::json& j) {
  nlohmann::json groups = nlohmann::json::object();
  double in_flight_ms = 0, exposed_ms = 0;
  int64_t bytes_sent = 0;
  for (const auto& g : m.comm) {
    nlohmann::json ops = nlohmann::json::object();
    for (comm::Op op : comm::kAllOps) {
      const comm::OpStats& o = g[op];
      if (o.calls == 0) continue;
      ops[comm::op_name(op)] = {{"calls", o.calls},
                                {"bytes_sent", o.bytes_sent},
                                {"bytes_received", o.bytes_received},
                                {"in_flight_ms", o.in_flight_s * 1e3},
                                {"exposed_ms", o.exposed_s * 1e3}};
      bytes_sent += o.bytes_sent;
      in_flight_ms += o.in_flight_s * 1e3;
      exposed_ms += o.exposed_s * 1e3;
    }
    groups[g.group] = ops;
  }
  j["comm"] = groups;
  j["comm_bytes_sent"] = bytes_sent;
  j["comm_in_flight_ms"] = in_flight_ms;
  j["comm_exposed_ms"] = exposed_ms;
}

// The step's line of the --metrics file (doc/metrics.md).
nlohmann::json step_json(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},       {"loss", m.loss},
                      {"lr", m.lr},           {"grad_norm", m.grad_norm},
                      {"step_ms", m.step_ms}, {"tokens_per_s", m.tokens_per_s},
                      {"mfu", m.mfu},         {"tokens", m.tokens}};
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  if (!m.val_loss_sources.empty()) j["val_loss_sources"] = loss_object(m.val_loss_sources);
  if (!m.source_tokens.empty()) {
    nlohmann::json tokens = nlohmann::json::object();
    for (const auto& [path, n] : m.source_tokens) tokens[path] = n;
    j["source_tokens"] = tokens;
  }
  j["model_state_bytes"] = m.model_state_bytes;
  j["temporary_bytes"] = m.temporary_bytes;
  j["activation_bytes"] = m.activation_bytes;
  j["mem_peak_bytes"] = m.mem_peak_bytes;
  j["mem_predicted_bytes"] = m.mem_predicted_bytes;
  if (m.mem_reserved_bytes) j["mem_reserved_bytes"] = *m.mem_reserved_bytes;
  if (m.host_syncs) j["host_syncs"] = *m.host_syncs;
  if (m.host_issue_ms) j["host_issue_ms"] = *m.host_issue_ms;
  j["rss_peak_bytes"] = m.rss_peak_bytes;
  add_comm(m, j);
  j["busy_ms"] = m.busy_ms;
  if (m.busy)
    j["busy_window"] = {{"ms_per_rank", m.busy->busy_ms},
                        {"median_ms", m.busy->median_ms},
                        {"slowest_rank", m.busy->slowest},
                        {"excess", m.busy->excess},
                        {"straggler", m.busy->straggler >= 0 ? nlohmann::json(m.busy->straggler)
                                                             : nlohmann::json()}};
  if (m.compress_err_p) j["compress_err_p"] = *m.compress_err_p;
  if (m.compress_err_g) j["compress_err_g"] = *m.compress_err_g;
  if (m.ckpt_stall_ms) j["ckpt_stall_ms"] = *m.ckpt_stall_ms;
  if (m.ckpt_write_ms) j["ckpt_write_ms"] = *m.ckpt_write_ms;
  if (m.ckpt_update_wait_ms) j["ckpt_update_wait_ms"] = *m.ckpt_update_wait_ms;
  return j;
}

}  // namespace

MetricsSink::MetricsSink(const std::string& path, bool append) {
  tty_ = isatty(STDOUT_FILENO) != 0;
  if (path.empty()) return;
  file_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!file_) fail_usage("--metrics ", path, ": cannot create the file");
}

void MetricsSink::clear_status() {
  if (status_shown_) std::printf("\r\033[K");
  status_shown_ = false;
}

void MetricsSink::step(const StepMetrics& m) {
  clear_status();
  print_line(m);
  elapsed_ms_ += m.step_ms;
  if (tty_ && m.step < m.total_steps) draw_progress(m);
  std::fflush(stdout);
  if (file_.is_open()) {
    file_ << step_json(m).dump() << "\n";
    file_.flush();
  }
}

// A progress bar under the log lines, redrawn in place.
void MetricsSink::draw_progress(const StepMetrics& m) {
  const int kBar = 30;
  const int filled = static_cast<int>(kBar * m.step / std::max<int64_t>(1, m.total_steps));
  const double eta_s = elapsed_ms_ / m.step * (m.total_steps - m.step) / 1000.0;
  std::printf("[%s%s] %lld/%lld  ETA %dm%02ds", std::string(filled, '#').c_str(),
              std::string(kBar - filled, '.').c_str(), static_cast<long long>(m.step),
              static_cast<long long>(m.total_steps), static_cast<int>(eta_s) / 60,
              static_cast<int>(eta_s) % 60);
  status_shown_ = true;
}

void MetricsSink::eval(int64_t step, double val_loss, int64_t windows,
                       const std::vector<std::pair<std::string, double>>& sources) {
  clear_status();
  std::printf("eval step %lld | val loss %.4f | %lld windows", static_cast<long long>(step),
              val_loss, static_cast<long long>(windows));
  for (size_t i = 0; i < sources.size(); ++i)
    std::printf("%s%s %.4f", i ? ", " : " | ", sources[i].first.c_str(), sources[i].second);
  std::printf("\n");
  std::fflush(stdout);
  if (file_.is_open() && step == 0) {
    // Steps >= 1 carry val_loss in their own line; the initial one stands alone.
    nlohmann::json j = {{"step", 0}, {"val_loss", val_loss}};
    if (!sources.empty()) j["val_loss_sources"] = loss_object(sources);
    file_ << j.dump() << "\n";
    file_.flush();
  }
}

void MetricsSink::finish(double seconds, int64_t first_step, int64_t last_step, int64_t total_steps) {
  clear_status();
  const auto steps = [](int64_t s) { return static_cast<long long>(s); };
  std::printf("%s: this attempt ", last_step == total_steps ? "done" : "stopped");
  if (last_step >= first_step)
    std::printf("trained steps %lld-%lld (%lld)", steps(first_step), steps(last_step), steps(last_step - first_step + 1));
  else
    std::printf("trained no steps");
  std::printf(" in %.1f s; the run: %lld of %lld steps\n", seconds, steps(last_step), steps(total_steps));
  std::fflush(stdout);
}

}  // namespace amsp::engine
