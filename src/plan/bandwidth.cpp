#include "plan/bandwidth.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "model/config.h"
#include "plan/memory.h"

namespace amsp::plan {
namespace fs = std::filesystem;
using nlohmann::json;

BandwidthTable::BandwidthTable(const comm::BandwidthTable& table, std::string source)
    : source_(std::move(source)) {
  for (const comm::BandwidthEntry& e : table.entries) {
    // A group of one measures nothing; an empty size prices nothing.
    if (e.ranks_per_node * e.nodes < 2 || e.bytes <= 0) continue;
    comm::BandwidthTable& curve = curves_[{static_cast<int>(e.op), e.ranks_per_node, e.nodes}];
    curve.cluster = table.cluster;
    curve.backend = table.backend;
    curve.dtype = table.dtype;
    curve.entries.push_back(e);
  }
}

bool BandwidthTable::has(comm::Op op, bool inter) const {
  for (const auto& [key, curve] : curves_)
    if (std::get<0>(key) == static_cast<int>(op) && (std::get<2>(key) > 1) == inter) return true;
  return false;
}

double BandwidthTable::seconds(comm::Op op, int64_t size_bytes, int64_t p0, int64_t p1) const {
  const int64_t n = p0 * p1;
  if (n <= 1 || size_bytes <= 0) return 0.0;
  const bool inter = p1 > 1;
  // A table measured before comm-bench knew all_to_all prices it as a
  // reduce-scatter of the same size: both send (n-1)/n of the buffer, a block
  // to each other rank (doc/compression.md, "Priced").
  int key_op = static_cast<int>(op);
  if (op == comm::Op::kAllToAll && !has(comm::Op::kAllToAll, inter))
    key_op = static_cast<int>(comm::Op::kReduceScatter);
  const comm::BandwidthTable* best = nullptr;
  int64_t q0 = 0, q1 = 0;
  if (auto it = curves_.find({key_op, p0, p1}); it != curves_.end()) {
    best = &it->second;
    q0 = p0;
    q1 = p1;
  } else {
    double best_distance = std::numeric_limits<double>::infinity();
    for (const auto& [key, curve] : curves_) {
      const auto& [o, k0, k1] = key;
      if (o != key_op || (k1 > 1) != inter) continue;
      const double distance = std::fabs(std::log2(static_cast<double>(p0) / k0)) +
                              std::fabs(std::log2(static_cast<double>(p1) / k1));
      if (distance < best_distance - 1e-12 ||
          (std::fabs(distance - best_distance) <= 1e-12 && k0 * k1 > q0 * q1)) {
        best = &curve;
        best_distance = distance;
        q0 = k0;
        q1 = k1;
      }
    }
  }
  if (!best)
    fail_usage(source_, ": no ", inter ? "inter-node" : "intra-node", " ",
               comm::op_name(op), " measurements (needed for a group of ", p0, "x", p1,
               "); measure them with amsp comm-bench");
  const comm::Op measured = static_cast<comm::Op>(key_op);
  const double us = best->time_us(measured, q0, q1, size_bytes).value_or(0.0);
  // The same bus bandwidth on this group: rescale by the ratio of the factors.
  const double scale = comm::busbw_factor(measured, n) / comm::busbw_factor(measured, q0 * q1);
  return us * 1e-6 * scale;
}

namespace {

int64_t get_int(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 1)
    fail_usage(where, ": field '", key, "' must be a positive integer");
  return j[key].get<int64_t>();
}

double get_number(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number() || !(j[key].get<double>() > 0))
    fail_usage(where, ": field '", key, "' must be a positive number");
  return j[key].get<double>();
}

// An optional number in [lo, hi]; `fallback` when absent.
double optional_number(const json& j, const char* key, double lo, double hi, double fallback,
                       const std::string& where) {
  if (!j.contains(key)) return fallback;
  if (!j[key].is_number() || j[key].get<double>() < lo || j[key].get<double>() > hi)
    fail_usage(where, ": field 'effects.", key, "' must be a number from ", lo, " to ", hi);
  return j[key].get<double>();
}

