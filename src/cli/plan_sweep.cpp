// amsp plan --sweep: see plan_sweep.h and doc/planner.md, "Scaling sweep".

#include "cli/plan_sweep.h"
#include "cli/text.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/subprocess.h"
#include "plan/calibration.h"


namespace amsp::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using namespace amsp::plan;

// --- the systems ----------------------------------------------------------------

struct SweepSystem {
  const char* id;     // JSON key
  const char* label;  // table column and plot legend
};
const SweepSystem kSystems[] = {
    {"zero1", "DS-ZeRO-1"}, {"zero2", "DS-ZeRO-2"}, {"zero3", "DS-ZeRO-3"},
    {"mics", "MiCS"},    {"fsdp_hybrid", "FSDP-hybrid"}, {"amsp", "amsp"},
};
constexpr size_t kNumSystems = sizeof kSystems / sizeof kSystems[0];

// One system at one scale.
struct Point {
  std::string status;  // "ok", "oom" (does not fit memory), "invalid" (on this mesh)
  std::string why;     // for invalid: the rule broken
  std::optional<Evaluation> eval;
  double tokens_per_s_per_gpu = 0;
};

struct Scale {
  int64_t gpus = 0, nodes = 0;
  int64_t global_batch_tokens = 0, micro_batches = 0;
  Point points[kNumSystems];
};

Point point(const PlanInput& in, const std::optional<Evaluation>& e) {
  Point p;
  p.eval = e;
  p.status = e->fits ? "ok" : "oom";
  const double per_rank = static_cast<double>(in.global_batch_tokens) / in.mesh.world();
  p.tokens_per_s_per_gpu = per_rank / e->cost.step_s;
  return p;
}

// A named plan, or "invalid" with the rule it breaks on this mesh.
Point named_point(const PlanInput& in, const std::string& text) {
  ShardPlan plan;
  try {
    plan = parse_shard_plan(text, in.mesh);
  } catch (const UsageError& e) {
    Point p;
    p.status = "invalid";
    p.why = e.what();
    return p;
  }
  if (plan.name.empty() || plan.name == "custom") plan.name = text;
  return point(in, evaluate(in, plan));
}

// MiCS: the partition group is the smallest whole number of nodes whose plan
// fits (mics:K, K = R x k for k dividing N); none fitting: the largest, OOM.
Point mics_point(const PlanInput& in) {
  const int64_t R = in.mesh.ranks_per_node, N = in.mesh.nodes;
  Point last;
  for (int64_t k = 1; k <= N; ++k) {
    if (N % k != 0) continue;
    last = named_point(in, "mics:" + std::to_string(R * k));
    if (last.status == "ok") return last;
  }
  return last;
}

Point planner_point(const PlanInput& in) {
  const std::vector<Evaluation> ranked = search(in);
  if (ranked.empty()) {
    Point p;
    p.status = "invalid";
    p.why = "no valid plan";
    return p;
  }
  // search ranks the fitting plans first; the first is choose_plan's.
  Point p = point(in, ranked.front());
  if (p.eval->fits) p.eval->plan.name = "auto";
  return p;
}

Scale evaluate_scale(const SweepRequest& r, int64_t gpus) {
  Scale s;
  s.gpus = gpus;
  PlanInput in = r.base;
  const int64_t R = in.mesh.ranks_per_node;
  s.nodes = gpus / R;
  in.mesh.nodes = s.nodes;
  if (!r.fixed_batch) in.global_batch_tokens = in.workload.tokens_per_micro_batch() * gpus;
  s.global_batch_tokens = in.global_batch_tokens;
  // A whole number: check_sweep said so. Computed here to need no more of the cost model
  // than evaluate and search.
  s.micro_batches = in.global_batch_tokens / (in.workload.tokens_per_micro_batch() * gpus);
  const std::string rx1 = std::to_string(R) + "x1";
  // ZeRO as the paper measured it: DeepSpeed's buckets and overlap defaults.
  for (int stage = 1; stage <= 3; ++stage) {
    PlanInput ds = in;
    ds.schedule = deepspeed_schedule(stage);
    s.points[stage - 1] = named_point(ds, "zero" + std::to_string(stage));
  }
  s.points[3] = mics_point(in);
  // HYBRID_SHARD: everything sharded inside one node, replicated across nodes.
  s.points[4] = named_point(in, "p=" + rx1 + ",g=" + rx1 + ",os=" + rx1);
  if (s.points[4].eval) s.points[4].eval->plan.name = "fsdp-hybrid";
  s.points[5] = planner_point(in);
  return s;
}

