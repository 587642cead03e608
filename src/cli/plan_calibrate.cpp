#include "cli/plan_calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plan/calibration.h"

namespace amsp::cli {
namespace {

using namespace amsp::plan;

// Published and predicted MFU may differ by this much (the goal).
constexpr double kGoal = 0.05;

// A row the goal counts: the plan fits and its prediction is within kGoal of
// a published figure.
bool within_goal(const CalibrationRow& r) {
  return r.fits && r.point.mfu && std::fabs(r.predicted - *r.point.mfu) <= kGoal;
}

// OOM, or beside the published figure ok or OFF; nothing where the paper gives none.
const char* verdict(const CalibrationRow& r) {
  if (!r.fits) return "OOM";
  if (!r.point.mfu) return "";
  return within_goal(r) ? "ok" : "OFF";
}

struct Summary {
  size_t published = 0;  // rows with a published figure
  int within = 0;        // of them, fitting and within kGoal
  double worst = 0;      // the largest difference
};

Summary summarize(const std::vector<CalibrationRow>& rows) {
  Summary s;
  for (const CalibrationRow& r : rows) {
    if (!r.point.mfu) continue;
    ++s.published;
    s.within += within_goal(r);
    s.worst = std::max(s.worst, std::fabs(r.predicted - *r.point.mfu));
  }
  return s;
}

std::string row_text(const CalibrationRow& r) {
  const PublishedPoint& p = r.point;
  const std::string m = p.micro_batches > 0 ? std::to_string(p.micro_batches) : "4M tok";
  char publ[16] = "-", diff[16] = "-";
  if (p.mfu) {
    std::snprintf(publ, sizeof publ, "%.2f", *p.mfu);
    std::snprintf(diff, sizeof diff, "%+.2f", r.predicted - *p.mfu);
  }
  char buf[320];
  std::snprintf(buf, sizeof buf, "%-8s %-9s %5lld %6s %-4s %-18s %-22s %5s %6.2f %6s %-4s %7.3f %7.3f",
                p.source.c_str(), p.model.c_str(), static_cast<long long>(p.gpus), m.c_str(),
                p.recompute ? "full" : "none", system_name(p.system),
                to_string(r.eval.plan).c_str(), publ, r.predicted, diff, verdict(r),
                r.eval.cost.step_s, r.eval.cost.exposed_s);
  return buf;
}

nlohmann::ordered_json row_json(const CalibrationRow& r) {
  return {{"source", r.point.source}, {"model", r.point.model},
          {"gpus", r.point.gpus}, {"micro_batches", r.point.micro_batches},
          {"recompute", r.point.recompute}, {"system", system_name(r.point.system)},
          {"plan", to_string(r.eval.plan)}, {"fits", r.fits},
          {"published_mfu", r.point.mfu ? nlohmann::ordered_json(*r.point.mfu) : nullptr},
          {"predicted_mfu", r.predicted},
          {"step_time_s", r.eval.cost.step_s},
          {"exposed_comm_s", r.eval.cost.exposed_s},
          {"optimizer_s", r.eval.cost.optimizer_s}};
}

}  // namespace

int print_calibration(std::ostream& os, const Cluster& cluster, bool json) {
  const std::vector<CalibrationRow> rows = calibrate(cluster);
  const Summary s = summarize(rows);
  if (json) {
    nlohmann::ordered_json j;
    j["cluster"] = cluster.name;
    j["goal"] = kGoal;
    j["published_points"] = s.published;
    j["within_goal"] = s.within;
    for (const CalibrationRow& r : rows) j["rows"].push_back(row_json(r));
    os << j.dump(2) << "\n";
    return 0;
  }
  os << "amsp plan --calibrate: the cost model on cluster " << cluster.name
     << " beside the MFU the AMSP paper measured (8 A800 per node, sequence 4096,\n"
        "micro-batch 1, bf16; M = micro-batches per step, else a 4M-token batch; MFU counts\n"
        "model FLOPs, not the recomputed forward; AMSP, paper's plan: the plan the paper ran,\n"
        "evaluated as given; -: no published figure)\n\n";
  os << "source   model       GPUs      M rec  system             plan                   "
        "publ.  pred.   diff      step s  exposed\n";
  for (const CalibrationRow& r : rows) os << row_text(r) << "\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "\n%d of %zu within %.2f MFU of the published figure; worst %.2f\n",
                s.within, s.published, kGoal, s.worst);
  os << buf;
  return 0;
}

}  // namespace amsp::cli
