#include "topology/topology.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "core/mpi_check.h"
#include "topology/hostlist.h"

extern char** environ;

namespace amsp::topology {
namespace {

const std::string* lookup(const Env& env, const std::string& key) {
  const auto it = env.find(key);
  return it == env.end() ? nullptr : &it->second;
}

// The first of `keys` that is set, and its name.
const std::string* lookup_first(const Env& env, std::initializer_list<const char*> keys,
                                std::string& which) {
  for (const char* k : keys) {
    if (const auto* v = lookup(env, k)) {
      which = k;
      return v;
    }
  }
  return nullptr;
}

bool parse_nonneg(const std::string& s, int& out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

int require_int(const Env& env, const char* key) {
  const auto* v = lookup(env, key);
  if (!v) fail_usage("Slurm step without ", key, ": cannot tell where this task runs");
  int out = 0;
  if (!parse_nonneg(*v, out)) fail_usage(key, "=\"", *v, "\" is not a non-negative integer");
  return out;
}

// Lexicographic comparison of switch paths, each name compared naturally.
bool path_less(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(),
                                      [](const std::string& x, const std::string& y) { return natural_less(x, y); });
}

// --- serialisation of a RankView for MPI_Allgatherv ---------------------------
constexpr char kField = '\x1f';
constexpr char kItem = '\x1e';

std::string encode(const RankView& v) {
  std::string s;
  s += std::to_string(v.rank) + kField + v.node_name + kField + std::to_string(v.node_index) + kField +
       std::to_string(v.node_key) + kField + std::to_string(v.local_rank) + kField;
  for (size_t i = 0; i < v.switches.size(); ++i) s += (i ? std::string(1, kItem) : "") + v.switches[i];
  s += kField + v.error;
  return s;
}

RankView decode(const std::string& s) {
  std::vector<std::string> f;
  size_t start = 0;
  while (true) {
    const size_t p = s.find(kField, start);
    f.push_back(s.substr(start, p == std::string::npos ? std::string::npos : p - start));
    if (p == std::string::npos) break;
    start = p + 1;
  }
  if (f.size() != 7) fail("topology: garbled rank record in MPI_Allgatherv (", f.size(), " fields)");
  RankView v;
  v.rank = std::stoi(f[0]);
  v.node_name = f[1];
  v.node_index = std::stoi(f[2]);
  v.node_key = std::stoi(f[3]);
  v.local_rank = std::stoi(f[4]);
  if (!f[5].empty()) {
    size_t b = 0;
    while (true) {
      const size_t p = f[5].find(kItem, b);
      v.switches.push_back(f[5].substr(b, p == std::string::npos ? std::string::npos : p - b));
      if (p == std::string::npos) break;
      b = p + 1;
    }
  }
  v.error = f[6];
  return v;
}

// The switch path from SLURM_TOPOLOGY_ADDR (empty when unset), checked against the
// node's name.
std::vector<std::string> slurm_switches(const Env& env, const std::string& node_name) {
  const auto* addr = lookup(env, "SLURM_TOPOLOGY_ADDR");
  if (!addr) return {};
  const auto* pattern = lookup(env, "SLURM_TOPOLOGY_ADDR_PATTERN");
  std::string implied;  // without a pattern: every component but the last is a switch
  if (!pattern) {
    for (char c : *addr)
      if (c == '.') implied += "switch.";
    implied += "node";
  }
  const auto sa = parse_topology_addr(*addr, pattern ? *pattern : implied);
  if (sa.node != node_name)
    fail_usage("SLURM_TOPOLOGY_ADDR=\"", *addr, "\" ends in node ", sa.node, " but SLURMD_NODENAME=", node_name);
  return sa.switches;
}

}  // namespace

Env process_environment() {
  Env env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv(*e);
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

std::string NodeInfo::switch_path() const { return join_path(switches); }
std::string NodeInfo::leaf_switch() const { return switches.empty() ? std::string() : switches.back(); }

GpuInfo parse_gpus(const Env& env, int local_rank, int local_size) {
  GpuInfo g;
  if (const auto* cvd = lookup(env, "CUDA_VISIBLE_DEVICES")) {
    g.count = 0;
    size_t start = 0;
    while (start <= cvd->size()) {
      const size_t comma = cvd->find(',', start);
      std::string item = cvd->substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      // CUDA stops at the first entry it cannot use; these mean "no device".
      if (item.empty() || item == "none" || item == "NoDevFiles" || item[0] == '-') break;
      g.visible.push_back(item);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    g.count = static_cast<int>(g.visible.size());
  } else if (const auto* n = lookup(env, "SLURM_GPUS_ON_NODE")) {
    if (!parse_nonneg(*n, g.count))
      fail_usage("SLURM_GPUS_ON_NODE=\"", *n, "\" is not a non-negative integer");
  }
  if (g.count >= 1) {
    if (g.count >= local_size) g.device = local_rank;
    else g.device = local_rank % g.count;
  }
  return g;
}

bool in_slurm_step(const Env& env) { return lookup(env, "SLURM_JOB_ID") && lookup(env, "SLURM_PROCID"); }

namespace {

// Where a step-wide value came from: Slurm sets the step's variable and the job's,
// and messages must name the one that was read.
struct StepVars {
  std::string list_var, tasks_var;
  const std::string* list = nullptr;   // the node list as given
  const std::string* tasks = nullptr;  // the tasks-per-node list as given
};

// Which task this is and on which node; heterogeneous jobs are refused first because
// their per-component variables would make every later check misleading.
SlurmTask read_task_ids(const Env& env) {
  if (lookup(env, "SLURM_HET_SIZE") || lookup(env, "SLURM_PACK_SIZE"))
    fail_usage("heterogeneous Slurm jobs (SLURM_HET_SIZE is set) are not supported: run one job component");
  SlurmTask t;
  t.procid = require_int(env, "SLURM_PROCID");
  t.nodeid = require_int(env, "SLURM_NODEID");
  t.localid = require_int(env, "SLURM_LOCALID");
  const auto* name = lookup(env, "SLURMD_NODENAME");
  if (!name || name->empty()) fail_usage("Slurm step without SLURMD_NODENAME: cannot tell which node this task is on");
  t.node_name = *name;
  return t;
}

// A node named twice would give two node ids one host, which assemble could not
// tell from a real inconsistency.
void read_nodelist(const Env& env, SlurmTask& t, StepVars& s) {
  s.list = lookup_first(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, s.list_var);
  if (!s.list) fail_usage("Slurm step without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST");
  try {
    t.nodelist = expand_hostlist(*s.list);
  } catch (const UsageError& e) {
    fail_usage(s.list_var, ": ", e.what());
  }
  if (t.nodelist.empty()) fail_usage(s.list_var, " is empty");
  auto sorted = t.nodelist;
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) fail_usage(s.list_var, "=\"", *s.list, "\" names node ", *dup, " twice");
}

// The per-node task counts, one per listed node and none zero; returns their sum.
int64_t read_tasks_per_node(const Env& env, SlurmTask& t, StepVars& s) {
  s.tasks = lookup_first(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}, s.tasks_var);
  if (!s.tasks) fail_usage("Slurm step without SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE");
  try {
    t.tasks_per_node = parse_tasks_per_node(*s.tasks);
  } catch (const UsageError& e) {
    fail_usage(s.tasks_var, ": ", e.what());
  }
  if (t.tasks_per_node.size() != t.nodelist.size())
    fail_usage(s.tasks_var, "=\"", *s.tasks, "\" counts ", t.tasks_per_node.size(), " nodes but ", s.list_var,
               "=\"", *s.list, "\" names ", t.nodelist.size());
  int64_t total = 0;
  for (size_t i = 0; i < t.tasks_per_node.size(); ++i) {
    if (t.tasks_per_node[i] == 0)
      fail_usage(s.tasks_var, "=\"", *s.tasks, "\" gives node ", t.nodelist[i], " no tasks");
    total += t.tasks_per_node[i];
  }
  return total;
}

// The task count: from its own variable when set (and then it must agree with the
// per-node counts), else their sum.
void read_ntasks(const Env& env, SlurmTask& t, const StepVars& s, int64_t total) {
  std::string ntasks_var;
  if (const auto* n = lookup_first(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, ntasks_var)) {
    if (!parse_nonneg(*n, t.ntasks)) fail_usage(ntasks_var, "=\"", *n, "\" is not a non-negative integer");
    if (t.ntasks != total)
      fail_usage(ntasks_var, "=", t.ntasks, " but ", s.tasks_var, "=\"", *s.tasks, "\" adds up to ", total, " tasks");
  } else {
    t.ntasks = static_cast<int>(total);
  }
}

// This task's ids must fall inside the step the lists describe, or indexing them
// later would go out of range.
void check_task_in_step(const SlurmTask& t, const StepVars& s) {
  if (t.procid >= t.ntasks) fail_usage("SLURM_PROCID=", t.procid, " but the step has only ", t.ntasks, " tasks");
  if (t.nodeid >= static_cast<int>(t.nodelist.size()))
    fail_usage("SLURM_NODEID=", t.nodeid, " but ", s.list_var, "=\"", *s.list, "\" names only ", t.nodelist.size(),
               " nodes");
  if (t.nodelist[t.nodeid] != t.node_name)
    fail_usage("SLURM_NODEID=", t.nodeid, " is node ", t.nodelist[t.nodeid], " in ", s.list_var, "=\"", *s.list,
               "\", but SLURMD_NODENAME=", t.node_name);
  if (t.localid >= t.tasks_per_node[t.nodeid])
    fail_usage("SLURM_LOCALID=", t.localid, " but ", s.tasks_var, "=\"", *s.tasks, "\" puts only ",
               t.tasks_per_node[t.nodeid], " tasks on node ", t.node_name);
}

}  // namespace

SlurmTask parse_slurm_task(const Env& env) {
  SlurmTask t = read_task_ids(env);
  StepVars s;
  read_nodelist(env, t, s);
  const int64_t total = read_tasks_per_node(env, t, s);
  read_ntasks(env, t, s, total);
  check_task_in_step(t, s);
  t.switches = slurm_switches(env, t.node_name);
  return t;
}

namespace {

// A failed rank is reported before anything else: its record is incomplete, so every
// later check would blame the layout for what is really that rank's error.
void check_rank_records(const std::vector<RankView>& views, int my_rank) {
  const int world = static_cast<int>(views.size());
  if (world == 0 || my_rank < 0 || my_rank >= world)
    fail("topology: rank ", my_rank, " out of range for ", world, " ranks");
  int failed = 0, first_failed = -1;
  for (int r = 0; r < world; ++r) {
    if (!views[r].error.empty()) {
      if (first_failed < 0) first_failed = r;
      ++failed;
    }
  }
  if (failed > 0) {
    fail_usage("topology discovery failed on rank ", first_failed, ": ", views[first_failed].error,
               failed > 1 ? cat(" (and on ", failed - 1, " other rank", failed > 2 ? "s" : "", ")") : std::string());
  }
  for (int r = 0; r < world; ++r)
    if (views[r].rank != r) fail("topology: record ", r, " comes from rank ", views[r].rank);
}

// Do the ranks name their nodes by Slurm node id (true) or by shared-memory group?
// A mix means the ranks were not all started the same way.
bool nodes_by_index(const std::vector<RankView>& views) {
  const bool by_index = views[0].node_index >= 0;
  for (int r = 0; r < static_cast<int>(views.size()); ++r)
    if ((views[r].node_index >= 0) != by_index)
      fail("topology: ranks 0 and ", r, " disagree on how nodes are identified");
  return by_index;
}

// Sets rank_node and sizes `nodes`.  In MPI mode a node is a shared-memory group,
// numbered in the order of its lowest rank, so that every rank numbers them alike.
void index_nodes(const std::vector<RankView>& views, bool by_index, Topology& t) {
  const int world = static_cast<int>(views.size());
  if (by_index) {
    int max_index = -1;
    for (const auto& v : views) max_index = std::max(max_index, v.node_index);
    t.nodes.resize(max_index + 1);
    for (int r = 0; r < world; ++r) t.rank_node[r] = views[r].node_index;
  } else {
    std::map<int, int> key_to_node;  // shared-memory group -> node index
    for (int r = 0; r < world; ++r) {
      const int key = views[r].node_key;
      if (key < 0 || key > r || views[key].node_key != key)
        fail_usage("inconsistent layout: rank ", r, " names rank ", key,
                   " as the first of its shared-memory group, but that rank disagrees");
      key_to_node.emplace(key, 0);
    }
    int next = 0;
    for (auto& [key, node] : key_to_node) node = next++;
    t.nodes.resize(next);
    for (int r = 0; r < world; ++r) t.rank_node[r] = key_to_node[views[r].node_key];
  }
  t.num_nodes = static_cast<int>(t.nodes.size());
}

// Names and switch paths: one per node, and no name on two nodes.  The first rank
// on a node speaks for it; every other rank there must agree with it.
void name_nodes(const std::vector<RankView>& views, bool by_index, Topology& t) {
  std::map<std::string, int> name_to_node;
  std::vector<int> first_rank(t.num_nodes, -1);
  for (int r = 0; r < t.world_size; ++r) {
    const int n = t.rank_node[r];
    if (first_rank[n] < 0) {
      first_rank[n] = r;
      t.nodes[n].name = views[r].node_name;
      t.nodes[n].switches = views[r].switches;
      const auto [it, fresh] = name_to_node.emplace(views[r].node_name, n);
      if (!fresh) {
        const int other = first_rank[it->second];
        if (by_index)
          fail_usage("inconsistent layout: ranks ", other, " and ", r, " are both on node ", views[r].node_name,
                     " but say node ids ", it->second, " and ", n);
        fail_usage("inconsistent layout: ranks ", other, " and ", r, " both run on host ", views[r].node_name,
                   " but MPI puts them in different shared-memory groups");
      }
    } else {
      const int other = first_rank[n];
      if (views[r].node_name != t.nodes[n].name) {
        if (by_index)
          fail_usage("inconsistent layout: ranks ", other, " and ", r, " both say node id ", n, " but name it ",
                     t.nodes[n].name, " and ", views[r].node_name);
        fail_usage("inconsistent layout: ranks ", other, " and ", r, " share memory but report hosts ",
                   t.nodes[n].name, " and ", views[r].node_name);
      }
      if (views[r].switches != t.nodes[n].switches)
        fail_usage("inconsistent layout: ranks ", other, " and ", r, " on node ", t.nodes[n].name,
                   " report switch paths \"", join_path(t.nodes[n].switches), "\" and \"",
                   join_path(views[r].switches), "\"");
    }
  }
  for (int n = 0; n < t.num_nodes; ++n)
    if (first_rank[n] < 0) fail_usage("inconsistent layout: no rank says it is on node id ", n);
}

// Local ranks: 0..size-1 on every node, each exactly once, so that nodes[n].ranks
// can be indexed by local rank.
void number_local_ranks(const std::vector<RankView>& views, Topology& t) {
  for (int n = 0; n < t.num_nodes; ++n) {
    std::vector<int> ranks;
    for (int r = 0; r < t.world_size; ++r)
      if (t.rank_node[r] == n) ranks.push_back(r);
    std::vector<int> by_local(ranks.size(), -1);
    for (int r : ranks) {
      const int l = views[r].local_rank;
      if (l < 0 || l >= static_cast<int>(ranks.size()))
        fail_usage("inconsistent layout: rank ", r, " says local rank ", l, " on node ", t.nodes[n].name,
                   ", which has ", ranks.size(), " ranks");
      if (by_local[l] >= 0)
        fail_usage("inconsistent layout: ranks ", by_local[l], " and ", r, " both claim local rank ", l,
                   " on node ", t.nodes[n].name);
      by_local[l] = r;
      t.rank_local[r] = l;
    }
    t.nodes[n].ranks = by_local;
  }
}

// A switch must have one place in the tree, or "nodes under one leaf switch" would
// mean different things depending on which node is asked.
void check_switch_tree(const Topology& t) {
  std::map<std::string, std::pair<std::vector<std::string>, int>> switch_parent;  // switch -> (path above, node)
  for (int n = 0; n < t.num_nodes; ++n) {
    const auto& sw = t.nodes[n].switches;
    for (size_t i = 0; i < sw.size(); ++i) {
      std::vector<std::string> above(sw.begin(), sw.begin() + i);
      const auto [it, fresh] = switch_parent.emplace(sw[i], std::make_pair(above, n));
      if (!fresh && it->second.first != above)
        fail_usage("inconsistent switch tree: switch ", sw[i], " is at \"", join_path(it->second.first),
                   "\" for node ", t.nodes[it->second.second].name, " but at \"", join_path(above), "\" for node ",
                   t.nodes[n].name);
    }
  }
}

// The ranks must be where Slurm says it put them; otherwise the Slurm variables do
// not describe this MPI job.
void check_against_slurm(const Topology& t, const SlurmTask& expected) {
  if (static_cast<int>(expected.nodelist.size()) != t.num_nodes)
    fail_usage("inconsistent layout: Slurm lists ", expected.nodelist.size(), " nodes but the ranks are on ",
               t.num_nodes);
  for (int n = 0; n < t.num_nodes; ++n) {
    if (expected.nodelist[n] != t.nodes[n].name)
      fail_usage("inconsistent layout: Slurm's node ", n, " is ", expected.nodelist[n], " but ranks there say ",
                 t.nodes[n].name);
    if (expected.tasks_per_node[n] != static_cast<int>(t.nodes[n].ranks.size()))
      fail_usage("inconsistent layout: Slurm puts ", expected.tasks_per_node[n], " tasks on node ",
                 t.nodes[n].name, " but ", t.nodes[n].ranks.size(), " ranks say they are there");
  }
}

// Node order: switch path, then name, so that nodes under one leaf switch are
// adjacent and node-major positions keep neighbours close.
void order_nodes(Topology& t) {
  t.node_order.resize(t.num_nodes);
  for (int n = 0; n < t.num_nodes; ++n) t.node_order[n] = n;
  std::sort(t.node_order.begin(), t.node_order.end(), [&](int a, int b) {
    const auto& A = t.nodes[a];
    const auto& B = t.nodes[b];
    if (A.switches != B.switches) return path_less(A.switches, B.switches);
    return natural_less(A.name, B.name);
  });
  t.order_offset.assign(t.num_nodes + 1, 0);
  for (int i = 0; i < t.num_nodes; ++i)
    t.order_offset[i + 1] = t.order_offset[i] + static_cast<int>(t.nodes[t.node_order[i]].ranks.size());
}

}  // namespace

Topology assemble(const std::vector<RankView>& views, int my_rank, const std::string& source,
                  const SlurmTask* expected) {
  check_rank_records(views, my_rank);
  const int world = static_cast<int>(views.size());
  Topology t;
  t.source = source;
  t.world_size = world;
  t.rank = my_rank;
  t.rank_node.assign(world, -1);
  t.rank_local.assign(world, -1);

  const bool by_index = nodes_by_index(views);
  index_nodes(views, by_index, t);
  name_nodes(views, by_index, t);
  number_local_ranks(views, t);
  check_switch_tree(t);
  if (expected) check_against_slurm(t, *expected);
  order_nodes(t);

  t.node = t.rank_node[my_rank];
  t.local_rank = t.rank_local[my_rank];
  t.local_size = static_cast<int>(t.nodes[t.node].ranks.size());
  return t;
}

bool Topology::equal_tasks_per_node() const {
  for (const auto& n : nodes)
    if (n.ranks.size() != nodes.front().ranks.size()) return false;
  return true;
}

void Topology::require_equal_tasks_per_node(std::string_view what) const {
  if (equal_tasks_per_node()) return;
  std::string counts;
  for (int i : node_order) counts += cat(counts.empty() ? "" : ", ", nodes[i].name, "=", nodes[i].ranks.size());
  fail_usage(what, " needs the same number of ranks on every node, but they have ", counts,
             " (use srun --ntasks-per-node)");
}

int Topology::node_position(int n) const {
  for (int i = 0; i < num_nodes; ++i)
    if (node_order[i] == n) return i;
  fail("topology: node index ", n, " out of range (", num_nodes, " nodes)");
}

int Topology::position(int world_rank) const {
  if (world_rank < 0 || world_rank >= world_size)
    fail("topology: rank ", world_rank, " out of range (", world_size, " ranks)");
  return order_offset[node_position(rank_node[world_rank])] + rank_local[world_rank];
}

std::vector<int> Topology::ranks_in_order() const {
  std::vector<int> out;
  out.reserve(world_size);
  for (int n : node_order) out.insert(out.end(), nodes[n].ranks.begin(), nodes[n].ranks.end());
  return out;
}

bool Topology::has_switch_info() const {
  for (const auto& n : nodes)
    if (!n.switches.empty()) return true;
  return false;
}

bool Topology::under_one_leaf_switch(int first, int k) const {
  if (k < 1 || first < 0 || first + k > num_nodes)
    fail("topology: nodes [", first, ", ", first + k, ") out of range (", num_nodes, " nodes)");
  const auto& path = nodes[node_order[first]].switches;
  for (int i = first + 1; i < first + k; ++i)
    if (nodes[node_order[i]].switches != path) return false;
  return true;
}

bool Topology::groups_under_leaf_switch(int k) const {
  if (k < 1 || num_nodes % k != 0) return false;
  for (int first = 0; first < num_nodes; first += k)
    if (!under_one_leaf_switch(first, k)) return false;
  return true;
}

std::string Topology::describe() const {
  std::string s = cat(world_size, " rank", world_size == 1 ? "" : "s", " on ", num_nodes, " node",
                      num_nodes == 1 ? "" : "s", " (", source, "):");
  for (int n : node_order) {
    s += " " + nodes[n].name;
    if (!nodes[n].switches.empty()) s += "[" + nodes[n].switch_path() + "]";
    s += "=" + std::to_string(nodes[n].ranks.size());
  }
  return s;
}

std::map<std::string, int> parse_topology_conf(std::string_view text) {
  std::map<std::string, int> out;
  std::istringstream lines{std::string(text)};
  for (std::string line; std::getline(lines, line);) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string name, nodes;
    for (std::string w; words >> w;) {
      std::string key = w.substr(0, w.find('='));
      const std::string value = w.size() > key.size() ? w.substr(key.size() + 1) : "";
      std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
      if (key == "switchname") name = value;
      if (key == "nodes") nodes = value;
    }
    if (!name.empty() && !nodes.empty()) out[name] = static_cast<int>(expand_hostlist(nodes).size());
  }
  return out;
}