// --- printing ---------------------------------------------------------------------


const char* bandwidth_kind(const SweepRequest& r) {
  return !r.measured_table.empty() ? "measured" : r.cluster.modelled ? "modelled" : "measured";
}

ordered_json sweep_json(const SweepRequest& r, const std::vector<Scale>& scales) {
  const PlanInput& in = r.base;
  const Workload& w = in.workload;
  ordered_json input;
  input["model"] = w.model.name;
  input["parameters"] = w.model.num_parameters();
  input["cluster"] = r.cluster.name;
  input["gpus_per_node"] = in.mesh.ranks_per_node;
  input["gpu_memory_bytes"] = in.memory_per_rank;
  input["bandwidth"] = r.measured_table.empty() ? r.cluster.source : r.measured_table;
  input["bandwidth_kind"] = bandwidth_kind(r);
  input["precision"] = precision_name(w.precision);
  input["recompute"] = recompute_name(w.recompute);
  input["seq_len"] = w.seq_len;
  input["micro_batch"] = w.micro_batch;
  input["global_batch"] = r.fixed_batch ? "fixed" : "one micro-batch per rank";
  input["peak_tflops"] = in.compute.peak_flops_per_s / 1e12;
  input["achievable_fraction"] = in.compute.flops_per_s / in.compute.peak_flops_per_s;
  ordered_json j;
  j["input"] = input;
  j["systems"] = ordered_json::array();
  for (const SweepSystem& s : kSystems) j["systems"].push_back({{"id", s.id}, {"label", s.label}});
  j["scales"] = ordered_json::array();
  for (const Scale& s : scales) {
    ordered_json x;
    x["gpus"] = s.gpus;
    x["nodes"] = s.nodes;
    x["global_batch_tokens"] = s.global_batch_tokens;
    x["micro_batches_per_step"] = s.micro_batches;
    ordered_json systems = ordered_json::object();
    for (size_t i = 0; i < kNumSystems; ++i) {
      const Point& p = s.points[i];
      ordered_json y;
      y["status"] = p.status;
      if (p.eval) {
        const Evaluation& e = *p.eval;
        y["name"] = e.plan.name;
        y["plan"] = to_string(e.plan);
        y["memory_bytes"] = e.memory.total();
        y["compute_s"] = e.cost.compute_s;
        y["exposed_comm_s"] = e.cost.exposed_s;
        y["step_time_s"] = e.cost.step_s;
        // A plan that does not fit has no throughput: its figures would be a fiction.
        y["mfu"] = p.status == "ok" ? ordered_json(e.cost.mfu) : ordered_json(nullptr);
        y["tokens_per_s_per_gpu"] =
            p.status == "ok" ? ordered_json(p.tokens_per_s_per_gpu) : ordered_json(nullptr);
      } else {
        y["mfu"] = nullptr;
        y["tokens_per_s_per_gpu"] = nullptr;
        y["excluded"] = p.why;
      }
      systems[kSystems[i].id] = y;
    }
    x["systems"] = systems;
    j["scales"].push_back(x);
  }
  return j;
}

constexpr size_t kMfuWidth = 7, kTokWidth = 10, kGpuWidth = 6;