// The optional "effects" object (doc/planner.md, "What the model adds").
Effects read_effects(const json& j, const std::string& where) {
  Effects e;
  if (!j.contains("effects")) return e;
  if (!j["effects"].is_object()) fail_usage(where, ": field 'effects' must be an object");
  const json& f = j["effects"];
  e.contention = optional_number(f, "contention", 0, 10, 0, where);
  e.jitter_1024 = optional_number(f, "jitter_1024", 0, 10, 0, where);
  e.nodes_per_switch =
      static_cast<int64_t>(optional_number(f, "nodes_per_switch", 0, 1 << 20, 0, where));
  e.oversubscription = optional_number(f, "oversubscription", 1, 100, 1, where);
  const double gbps = optional_number(f, "memory_bandwidth_GBps", 0, 1e6, 0, where);
  const double efficiency = optional_number(f, "memory_efficiency", 0.01, 1, 1, where);
  e.memory_bytes_per_s = gbps * 1e9 * efficiency;
  return e;
}

std::string read_text(const std::string& path, const std::string& option) {
  std::ifstream in(path);
  if (!in) fail_usage("--", option, " ", path, ": cannot open the file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

BandwidthTable table_from_text(const std::string& text, const std::string& path,
                               const std::string& option) {
  const std::string where = cat("--", option, " ", path);
  const BandwidthTable table(comm::parse_bandwidth_table(text, where), where);
  if (table.empty())
    fail_usage(where, ": no entries for groups of two or more ranks");
  return table;
}

}  // namespace

MeshShape BandwidthTable::measured_shape() const {
  MeshShape shape;
  for (const auto& [key, curve] : curves_) {
    shape.ranks_per_node = std::max(shape.ranks_per_node, std::get<1>(key));
    shape.nodes = std::max(shape.nodes, std::get<2>(key));
  }
  return shape;
}

BandwidthTable load_bandwidth_table(const std::string& path, const std::string& option) {
  return table_from_text(read_text(path, option), path, option);
}

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(model::inputs_dir()) / "clusters", ec))
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

Cluster load_cluster(const std::string& name_or_path, const std::string& option) {
  fs::path path = name_or_path;
  const bool looks_like_path =
      name_or_path.find('/') != std::string::npos || path.extension() == ".json";
  if (!looks_like_path) {
    path = fs::path(model::inputs_dir()) / "clusters" / (name_or_path + ".json");
    if (!fs::is_regular_file(path)) {
      std::string known;
      for (const auto& n : cluster_preset_names()) known += (known.empty() ? "" : ", ") + n;
      fail_usage("--", option, " ", name_or_path, ": no such cluster preset; expected one of ",
                 known, " or a JSON file");
    }
  }
  const std::string text = read_text(path.string(), option);
  const std::string where = cat("--", option, " ", path.string());
  Cluster c;
  c.name = looks_like_path ? path.stem().string() : name_or_path;
  c.source = path.string();
  c.bandwidth = table_from_text(text, path.string(), option);
  const json j = json::parse(text);  // valid: the table parsed
  if (!j.contains("gpus_per_node"))
    fail_usage(where, ": not a cluster description (no 'gpus_per_node'); a bare comm-bench "
               "table goes to --bandwidth");
  c.gpus_per_node = get_int(j, "gpus_per_node", where);
  if (!j.contains("gpu_memory") || !j["gpu_memory"].is_string())
    fail_usage(where, ": field 'gpu_memory' must be a size such as \"80GiB\"");
  c.gpu_memory = parse_memory_size(j["gpu_memory"].get<std::string>(), option + " gpu_memory");
  c.peak_tflops_bf16 = get_number(j, "peak_tflops_bf16", where);
  c.peak_tflops_fp32 = get_number(j, "peak_tflops_fp32", where);
  c.achievable = get_number(j, "achievable_fraction", where);
  if (c.achievable > 1) fail_usage(where, ": field 'achievable_fraction' must be at most 1");
  c.effects = read_effects(j, where);
  if (j.contains("description") && j["description"].is_string())
    c.description = j["description"].get<std::string>();
  c.modelled = j.contains("modelled") && j["modelled"].is_boolean() && j["modelled"].get<bool>();
  return c;
}

}  // namespace amsp::plan
