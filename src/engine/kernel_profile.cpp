#include "engine/kernel_profile.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <numeric>

namespace amsp::engine {

namespace {

// A name's least bytes over its time: the bandwidth it used, if it moved no more.
template <typename T>
double gb_per_s(const T& t) {
  return t.ms > 0 ? static_cast<double>(t.min_bytes) / (t.ms * 1e6) : 0;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

void KernelProfile::begin_step() { be_.set_timing(true); }

void KernelProfile::end_step() {
  be_.set_timing(false);
  be_.synchronize();
}

void KernelProfile::add_step(int64_t step, double step_ms, bool counted) {
  const std::vector<backend::KernelTime> times = be_.take();
  if (!counted) return;
  for (const backend::KernelTime& k : times) {
    Total& t = totals_[k.name];
    t.op = k.op;
    t.calls += k.calls;
    t.ms += k.ms;
    t.min_bytes += k.min_bytes;
  }
  for (const backend::IdleTime& g : be_.idle()) idle_[{g.after, g.before}].add(g);
  if (step_ms_.empty()) first_step_ = step;
  last_step_ = step;
  step_ms_.push_back(step_ms);
}

void KernelProfile::measure_copy_bandwidth() {
  mem_ = be_.memory();
  const int64_t count = (be_.device() == Device::kCpu ? 16 : 128) << 18;  // 16 or 128 MiB of fp32
  backend::Buffer src, dst;
  try {  // the run is over: a device too full for the buffers leaves the figure out
    src = be_.alloc(DType::kF32, count);
    dst = be_.alloc(DType::kF32, count);
  } catch (const std::exception&) {
    return;
  }
  double best_ms = 0;
  for (int i = 0; i < 6; ++i) {
    be_.set_timing(true);
    be_.copy(src.view(), dst.view());
    be_.set_timing(false);
    const std::vector<backend::KernelTime> t = be_.take();
    if (i > 0 && t.size() == 1 && t[0].ms > 0 && (best_ms == 0 || t[0].ms < best_ms))
      best_ms = t[0].ms;
  }
  copy_gb_s_ = best_ms > 0 ? 2.0 * static_cast<double>(count) * 4 / (best_ms * 1e6) : 0;
}

KernelProfile::Summary KernelProfile::summary() const {
  Summary s;
  s.steps = static_cast<double>(std::max<size_t>(1, step_ms_.size()));
  for (const auto& [name, t] : totals_) s.kernel_ms += t.ms;
  for (const auto& [pair, i] : idle_) {
    s.idle_ms += i.ms;
    s.idle_gaps += i.gaps;
  }
  s.step_mean = std::accumulate(step_ms_.begin(), step_ms_.end(), 0.0) / s.steps;
  s.step_median = median(step_ms_);
  return s;
}

std::vector<std::pair<std::string, KernelProfile::Total>> KernelProfile::ranked() const {
  std::vector<std::pair<std::string, Total>> out(totals_.begin(), totals_.end());
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  return out;
}

std::vector<std::pair<std::pair<std::string, std::string>, backend::IdleTime>>
KernelProfile::ranked_idle() const {
  std::vector<std::pair<std::pair<std::string, std::string>, backend::IdleTime>> out(idle_.begin(),
                                                                                     idle_.end());
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  return out;
}

nlohmann::ordered_json KernelProfile::idle_json(const Summary& s) const {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& [pair, i] : ranked_idle())
    out.push_back({{"after", pair.first},
                   {"before", pair.second},
                   {"gaps", i.gaps},
                   {"total_ms", i.ms},
                   {"ms_per_step", i.ms / s.steps},
                   {"max_ms", i.max_ms}});
  return out;
}

nlohmann::ordered_json KernelProfile::json() const {
  const Summary s = summary();
  nlohmann::ordered_json kernels = nlohmann::ordered_json::array();
  for (const auto& [name, t] : ranked()) {
    const double gb_s = gb_per_s(t);
    kernels.push_back(
        {{"name", name},
         {"op", t.op},
         {"calls", t.calls},
         {"total_ms", t.ms},
         {"ms_per_step", t.ms / s.steps},
         {"share", s.kernel_ms > 0 ? t.ms / s.kernel_ms : 0.0},
         {"min_bytes", t.min_bytes},
         {"gb_per_s", gb_s},
         {"of_copy", copy_gb_s_ > 0 ? nlohmann::ordered_json(gb_s / copy_gb_s_) : nullptr}});
  }
  const backend::MemoryStats mem = mem_ ? *mem_ : be_.memory();
  return {
      {"device", be_.describe()},
      {"steps", step_ms_.size()},
      {"first_step", first_step_},
      {"last_step", last_step_},
      {"step_ms_median", s.step_median},
      {"step_ms_mean", s.step_mean},
      {"kernel_ms_per_step", s.kernel_ms / s.steps},
      {"unaccounted_ms_per_step", s.step_mean - s.kernel_ms / s.steps},
      {"idle_ms_per_step", s.idle_ms / s.steps},
      {"idle_gaps_per_step", static_cast<double>(s.idle_gaps) / s.steps},
      {"copy_gb_per_s", copy_gb_s_ > 0 ? nlohmann::ordered_json(copy_gb_s_) : nullptr},
      {"mem_peak_bytes", mem.peak},
      {"mem_reserved_bytes", be_.device() == Device::kCpu ? nlohmann::ordered_json()
                                                          : nlohmann::ordered_json(mem.reserved)},
      {"kernels", kernels},
      {"idle", idle_json(s)}};
}

std::string KernelProfile::table(int rows) const {
  const Summary s = summary();
  char line[512];
  std::snprintf(
      line, sizeof line,
      "kernel profile: steps %lld-%lld (%zu) on %s: step %.2f ms (median), kernels %.2f ms, "
      "unaccounted %.2f ms per step; device copy %.1f GB/s\n%10s %7s %11s %9s %8s  %s\n",
      static_cast<long long>(first_step_), static_cast<long long>(last_step_), step_ms_.size(),
      be_.describe().c_str(), s.step_median, s.kernel_ms / s.steps,
      s.step_mean - s.kernel_ms / s.steps, copy_gb_s_, "ms/step", "share", "calls/step", "GB/s",
      "of copy", "kernel");
  std::string out = line;
  const auto all = ranked();
  for (size_t i = 0; i < all.size() && i < static_cast<size_t>(rows); ++i) {
    const Total& t = all[i].second;
    const double gb_s = gb_per_s(t);
    std::snprintf(line, sizeof line, "%10.3f %6.1f%% %11.1f %9.1f %7.0f%%  %s\n", t.ms / s.steps,
                  s.kernel_ms > 0 ? 100.0 * t.ms / s.kernel_ms : 0.0,
                  static_cast<double>(t.calls) / s.steps, gb_s,
                  copy_gb_s_ > 0 ? 100.0 * gb_s / copy_gb_s_ : 0.0, all[i].first.c_str());
    out += line;
  }
  if (all.size() > static_cast<size_t>(rows))
    out += std::to_string(all.size() - static_cast<size_t>(rows)) + " more in the file\n";
  return out + idle_table(s, 3);
}

std::string KernelProfile::idle_table(const Summary& s, int rows) const {
  char line[512];
  std::snprintf(line, sizeof line, "idle between calls: %.2f ms per step over %.0f gaps%s\n",
                s.idle_ms / s.steps, static_cast<double>(s.idle_gaps) / s.steps,
                idle_.empty() ? "" : "; the most by pair (ms/step, after -> before):");
  std::string out = line;
  const auto idle = ranked_idle();
  for (size_t i = 0; i < idle.size() && i < static_cast<size_t>(rows); ++i) {
    std::snprintf(line, sizeof line, "%10.3f  %s -> %s\n", idle[i].second.ms / s.steps,
                  idle[i].first.first.c_str(), idle[i].first.second.c_str());
    out += line;
  }
  return out;
}

}  // namespace amsp::engine
