#include "engine/run_info.h"

#include <sys/resource.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace amsp::engine {

nlohmann::ordered_json slurm_job_json(const topology::Env& env) {
  auto get = [&](const char* key) -> nlohmann::ordered_json {
    const auto it = env.find(key);
    return it == env.end() ? nlohmann::ordered_json() : nlohmann::ordered_json(it->second);
  };
  if (env.find("SLURM_JOB_ID") == env.end()) return nullptr;
  const auto restarts = env.find("SLURM_RESTART_COUNT");
  return {{"job_id", get("SLURM_JOB_ID")},
          {"job_name", get("SLURM_JOB_NAME")},
          // Slurm sets it only once the job has been requeued.
          {"restart_count", restarts == env.end() ? 0 : std::atoi(restarts->second.c_str())},
          {"nodelist", get("SLURM_JOB_NODELIST")},
          {"partition", get("SLURM_JOB_PARTITION")},
          {"submit_dir", get("SLURM_SUBMIT_DIR")},
          {"step_id", get("SLURM_STEP_ID")}};
}

nlohmann::ordered_json topology_json(const topology::Topology& topo) {
  nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
  for (int n : topo.node_order)
    nodes.push_back({{"name", topo.nodes[n].name},
                     {"switch_path", topo.nodes[n].switch_path()},
                     {"ranks", topo.nodes[n].ranks}});
  return {{"source", topo.source}, {"summary", topo.describe()}, {"nodes", nodes}};
}

int64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

double caller_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double compute_cpu_seconds() {
  double total = 0;
#pragma omp parallel reduction(+ : total)
  total += caller_cpu_seconds();  // each member of the team, on itself
  return total;
}

void write_json_file(const std::string& path, const nlohmann::ordered_json& j, const char* option) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) fail_usage(option, " ", path, ": cannot create the file (does its directory exist?)");
    out << j.dump(2) << "\n";
    if (!out.flush()) fail_usage(option, " ", path, ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail_usage(option, " ", path, ": cannot rename ", tmp, " into place: ", ec.message());
}

void write_run_info(const std::string& path, const nlohmann::ordered_json& j) {
  write_json_file(path, j, "--run-info");
}

}  // namespace amsp::engine
