#include "comm/bandwidth_table.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace amsp::comm {

using nlohmann::json;

std::optional<double> BandwidthTable::time_us(Op op, int64_t p0, int64_t p1,
                                              int64_t bytes) const {
  std::vector<const BandwidthEntry*> e;
  for (const auto& x : entries)
    if (x.op == op && x.ranks_per_node == p0 && x.nodes == p1 && x.bytes > 0) e.push_back(&x);
  if (e.empty()) return std::nullopt;
  if (p0 * p1 <= 1 || bytes <= 0) return 0.0;
  std::sort(e.begin(), e.end(), [](auto* a, auto* b) { return a->bytes < b->bytes; });
  if (bytes <= e.front()->bytes) return e.front()->time_us;
  if (bytes >= e.back()->bytes) {
    const BandwidthEntry& last = *e.back();
    if (last.algbw_GBps <= 0) return last.time_us * static_cast<double>(bytes) / last.bytes;
    return static_cast<double>(bytes) / (last.algbw_GBps * 1e3);  // GB/s = 1e3 B/us
  }
  const auto hi = std::lower_bound(e.begin(), e.end(), bytes,
                                   [](auto* a, int64_t b) { return a->bytes < b; });
  const BandwidthEntry& b = **hi;
  const BandwidthEntry& a = **(hi - 1);
  if (b.bytes == bytes) return b.time_us;
  const double w = std::log(static_cast<double>(bytes) / a.bytes) /
                   std::log(static_cast<double>(b.bytes) / a.bytes);
  return a.time_us + w * (b.time_us - a.time_us);
}

std::string to_json(const BandwidthTable& t) {
  nlohmann::ordered_json j;
  j["format"] = "amsp-bandwidth-table";
  j["version"] = 1;
  j["cluster"] = t.cluster;
  j["backend"] = t.backend;
  j["dtype"] = t.dtype;
  nlohmann::ordered_json entries = nlohmann::ordered_json::array();
  for (const auto& e : t.entries) {
    entries.push_back({{"op", op_name(e.op)},
                       {"ranks_per_node", e.ranks_per_node},
                       {"nodes", e.nodes},
                       {"bytes", e.bytes},
                       {"time_us", std::round(e.time_us * 100) / 100},
                       {"algbw_GBps", std::round(e.algbw_GBps * 1e6) / 1e6},
                       {"busbw_GBps", std::round(e.busbw_GBps * 1e6) / 1e6}});
  }
  j["entries"] = entries;
  // One entry per line: readable, and diffs stay small.
  std::ostringstream os;
  os << "{\n";
  for (const char* k : {"format", "version", "cluster", "backend", "dtype"})
    os << "  \"" << k << "\": " << j[k].dump() << ",\n";
  os << "  \"entries\": [\n";
  for (size_t i = 0; i < entries.size(); ++i)
    os << "    " << entries[i].dump() << (i + 1 < entries.size() ? ",\n" : "\n");
  os << "  ]\n}\n";
  return os.str();
}

BandwidthTable parse_bandwidth_table(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail_usage(source, ": not JSON (", e.what(), "); expected a bandwidth table from "
               "`amsp comm-bench --output-table`");
  }
  if (!j.is_object() || j.value("format", "") != "amsp-bandwidth-table")
    fail_usage(source, ": no \"format\": \"amsp-bandwidth-table\"; is this a table written by "
               "`amsp comm-bench --output-table`?");
  if (j.value("version", 0) != 1)
    fail_usage(source, ": version ", j.value("version", 0), " (this amsp reads version 1)");
  BandwidthTable t;
  t.cluster = j.value("cluster", "");
  t.backend = j.value("backend", "");
  t.dtype = j.value("dtype", "float32");
  if (!j.contains("entries") || !j["entries"].is_array())
    fail_usage(source, ": expected an \"entries\" array");
  size_t i = 0;
  for (const auto& e : j["entries"]) {
    const auto where = [&] { return cat(source, ": entries[", i, "]"); };
    try {
      BandwidthEntry x;
      const auto op = parse_op(e.at("op").get<std::string>());
      if (!op)
        fail_usage(where(), ": op '", e.at("op").get<std::string>(),
                   "' (expected all_gather, reduce_scatter, all_reduce, broadcast or all_to_all)");
      x.op = *op;
      x.ranks_per_node = e.at("ranks_per_node").get<int64_t>();
      x.nodes = e.at("nodes").get<int64_t>();
      x.bytes = e.at("bytes").get<int64_t>();
      x.time_us = e.at("time_us").get<double>();
      x.algbw_GBps = e.value("algbw_GBps", x.time_us > 0 ? x.bytes / (x.time_us * 1e3) : 0.0);
      x.busbw_GBps = e.value("busbw_GBps", x.algbw_GBps * busbw_factor(x.op, x.ranks_per_node * x.nodes));
      if (x.ranks_per_node < 1 || x.nodes < 1 || x.bytes < 0 || x.time_us < 0)
        fail_usage(where(), ": ranks_per_node and nodes must be >= 1, bytes and time_us >= 0");
      t.entries.push_back(x);
    } catch (const json::exception& ex) {
      fail_usage(where(), ": expected op, ranks_per_node, nodes, bytes, time_us (", ex.what(), ")");
    }
    ++i;
  }
  return t;
}

BandwidthTable load_bandwidth_table(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail_usage("cannot read bandwidth table ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_bandwidth_table(ss.str(), path);
}

}  // namespace amsp::comm