void print_table(std::ostream& os, const SweepRequest& r, const std::vector<Scale>& scales) {
  const PlanInput& in = r.base;
  const Workload& w = in.workload;
  os << "amsp plan --sweep: " << w.model.name << " (" << fmt("%.2f", w.model.num_parameters() / 1e9)
     << " B parameters) on " << r.cluster.name << ", " << in.mesh.ranks_per_node << " GPUs per node, "
     << format_memory(in.memory_per_rank) << " per GPU\n";
  os << "bandwidth: " << bandwidth_kind(r) << " ("
     << (r.measured_table.empty() ? r.cluster.source : r.measured_table) << ")"
     << (r.measured_table.empty() && r.cluster.modelled
             ? "; measure with amsp comm-bench, pass --bandwidth"
             : "")
     << "\n";
  os << "batch: ";
  if (r.fixed_batch)
    os << in.global_batch_tokens << " tokens per step at every scale";
  else
    os << "one micro-batch per rank (pass --global-batch to fix it)";
  os << "; micro-batch " << w.micro_batch << " x " << w.seq_len << " tokens; "
     << precision_name(w.precision) << ", recompute " << recompute_name(w.recompute) << "\n";
  os << "predicted by amsp's cost model: MFU, and tokens/s per GPU; OOM: does not fit memory, "
        "-: invalid on the mesh\n\n";

  const size_t cell = kMfuWidth + kTokWidth;
  os << pad("", kGpuWidth);
  for (const SweepSystem& s : kSystems) os << "  " << pad(s.label, cell);
  os << "\n" << pad("GPUs", kGpuWidth);
  for (size_t i = 0; i < kNumSystems; ++i) os << "  " << pad("MFU", kMfuWidth) << pad("tok/s/GPU", kTokWidth);
  os << "\n";
  for (const Scale& s : scales) {
    os << pad(std::to_string(s.gpus), kGpuWidth);
    for (const Point& p : s.points) {
      os << "  ";
      if (p.status == "ok")
        os << pad(fmt("%.1f%%", 100 * p.eval->cost.mfu), kMfuWidth)
           << pad(fmt("%.0f", p.tokens_per_s_per_gpu), kTokWidth);
      else
        os << pad(p.status == "oom" ? "OOM" : "-", kMfuWidth) << pad("", kTokWidth);
    }
    os << "\n";
  }
  os << "\nplans (p, g, os: ranks per node x nodes):\n";
  for (const Scale& s : scales) {
    os << pad(std::to_string(s.gpus), kGpuWidth) << " GPUs, " << s.nodes << " node"
       << (s.nodes == 1 ? "" : "s") << ", " << s.micro_batches << " micro-batch"
       << (s.micro_batches == 1 ? "" : "es") << " per step: MiCS ";
    const Point& mics = s.points[3];
    os << (mics.eval ? mics.eval->plan.name : std::string("-")) << ", amsp ";
    const Point& chosen = s.points[5];
    if (chosen.status == "ok")
      os << to_string(chosen.eval->plan);
    else
      os << "no plan fits";
    os << "\n";
  }
}

// --- the plot -----------------------------------------------------------------------

// Runs a program found on PATH (through /usr/bin/env, as run_child takes a
// path), with a deadline: its exit status (127: not found) and its output.
ChildResult run_program(std::vector<std::string> args) {
  args.insert(args.begin(), "/usr/bin/env");
  return run_child(args, 300);
}

// The Python that can import matplotlib: $AMSP_PYTHON if set (and only it), else
// python3 on PATH, else /usr/bin/python3 (a conda or pyenv python3 on PATH may
// not see Debian's python3-matplotlib). Throws naming what to install.
std::string find_python(const std::string& plot) {
  std::vector<std::string> candidates;
  const char* env = std::getenv("AMSP_PYTHON");
  if (env && *env)
    candidates.push_back(env);
  else
    candidates = {"python3", "/usr/bin/python3"};
  bool any = false;
  for (const std::string& py : candidates) {
    const ChildResult r = run_program({py, "-c", "import matplotlib"});
    if (r.ok()) return py;
    any = any || r.exit_code != 127;
  }
  const std::string which = env && *env ? std::string("AMSP_PYTHON=") + env : "python3";
  if (!any)
    fail("--plot ", plot, ": ", which, " not found; install Python 3 with matplotlib: "
         "apt-get install python3-matplotlib");
  fail("--plot ", plot, ": ", which, " cannot import matplotlib; install it: apt-get install "
       "python3-matplotlib (or set AMSP_PYTHON to a Python that has it)");
}

