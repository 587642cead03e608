// Where every rank runs: nodes, local ranks, the switch tree above the nodes, and the
// GPU a rank should use.  Read from Slurm's variables when launched by srun, from MPI
// (shared-memory groups and processor names) otherwise, and cross-checked between all
// ranks.  See doc/topology.md.
#pragma once

#include <mpi.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace amsp::topology {

// Environment variables, injectable for tests.
using Env = std::map<std::string, std::string>;

// A copy of this process's environment.
Env process_environment();

struct NodeInfo {
  std::string name;                   // Slurm node name (SLURMD_NODENAME) or host name
  std::vector<std::string> switches;  // switch path, top switch first, leaf switch last;
                                      // empty when unknown (no topology plugin, no Slurm)
  std::vector<int> ranks;             // world ranks on this node, indexed by local rank

  std::string switch_path() const;    // "top.s1", "" when unknown
  std::string leaf_switch() const;    // "s1", "" when unknown
};

// GPU selection for later (no CUDA calls here).
struct GpuInfo {
  int count = -1;                    // GPUs this rank can see: the entries of
                                     // CUDA_VISIBLE_DEVICES, else SLURM_GPUS_ON_NODE;
                                     // -1 if neither is set
  std::vector<std::string> visible;  // CUDA_VISIBLE_DEVICES entries as given (ids or UUIDs)
  int device = -1;                   // CUDA device index for this rank, -1 when count <= 0:
                                     // local_rank if count >= local_size, 0 if count == 1,
                                     // local_rank % count otherwise (ranks share GPUs)
};

// Reads CUDA_VISIBLE_DEVICES and SLURM_GPUS_ON_NODE.  A malformed SLURM_GPUS_ON_NODE
// is a UsageError; "", "-1", "none", "NoDevFiles" in CUDA_VISIBLE_DEVICES mean no GPU.
GpuInfo parse_gpus(const Env& env, int local_rank, int local_size);

struct Topology {
  std::string source = "single";  // "slurm", "mpi" (no Slurm step) or "single" (default)
  int world_size = 1, rank = 0;
  int num_nodes = 1, node = 0;    // this rank's node: an index into `nodes`
  int local_rank = 0, local_size = 1;
  std::vector<NodeInfo> nodes;    // by node index: SLURM_NODEID under Slurm, else the order
                                  // of each node's lowest world rank
  std::vector<int> rank_node;     // node index of every world rank
  std::vector<int> rank_local;    // local rank of every world rank
  std::vector<int> node_order;    // node indices sorted by switch path, then name (both
                                  // compared naturally: n2 < n10); nodes under one leaf
                                  // switch are adjacent
  std::vector<int> order_offset;  // order_offset[i]: ranks on nodes node_order[0..i)
  std::map<std::string, int> switch_nodes;  // leaf switch name -> nodes under it in the
                                            // whole cluster (Slurm's topology.conf); empty
                                            // when unknown
  GpuInfo gpu;

  // Same number of ranks on every node?
  bool equal_tasks_per_node() const;
  // Throws UsageError naming the per-node counts unless equal_tasks_per_node();
  // `what` names the plan that needs it ("a 2x2 sharding plan").
  void require_equal_tasks_per_node(std::string_view what = "this run") const;

  // Where node index `node` comes in node_order.
  int node_position(int node) const;
  // A rank's node-major position: ranks of earlier nodes in node_order, plus its
  // local rank.  A permutation of 0..world_size-1.
  int position(int world_rank) const;
  int position() const { return position(rank); }
  // World ranks sorted by position (the inverse permutation).
  std::vector<int> ranks_in_order() const;

  // Does any node have a known switch path?
  bool has_switch_info() const;
  // Do the k nodes node_order[first .. first+k) all sit under one leaf switch (same
  // switch path)?  With no switch information all nodes count as one switch's.
  bool under_one_leaf_switch(int first, int k) const;
  // Does every group of k consecutive whole nodes (node_order[0..k), [k..2k), ...) sit
  // under one leaf switch?  False if k does not divide num_nodes.
  bool groups_under_leaf_switch(int k) const;

  // One line: "8 ranks on 4 nodes (slurm): n1[top.s1]=2 n2[top.s1]=2 ...".
  std::string describe() const;
};

// What one rank knows about itself before the ranks compare notes.  Public so that the
// assembly and its checks can be unit-tested without MPI.
struct RankView {
  int rank = 0;                        // MPI world rank
  std::string node_name;
  int node_index = -1;                 // SLURM_NODEID; -1 in MPI mode (derived from node_key)
  int node_key = -1;                   // MPI mode: lowest world rank of the shared-memory group
  int local_rank = 0;
  std::vector<std::string> switches;
  std::string error;                   // non-empty: discovery failed on this rank, and why
};

// The Slurm step as one task sees it.
struct SlurmTask {
  int procid = 0, nodeid = 0, localid = 0, ntasks = 0;
  std::string node_name;
  std::vector<std::string> nodelist;   // SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST
  std::vector<int> tasks_per_node;     // SLURM_STEP_TASKS_PER_NODE, else SLURM_TASKS_PER_NODE
  std::vector<std::string> switches;   // from SLURM_TOPOLOGY_ADDR(_PATTERN), may be empty
};

// Nodes under each leaf switch (SwitchName=s1 Nodes=n[1-2]) in the text of Slurm's
// topology.conf; switches above others (Switches=...) are left out. UsageError on a
// bad host list.
std::map<std::string, int> parse_topology_conf(std::string_view text);
// The same from topology.conf beside SLURM_CONF (else in /etc/slurm), else from
// slurmd's configless copy in /run/slurm/conf; empty when there is no readable one.
std::map<std::string, int> read_switch_nodes(const Env& env);

// Does env describe a Slurm task (SLURM_JOB_ID and SLURM_PROCID set)?
bool in_slurm_step(const Env& env);
// Parses and checks one task's Slurm variables; UsageError (naming the variable) on
// missing, malformed or self-contradicting values.
SlurmTask parse_slurm_task(const Env& env);

// Builds the topology from every rank's view (views[r] from world rank r) and checks it
// is consistent; `expected` (Slurm mode) adds the checks against the node list and the
// tasks-per-node counts.  Throws UsageError (a rank's discovery failed, or an
// inconsistent or unsupported layout) with one line.
Topology assemble(const std::vector<RankView>& views, int my_rank, const std::string& source,
                  const SlurmTask* expected = nullptr);

// Discovers the topology of `comm` (collective: every rank of comm must call it, and all
// either return the same layout or throw the same error).  Uses Slurm's variables when
// every rank is a task of one Slurm step whose task ids match the MPI ranks; otherwise
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) and MPI_Get_processor_name (node names
// from SLURMD_NODENAME when set).
Topology discover(MPI_Comm comm);
Topology discover(MPI_Comm comm, const Env& env);

}  // namespace amsp::topology
