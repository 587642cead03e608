#include "topology/topology.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "topology/hostlist.h"

namespace amsp::topology {
namespace {

using Names = std::vector<std::string>;

template <typename F>
std::string usage_error(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << "expected UsageError";
  return {};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The environment srun gives task `procid` of a block-distributed step over `nodes`
// (switch paths as Slurm writes them, "" for none).
Env slurm_env(int procid, const Names& nodes, const std::vector<int>& tasks, const Names& paths,
              const std::string& nodelist, const std::string& tasks_spec) {
  int node = 0, first = 0;
  while (procid >= first + tasks[node]) first += tasks[node++];
  int total = 0;
  for (int t : tasks) total += t;
  Env env = {
      {"SLURM_JOB_ID", "42"},
      {"SLURM_PROCID", std::to_string(procid)},
      {"SLURM_NODEID", std::to_string(node)},
      {"SLURM_LOCALID", std::to_string(procid - first)},
      {"SLURMD_NODENAME", nodes[node]},
      {"SLURM_JOB_NODELIST", nodelist},
      {"SLURM_STEP_NODELIST", nodelist},
      {"SLURM_TASKS_PER_NODE", tasks_spec},
      {"SLURM_STEP_TASKS_PER_NODE", tasks_spec},
      {"SLURM_STEP_NUM_TASKS", std::to_string(total)},
      {"SLURM_NTASKS", std::to_string(total)},
  };
  if (!paths[node].empty()) {
    env["SLURM_TOPOLOGY_ADDR"] = paths[node] + "." + nodes[node];
    env["SLURM_TOPOLOGY_ADDR_PATTERN"] = "switch.switch.node";
  }
  return env;
}

RankView view_of(const SlurmTask& t) {
  RankView v;
  v.rank = t.procid;
  v.node_name = t.node_name;
  v.node_index = t.nodeid;
  v.local_rank = t.localid;
  v.switches = t.switches;
  return v;
}

// Every rank's view and the topology rank `me` assembles, as discover() would under srun.
Topology slurm_topology(const Names& nodes, const std::vector<int>& tasks, const Names& paths,
                        const std::string& nodelist, const std::string& spec, int me = 0) {
  int total = 0;
  for (int t : tasks) total += t;
  std::vector<RankView> views;
  SlurmTask mine;
  for (int r = 0; r < total; ++r) {
    const auto t = parse_slurm_task(slurm_env(r, nodes, tasks, paths, nodelist, spec));
    views.push_back(view_of(t));
    if (r == me) mine = t;
  }
  return assemble(views, me, "slurm", &mine);
}

TEST(SlurmTaskTest, ParsesTheLocalClusterStep) {
  const Names nodes = {"n1", "n2", "n3", "n4"};
  const auto env = slurm_env(5, nodes, {2, 2, 2, 2}, {"top.s1", "top.s1", "top.s2", "top.s2"}, "n[1-4]", "2(x4)");
  ASSERT_TRUE(in_slurm_step(env));
  const auto t = parse_slurm_task(env);
  EXPECT_EQ(t.procid, 5);
  EXPECT_EQ(t.nodeid, 2);
  EXPECT_EQ(t.localid, 1);
  EXPECT_EQ(t.ntasks, 8);
  EXPECT_EQ(t.node_name, "n3");
  EXPECT_EQ(t.nodelist, nodes);
  EXPECT_EQ(t.tasks_per_node, std::vector<int>({2, 2, 2, 2}));
  EXPECT_EQ(t.switches, Names({"top", "s2"}));
  EXPECT_FALSE(in_slurm_step({{"SLURM_JOB_ID", "1"}}));
  EXPECT_FALSE(in_slurm_step({}));
}

TEST(SlurmTaskTest, StepVariablesWinOverJobVariables) {
  auto env = slurm_env(1, {"n1", "n2"}, {1, 1}, {"", ""}, "n[1-2]", "1(x2)");
  env["SLURM_JOB_NODELIST"] = "n[1-4]";
  env["SLURM_TASKS_PER_NODE"] = "2(x4)";
  env["SLURM_NTASKS"] = "8";
  const auto t = parse_slurm_task(env);
  EXPECT_EQ(t.nodelist, Names({"n1", "n2"}));
  EXPECT_EQ(t.ntasks, 2);
  EXPECT_TRUE(t.switches.empty());
}

TEST(SlurmTaskTest, TopologyAddrWithoutPatternOrSwitches) {
  auto env = slurm_env(0, {"n1"}, {1}, {""}, "n1", "1");
  env["SLURM_TOPOLOGY_ADDR"] = "n1";
  env["SLURM_TOPOLOGY_ADDR_PATTERN"] = "node";
  EXPECT_TRUE(parse_slurm_task(env).switches.empty());
  env["SLURM_TOPOLOGY_ADDR"] = "core.leaf3.n1";
  env.erase("SLURM_TOPOLOGY_ADDR_PATTERN");
  EXPECT_EQ(parse_slurm_task(env).switches, Names({"core", "leaf3"}));
}

TEST(SlurmTaskTest, BadVariablesNameTheCulprit) {
  const auto base = slurm_env(3, {"n1", "n2"}, {2, 2}, {"top.s1", "top.s1"}, "n[1-2]", "2(x2)");
  struct Case {
    const char* key;
    const char* value;  // nullptr: erase
    const char* expect;
  };
  const Case cases[] = {
      {"SLURM_LOCALID", "x", "SLURM_LOCALID=\"x\" is not a non-negative integer"},
      {"SLURM_NODEID", nullptr, "without SLURM_NODEID"},
      {"SLURMD_NODENAME", nullptr, "without SLURMD_NODENAME"},
      {"SLURM_STEP_NODELIST", "n[2-1]", "SLURM_STEP_NODELIST: bad host list"},
      {"SLURM_STEP_NODELIST", "n[1-3]", "counts 2 nodes but SLURM_STEP_NODELIST"},
      {"SLURM_STEP_NODELIST", "n1,n1", "names node n1 twice"},
      {"SLURM_STEP_NODELIST", "m[1-2]", "SLURMD_NODENAME=n2"},
      {"SLURM_STEP_TASKS_PER_NODE", "2(x0)", "SLURM_STEP_TASKS_PER_NODE: bad tasks-per-node list"},
      {"SLURM_STEP_TASKS_PER_NODE", "3,1", "SLURM_LOCALID=1 but"},
      {"SLURM_STEP_TASKS_PER_NODE", "2,0", "no tasks"},
      {"SLURM_STEP_NUM_TASKS", "5", "SLURM_STEP_NUM_TASKS=5 but SLURM_STEP_TASKS_PER_NODE=\"2(x2)\" adds up to 4"},
      {"SLURM_PROCID", "4", "SLURM_PROCID=4 but the step has only 4 tasks"},
      {"SLURM_NODEID", "2", "SLURM_NODEID=2 but"},
      {"SLURM_TOPOLOGY_ADDR", "top.s1.n1", "ends in node n1 but SLURMD_NODENAME=n2"},
      {"SLURM_TOPOLOGY_ADDR_PATTERN", "switch.node", "ends in node s1.n2"},  // dotted node name
      {"SLURM_TOPOLOGY_ADDR_PATTERN", "switch.switch.switch.node", "3 components"},
      {"SLURM_HET_SIZE", "2", "heterogeneous"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key);
    auto env = base;
    if (c.value) env[c.key] = c.value;
    else env.erase(c.key);
    const auto msg = usage_error([&] { parse_slurm_task(env); });
    EXPECT_TRUE(contains(msg, c.expect)) << msg;
  }
  // Step variables missing, the job's used.
  auto env = base;
  env.erase("SLURM_STEP_NODELIST");
  env.erase("SLURM_STEP_TASKS_PER_NODE");
  env.erase("SLURM_STEP_NUM_TASKS");
  EXPECT_EQ(parse_slurm_task(env).ntasks, 4);
  env.erase("SLURM_JOB_NODELIST");
  EXPECT_TRUE(contains(usage_error([&] { parse_slurm_task(env); }), "without SLURM_STEP_NODELIST"));
}

TEST(AssembleTest, FourNodesTwoSwitches) {
  const Names nodes = {"n1", "n2", "n3", "n4"};
  const auto t = slurm_topology(nodes, {2, 2, 2, 2}, {"top.s1", "top.s1", "top.s2", "top.s2"}, "n[1-4]", "2(x4)", 5);
  EXPECT_EQ(t.source, "slurm");
  EXPECT_EQ(t.world_size, 8);
  EXPECT_EQ(t.rank, 5);
  EXPECT_EQ(t.num_nodes, 4);
  EXPECT_EQ(t.node, 2);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_size, 2);
  EXPECT_EQ(t.nodes[2].name, "n3");
  EXPECT_EQ(t.nodes[2].switch_path(), "top.s2");
  EXPECT_EQ(t.nodes[2].leaf_switch(), "s2");
  EXPECT_EQ(t.nodes[2].ranks, std::vector<int>({4, 5}));
  EXPECT_EQ(t.node_order, std::vector<int>({0, 1, 2, 3}));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(t.position(r), r);
  EXPECT_TRUE(t.equal_tasks_per_node());
  EXPECT_NO_THROW(t.require_equal_tasks_per_node());
  EXPECT_TRUE(t.has_switch_info());
  EXPECT_TRUE(t.groups_under_leaf_switch(1));
  EXPECT_TRUE(t.groups_under_leaf_switch(2));
  EXPECT_FALSE(t.groups_under_leaf_switch(4));
  EXPECT_FALSE(t.groups_under_leaf_switch(3));
  EXPECT_TRUE(t.under_one_leaf_switch(2, 2));
  EXPECT_FALSE(t.under_one_leaf_switch(1, 2));
  EXPECT_EQ(t.describe(), "8 ranks on 4 nodes (slurm): n1[top.s1]=2 n2[top.s1]=2 n3[top.s2]=2 n4[top.s2]=2");
}

TEST(AssembleTest, NodesSortedBySwitchThenName) {
  // Slurm's node list is sorted by name; the switches interleave.
  const Names nodes = {"n1", "n2", "n3", "n4", "n10"};
  const Names paths = {"top.s2", "top.s1", "top.s2", "top.s1", "top.s1"};
  const auto t = slurm_topology(nodes, {1, 1, 1, 1, 1}, paths, "n[1-4],n10", "1(x5)");
  // s1: n2, n4, n10 (natural order: n4 < n10), then s2: n1, n3.
  EXPECT_EQ(t.node_order, std::vector<int>({1, 3, 4, 0, 2}));
  EXPECT_EQ(t.ranks_in_order(), std::vector<int>({1, 3, 4, 0, 2}));
  EXPECT_EQ(t.position(1), 0);
  EXPECT_EQ(t.position(0), 3);
  EXPECT_EQ(t.node_position(4), 2);
  EXPECT_TRUE(t.under_one_leaf_switch(0, 3));
  EXPECT_FALSE(t.under_one_leaf_switch(2, 2));
  EXPECT_TRUE(t.under_one_leaf_switch(3, 2));
}

TEST(AssembleTest, UnequalTasksAndCyclicRanks) {
  const auto t = slurm_topology({"n1", "n2"}, {2, 1}, {"top.s1", "top.s1"}, "n[1-2]", "2,1", 2);
  EXPECT_EQ(t.local_size, 1);
  EXPECT_EQ(t.node, 1);
  EXPECT_FALSE(t.equal_tasks_per_node());
  const auto msg = usage_error([&] { t.require_equal_tasks_per_node("a 2x2 plan"); });
  EXPECT_TRUE(contains(msg, "a 2x2 plan needs the same number of ranks on every node")) << msg;
  EXPECT_TRUE(contains(msg, "n1=2, n2=1")) << msg;

  // --distribution=cyclic: rank r on node r % 2.  Positions stay node-major.
  std::vector<RankView> views;
  for (int r = 0; r < 4; ++r) {
    RankView v;
    v.rank = r;
    v.node_index = r % 2;
    v.node_name = r % 2 ? "b" : "a";
    v.local_rank = r / 2;
    views.push_back(v);
  }
  const auto c = assemble(views, 1, "slurm");
  EXPECT_EQ(c.nodes[0].ranks, std::vector<int>({0, 2}));
  EXPECT_EQ(c.position(2), 1);
  EXPECT_EQ(c.position(1), 2);
  EXPECT_EQ(c.ranks_in_order(), std::vector<int>({0, 2, 1, 3}));
  EXPECT_FALSE(c.has_switch_info());
  EXPECT_TRUE(c.groups_under_leaf_switch(2));  // no switch information: one network
}

std::vector<RankView> mpi_views(const std::vector<int>& keys, const Names& hosts, const std::vector<int>& locals) {
  std::vector<RankView> views;
  for (size_t r = 0; r < keys.size(); ++r) {
    RankView v;
    v.rank = static_cast<int>(r);
    v.node_key = keys[r];
    v.node_name = hosts[r];
    v.local_rank = locals[r];
    views.push_back(v);
  }
  return views;
}

TEST(AssembleTest, MpiModeGroupsBySharedMemory) {
  const auto t = assemble(mpi_views({0, 0, 0, 0}, {"h", "h", "h", "h"}, {0, 1, 2, 3}), 3, "mpi");
  EXPECT_EQ(t.num_nodes, 1);
  EXPECT_EQ(t.local_rank, 3);
  EXPECT_EQ(t.local_size, 4);
  EXPECT_EQ(t.nodes[0].name, "h");
  const auto u = assemble(mpi_views({0, 1, 0, 1}, {"b", "a", "b", "a"}, {0, 0, 1, 1}), 1, "mpi");
  EXPECT_EQ(u.num_nodes, 2);
  EXPECT_EQ(u.nodes[0].name, "b");  // node index follows the lowest world rank
  EXPECT_EQ(u.node_order, std::vector<int>({1, 0}));  // order follows the name
  EXPECT_EQ(u.position(1), 0);
  EXPECT_EQ(u.position(0), 2);
}

TEST(AssembleTest, InconsistentLayoutsAreOneLineErrors) {
  auto slurm_views = [] {
    std::vector<RankView> views;
    for (int r = 0; r < 4; ++r) {
      RankView v;
      v.rank = r;
      v.node_index = r / 2;
      v.node_name = r / 2 ? "n2" : "n1";
      v.local_rank = r % 2;
      v.switches = {"top", "s1"};
      views.push_back(v);
    }
    return views;
  };
  auto v = slurm_views();
  v[1].local_rank = 0;
  EXPECT_TRUE(contains(usage_error([&] { assemble(v, 0, "slurm"); }), "ranks 0 and 1 both claim local rank 0 on node n1"));
  v = slurm_views();
  v[3].node_name = "n3";
  EXPECT_TRUE(contains(usage_error([&] { assemble(v, 0, "slurm"); }), "both say node id 1 but name it n2 and n3"));
  v = slurm_views();
  v[2].node_name = "n1";
  v[3].node_name = "n1";
  EXPECT_TRUE(contains(usage_error([&] { assemble(v, 0, "slurm"); }), "are both on node n1 but say node ids 0 and 1"));
  v = slurm_views();
  v[2].node_index = v[3].node_index = 2;
  EXPECT_TRUE(contains(usage_error([&] { assemble(v, 0, "slurm"); }), "no rank says it is on node id 1"));
  v = slurm_views();
  v[3].local_rank = 5;
  EXPECT_TRUE(contains(usage_error([&] { assemble(v, 0, "slurm"); }), "rank 3 says local rank 5 on node n2"));
  v = slurm_views();
  v[3].switches = {"top", "s2"};
  EXPECT_TRUE(contains(usage_error([&] { assemble(v, 0, "slurm"); }), "report switch paths \"top.s1\" and \"top.s2\""));
  v = slurm_views();
  v[2].switches = v[3].switches = {"other", "s1"};
  EXPECT_TRUE(contains(usage_error([&] { assemble(v, 0, "slurm"); }), "inconsistent switch tree: switch s1"));
  v = slurm_views();
  v[2].error = "SLURM_LOCALID=\"x\" is not a non-negative integer";
  v[3].error = "same";
  EXPECT_EQ(usage_error([&] { assemble(v, 0, "slurm"); }),
            "topology discovery failed on rank 2: SLURM_LOCALID=\"x\" is not a non-negative integer (and on 1 other rank)");

  // Against Slurm's own node list and counts.
  SlurmTask expect;
  expect.nodelist = {"n1", "n2"};
  expect.tasks_per_node = {2, 3};
  EXPECT_TRUE(contains(usage_error([&] { assemble(slurm_views(), 0, "slurm", &expect); }),
                       "Slurm puts 3 tasks on node n2 but 2 ranks say they are there"));
  expect.nodelist = {"n1", "n9"};
  expect.tasks_per_node = {2, 2};
  EXPECT_TRUE(contains(usage_error([&] { assemble(slurm_views(), 0, "slurm", &expect); }), "Slurm's node 1 is n9"));

  // MPI mode: hosts and shared-memory groups must agree.
  EXPECT_TRUE(contains(usage_error([] { assemble(mpi_views({0, 0}, {"a", "b"}, {0, 1}), 0, "mpi"); }),
                       "share memory but report hosts a and b"));
  EXPECT_TRUE(contains(usage_error([] { assemble(mpi_views({0, 1}, {"a", "a"}, {0, 0}), 0, "mpi"); }),
                       "both run on host a but MPI puts them in different shared-memory groups"));
  EXPECT_TRUE(contains(usage_error([] { assemble(mpi_views({1, 1}, {"a", "a"}, {1, 0}), 0, "mpi"); }),
                       "names rank 1 as the first"));
}

TEST(GpuTest, DeviceFromLocalRank) {
  EXPECT_EQ(parse_gpus({}, 0, 1).count, -1);
  EXPECT_EQ(parse_gpus({}, 0, 1).device, -1);
  auto g = parse_gpus({{"CUDA_VISIBLE_DEVICES", "0,1,2,3"}}, 2, 4);
  EXPECT_EQ(g.count, 4);
  EXPECT_EQ(g.device, 2);
  EXPECT_EQ(g.visible, Names({"0", "1", "2", "3"}));
  g = parse_gpus({{"CUDA_VISIBLE_DEVICES", "3"}}, 2, 4);  // one GPU per task (--gpus-per-task)
  EXPECT_EQ(g.count, 1);
  EXPECT_EQ(g.device, 0);
  g = parse_gpus({{"CUDA_VISIBLE_DEVICES", "GPU-aa,GPU-bb"}}, 3, 4);  // shared: local rank mod count
  EXPECT_EQ(g.device, 1);
  EXPECT_EQ(parse_gpus({{"CUDA_VISIBLE_DEVICES", ""}}, 0, 1).count, 0);
  EXPECT_EQ(parse_gpus({{"CUDA_VISIBLE_DEVICES", "NoDevFiles"}}, 0, 1).device, -1);
  EXPECT_EQ(parse_gpus({{"CUDA_VISIBLE_DEVICES", "0,-1,2"}}, 0, 1).count, 1);
  g = parse_gpus({{"SLURM_GPUS_ON_NODE", "8"}}, 5, 8);
  EXPECT_EQ(g.count, 8);
  EXPECT_EQ(g.device, 5);
  // CUDA_VISIBLE_DEVICES wins over SLURM_GPUS_ON_NODE.
  EXPECT_EQ(parse_gpus({{"SLURM_GPUS_ON_NODE", "8"}, {"CUDA_VISIBLE_DEVICES", "1,2"}}, 0, 2).count, 2);
  EXPECT_TRUE(contains(usage_error([] { parse_gpus({{"SLURM_GPUS_ON_NODE", "two"}}, 0, 1); }),
                       "SLURM_GPUS_ON_NODE=\"two\""));
}

TEST(TopologyConf, LeafSwitchSizes) {
  // As slurm/local-cluster/start.sh writes it, plus a comment and lower-case keys.
  const char* text =
      "# two leaf switches\n"
      "SwitchName=s1 Nodes=n[1-2]\n"
      "switchname=s2 nodes=n[3-5],m7 LinkSpeed=100  # three plus one\n"
      "SwitchName=top Switches=s[1-2]\n";
  const std::map<std::string, int> want = {{"s1", 2}, {"s2", 4}};
  EXPECT_EQ(parse_topology_conf(text), want);
  EXPECT_TRUE(parse_topology_conf("").empty());
  EXPECT_TRUE(read_switch_nodes({{"SLURM_CONF", "/nonexistent/slurm.conf"}}).empty());
}

}  // namespace
}  // namespace amsp::topology