std::map<std::string, int> read_switch_nodes(const Env& env) {
  const auto* conf = lookup(env, "SLURM_CONF");
  std::ifstream in(conf && conf->find('/') != std::string::npos
                       ? conf->substr(0, conf->rfind('/')) + "/topology.conf"
                       : "/etc/slurm/topology.conf");
  if (!in) in.open("/run/slurm/conf/topology.conf");  // slurmd's copy in a configless cluster
  if (!in) return {};
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return parse_topology_conf(text.str());
  } catch (const Error&) {
    return {};  // only a note in the log depends on it
  }
}

Topology discover(MPI_Comm comm) { return discover(comm, process_environment()); }

namespace {

// Parses this rank's Slurm task, if any.  Returns whether the task ids are MPI's
// ranks: the Slurm variables describe MPI's ranks only if srun started each rank as
// its own task; mpiexec inside an allocation starts several ranks per task.  A parse
// error is kept in view.error, to be reported by every rank after the exchange.
int read_slurm_view(const Env& env, int rank, int size, SlurmTask& task, RankView& view) {
  if (!in_slurm_step(env)) return 0;
  try {
    task = parse_slurm_task(env);
    return task.procid == rank && task.ntasks == size;
  } catch (const Error& e) {
    view.error = e.what();
  }
  return 0;
}

struct SharedMemoryGroup {
  int rank = 0, size = 1;
  int key = 0;  // the group's lowest world rank
};

// Shared-memory groups: always computed, so every rank makes the same MPI calls
// whichever way the node is then identified.
SharedMemoryGroup shared_memory_group(MPI_Comm comm, int rank) {
  MPI_Comm shm = MPI_COMM_NULL;
  AMSP_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm));
  SharedMemoryGroup g;
  g.key = rank;
  AMSP_MPI_CHECK(MPI_Comm_rank(shm, &g.rank));
  AMSP_MPI_CHECK(MPI_Comm_size(shm, &g.size));
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &g.key, 1, MPI_INT, MPI_MIN, shm));
  AMSP_MPI_CHECK(MPI_Comm_free(&shm));
  return g;
}