// plot_sweep.py: installed beside the binary (../share/amsp/), else the source tree's.
std::string find_plot_script(const std::string& plot) {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> candidates;
  if (!ec) candidates.push_back(exe.parent_path().parent_path() / "share" / "amsp" / "plot_sweep.py");
  candidates.push_back(AMSP_PLOT_SWEEP_SCRIPT);
  for (const fs::path& p : candidates)
    if (fs::is_regular_file(p, ec)) return p.string();
  fail("--plot ", plot, ": plot_sweep.py not found (looked in ", candidates.front().string(),
       candidates.size() > 1 ? " and " + candidates.back().string() : std::string(), ")");
}

std::string temp_path(const std::string& plot) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string path = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/amsp-sweep-XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0) fail("--plot ", plot, ": cannot create a temporary file ", path);
  close(fd);
  return path;
}

// The last non-empty line of a program's output (the script's one-line error).
std::string last_line(const std::string& output) {
  std::istringstream in(output);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

// The sweep's JSON to a temporary file, plot_sweep.py turns it into the PNG.
void write_plot(const std::string& plot, const ordered_json& data) {
  const std::string python = find_python(plot);
  const std::string script = find_plot_script(plot);
  const std::string input = temp_path(plot);
  {
    std::ofstream f(input);
    f << data.dump() << "\n";
  }
  const ChildResult r = run_program({python, script, input, plot});
  std::remove(input.c_str());
  const std::string why = last_line(r.output);
  if (!r.ok()) fail("--plot ", plot, ": ", why.empty() ? script + " " + r.describe(300) : why);
}

}  // namespace

std::vector<int64_t> parse_sweep_list(const std::string& text) {
  const char* expected = "expected comma-separated GPU counts, e.g. 8,16,32";
  if (text.empty()) fail_usage("--sweep '': ", expected);
  std::vector<int64_t> gpus;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    const bool digits = !item.empty() && item.size() <= 12 &&
                        item.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoll(item) < 1)
      fail_usage("--sweep ", text, ": '", item, "' is not a GPU count; ", expected);
    const int64_t n = std::stoll(item);
    if (!gpus.empty() && n <= gpus.back())
      fail_usage("--sweep ", text, ": ", n, " after ", gpus.back(), "; expected increasing GPU counts");
    gpus.push_back(n);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return gpus;
}

void check_sweep(const std::string& list, int64_t gpus_per_node, int64_t global_batch_tokens,
                 int64_t tokens_per_micro_batch) {
  for (const int64_t gpus : parse_sweep_list(list)) {
    if (gpus % gpus_per_node != 0)
      fail_usage("--sweep ", list, ": ", gpus, " GPUs is not a whole number of nodes; expected "
                 "multiples of ", gpus_per_node, " (GPUs per node)");
    const int64_t per = tokens_per_micro_batch * gpus;
    if (global_batch_tokens > 0 && (global_batch_tokens < per || global_batch_tokens % per != 0))
      fail_usage("--global-batch ", global_batch_tokens, ": at ", gpus, " GPUs of --sweep expected a "
                 "multiple of seq-len x micro-batch x GPUs = ", per, " tokens");
  }
}

int run_sweep(std::ostream& os, const SweepRequest& r) {
  const std::vector<int64_t> list = parse_sweep_list(r.list);
  check_sweep(r.list, r.base.mesh.ranks_per_node, r.fixed_batch ? r.base.global_batch_tokens : 0,
              r.base.workload.tokens_per_micro_batch());
  if (!r.plot.empty()) {
    const fs::path dir = fs::absolute(r.plot).parent_path();
    std::error_code ec;
    if (r.plot.back() == '/' || fs::is_directory(r.plot, ec))
      fail_usage("--plot ", r.plot, ": a directory; expected a file name such as sweep.png");
    if (!fs::is_directory(dir, ec))
      fail_usage("--plot ", r.plot, ": no directory ", dir.string(), "; expected a path in an existing one");
  }

  std::vector<Scale> scales;
  for (const int64_t gpus : list) scales.push_back(evaluate_scale(r, gpus));
  const ordered_json data = sweep_json(r, scales);
  if (r.json)
    os << data.dump(2) << "\n";
  else
    print_table(os, r, scales);
  os.flush();
  if (!r.plot.empty()) {
    write_plot(r.plot, data);
    if (!r.json) os << "\nplot: " << r.plot << "\n";
  }
  return kExitOk;
}

}  // namespace amsp::cli
