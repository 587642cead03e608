#include "engine/compress_guard.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "comm/timed.h"
#include "core/error.h"

namespace amsp::engine {

bool guard_due(const CompressionGuard& g, const plan::Compression& active, int64_t step) {
  return g.mode != CompressionGuard::kOff && active.any() && (step - 1) % g.every == 0;
}

namespace {

double relative(double diff, double exact) {
  if (exact > 0) return std::sqrt(diff / exact);
  return diff > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100 * x);
  return buf;
}

}  // namespace

GuardReading measure_guard(ShardedEngine& engine, float grad_scale, const BatchFn& batch, double timeout_s) {
  const plan::Compression c = engine.compression();
  const GuardSums s = engine.guard_sums(grad_scale, batch);
  double sums[3] = {s.exact, s.p_diff, s.g_diff};
  comm::allreduce_sum(sums, 3, MPI_COMM_WORLD, "compression guard", timeout_s);
  GuardReading r;
  if (c.p_bits) r.p_err = relative(sums[1], sums[0]);
  if (c.g_bits) r.g_err = relative(sums[2], sums[0]);
  return r;
}

GuardVerdict judge_guard(const CompressionGuard& g, const GuardReading& r, const plan::Compression& active,
                         int64_t step) {
  GuardVerdict v;
  plan::Compression next = active;
  auto check = [&](const std::optional<double>& err, int& bits, const char* what) {
    if (!err || !(*err > g.threshold || std::isnan(*err))) return;
    std::string line = cat("compress guard: step ", step, ": ", what, " as int", bits, " move one micro-batch's gradient by ",
                           percent(*err), " (|compressed - exact| / |exact|; threshold ", percent(g.threshold), ")");
    if (g.mode == CompressionGuard::kFallback) {
      line += cat("; they go uncompressed from step ", step, " on");
      bits = 0;
    } else {
      line += "; --compress-guard fallback would stop compressing them";
    }
    v.warnings.push_back(line);
  };
  check(r.p_err, next.p_bits, "the parameters' all-gathers");
  check(r.g_err, next.g_bits, "the gradients' reductions");
  if (!(next == active)) v.next = next;
  return v;
}

std::optional<plan::Compression> resumed_compression(const std::string& checkpoint_options,
                                                     const plan::Compression& requested) {
  const nlohmann::json j = nlohmann::json::parse(checkpoint_options, nullptr, false);
  if (!j.is_object() || !j.contains("compress_active") || !j.contains("compress")) return std::nullopt;
  if (j["compress"] != plan::to_string(requested)) return std::nullopt;
  return plan::parse_compression(j["compress_active"].get<std::string>());
}

}  // namespace amsp::engine
