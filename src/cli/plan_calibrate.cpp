#include "cli/plan_calibrate.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "plan/calibration.h"

namespace amsp::cli {
namespace {

using namespace amsp::plan;

// Published and predicted MFU may differ by this much (the goal).
constexpr double kGoal = 0.05;

std::string row_text(const CalibrationRow& r) {
  const PublishedPoint& p = r.point;
  char buf[320];
  const std::string m = p.micro_batches > 0 ? std::to_string(p.micro_batches) : "4M tok";
  const double diff = r.predicted - p.mfu;
  std::snprintf(buf, sizeof buf, "%-8s %-9s %5lld %6s %-4s %-17s %-22s %5.2f %6.2f %+6.2f %-4s %7.3f %7.3f",
                p.source.c_str(), p.model.c_str(), static_cast<long long>(p.gpus), m.c_str(),
                p.recompute ? "full" : "none", system_name(p.system),
                to_string(r.eval.plan).c_str(), p.mfu, r.predicted, diff,
                !r.fits ? "OOM" : std::fabs(diff) <= kGoal ? "ok" : "OFF",
                r.eval.cost.step_s, r.eval.cost.exposed_s);
  return buf;
}

}  // namespace

int print_calibration(std::ostream& os, const Cluster& cluster, bool json) {
  const std::vector<CalibrationRow> rows = calibrate(cluster);
  int within = 0;
  double worst = 0;
  for (const CalibrationRow& r : rows) {
    const double diff = std::fabs(r.predicted - r.point.mfu);
    within += r.fits && diff <= kGoal;
    worst = std::max(worst, diff);
  }
  if (json) {
    nlohmann::ordered_json j;
    j["cluster"] = cluster.name;
    j["goal"] = kGoal;
    j["within_goal"] = within;
    for (const CalibrationRow& r : rows)
      j["rows"].push_back({{"source", r.point.source}, {"model", r.point.model},
                           {"gpus", r.point.gpus}, {"micro_batches", r.point.micro_batches},
                           {"recompute", r.point.recompute}, {"system", system_name(r.point.system)},
                           {"plan", to_string(r.eval.plan)}, {"fits", r.fits},
                           {"published_mfu", r.point.mfu}, {"predicted_mfu", r.predicted},
                           {"step_time_s", r.eval.cost.step_s},
                           {"exposed_comm_s", r.eval.cost.exposed_s},
                           {"optimizer_s", r.eval.cost.optimizer_s}});
    os << j.dump(2) << "\n";
    return 0;
  }
  os << "amsp plan --calibrate: the cost model on cluster " << cluster.name
     << " beside the MFU the AMSP paper measured (8 A800 per node, sequence 4096,\n"
        "micro-batch 1, bf16; M = micro-batches per step, else a 4M-token batch; with\n"
        "recomputation the paper's MFU counts the recomputed forward)\n\n";
  os << "source   model       GPUs      M rec  system            plan                   "
        "publ.  pred.   diff      step s  exposed\n";
  for (const CalibrationRow& r : rows) os << row_text(r) << "\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "\n%d of %zu within %.2f MFU of the published figure; worst %.2f\n",
                within, rows.size(), kGoal, worst);
  os << buf;
  return 0;
}

}  // namespace amsp::cli