// Without a usable Slurm task the node is the shared-memory group.  It is named by
// SLURMD_NODENAME when set, so that nodes keep Slurm's names when mpiexec started the
// ranks inside an allocation, and by the host name otherwise.
void describe_self_from_mpi(const Env& env, const SharedMemoryGroup& shm, RankView& view) {
  char host[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  AMSP_MPI_CHECK(MPI_Get_processor_name(host, &len));
  const auto* slurm_name = lookup(env, "SLURMD_NODENAME");
  view.node_name = slurm_name && !slurm_name->empty() ? *slurm_name : std::string(host, len);
  view.node_key = shm.key;
  view.local_rank = shm.rank;
  // The switch path is per node, so it holds whoever launched the ranks.
  if (view.error.empty() && slurm_name) {
    try {
      view.switches = slurm_switches(env, *slurm_name);
    } catch (const Error& e) {
      view.error = e.what();
    }
  }
}

// Everyone learns everyone's view (collective on comm).
std::vector<RankView> exchange_views(MPI_Comm comm, int size, const RankView& view) {
  const std::string mine = encode(view);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(size), displs(size);
  AMSP_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm));
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[r] = total;
    total += lens[r];
  }
  std::string all(total, '\0');
  AMSP_MPI_CHECK(
      MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm));
  std::vector<RankView> views(size);
  for (int r = 0; r < size; ++r) views[r] = decode(all.substr(displs[r], lens[r]));
  return views;
}

}  // namespace

Topology discover(MPI_Comm comm, const Env& env) {
  int rank = 0, size = 1;
  AMSP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  AMSP_MPI_CHECK(MPI_Comm_size(comm, &size));

  RankView view;
  view.rank = rank;
  SlurmTask task;
  // Slurm's variables are used only if they describe every rank.
  int slurm_ok = read_slurm_view(env, rank, size, task, view);
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &slurm_ok, 1, MPI_INT, MPI_MIN, comm));
  const SharedMemoryGroup shm = shared_memory_group(comm, rank);

  int local_size = shm.size;
  if (slurm_ok) {
    view.node_name = task.node_name;
    view.node_index = task.nodeid;
    view.local_rank = task.localid;
    view.switches = task.switches;
    local_size = task.tasks_per_node[task.nodeid];
  } else {
    describe_self_from_mpi(env, shm, view);
  }
  GpuInfo gpu;
  if (view.error.empty()) {
    try {
      gpu = parse_gpus(env, view.local_rank, local_size);
    } catch (const Error& e) {
      view.error = e.what();
    }
  }

  const std::vector<RankView> views = exchange_views(comm, size, view);
  Topology t = assemble(views, rank, slurm_ok ? "slurm" : "mpi", slurm_ok ? &task : nullptr);
  t.gpu = gpu;
  if (t.has_switch_info()) t.switch_nodes = read_switch_nodes(env);
  return t;
}

}  // namespace amsp::topology
