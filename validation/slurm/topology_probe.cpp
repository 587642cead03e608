// amsp_topology_probe: prints what topology discovery finds, for the system tests in
// validation/slurm/ (and for a quick look at a new cluster).
//
//   srun --mpi=pmi2 -N 4 --ntasks-per-node=2 amsp_topology_probe [--require-equal]
//       rank 0 prints one JSON object per rank, in rank order, then one summary object
//   amsp_topology_probe --expand EXPR
//       prints the host names of the Slurm host list EXPR, one per line (no MPI)
//
// Errors: one line on stderr (from rank 0), exit code 2 for bad input/layouts.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "topology/hostlist.h"
#include "topology/topology.h"

using amsp::topology::Topology;

namespace {

int expand(const char* expr) {
  try {
    for (const auto& h : amsp::topology::expand_hostlist(expr)) std::cout << h << '\n';
    return 0;
  } catch (const amsp::Error& e) {
    std::cerr << "amsp_topology_probe: " << e.what() << '\n';
    return e.exit_code();
  }
}

std::string rank_json(const Topology& t) {
  const auto& node = t.nodes[t.node];
  nlohmann::json j = {
      {"rank", t.rank},
      {"world_size", t.world_size},
      {"source", t.source},
      {"node_name", node.name},
      {"node", t.node},
      {"num_nodes", t.num_nodes},
      {"local_rank", t.local_rank},
      {"local_size", t.local_size},
      {"switch_path", node.switch_path()},
      {"leaf_switch", node.leaf_switch()},
      {"node_position", t.node_position(t.node)},
      {"position", t.position()},
      {"gpu_count", t.gpu.count},
      {"gpu_device", t.gpu.device},
  };
  return j.dump();
}

std::string summary_json(const Topology& t) {
  nlohmann::json order = nlohmann::json::array(), tasks = nlohmann::json::array();
  for (int n : t.node_order) {
    order.push_back(t.nodes[n].name);
    tasks.push_back(t.nodes[n].ranks.size());
  }
  nlohmann::json groups = nlohmann::json::object();
  for (int k = 1; k <= t.num_nodes; ++k) groups[std::to_string(k)] = t.groups_under_leaf_switch(k);
  nlohmann::json j = {
      {"summary", t.describe()},
      {"node_order", order},
      {"tasks_per_node", tasks},
      {"equal_tasks_per_node", t.equal_tasks_per_node()},
      {"has_switch_info", t.has_switch_info()},
      {"groups_under_leaf_switch", groups},
      {"ranks_in_order", t.ranks_in_order()},
  };
  return j.dump();
}

}  // namespace

int main(int argc, char** argv) {
  bool require_equal = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--expand") == 0 && i + 1 < argc) return expand(argv[i + 1]);
    if (std::strcmp(argv[i], "--require-equal") == 0) {
      require_equal = true;
    } else {
      std::cerr << "usage: amsp_topology_probe [--require-equal] | --expand HOSTLIST\n";
      return amsp::kExitUsage;
    }
  }

  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int code = 0;
  try {
    // discover() either succeeds or throws the same error on every rank.
    const Topology t = amsp::topology::discover(MPI_COMM_WORLD);
    if (require_equal) t.require_equal_tasks_per_node("amsp_topology_probe --require-equal");
    const std::string mine = rank_json(t) + "\n";
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(size), displs(size);
    MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[r] = total;
      total += lens[r];
    }
    std::string all(rank == 0 ? total : 0, '\0');
    MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0) std::cout << all << summary_json(t) << std::endl;
  } catch (const amsp::Error& e) {
    if (rank == 0) std::cerr << "amsp_topology_probe: " << e.what() << std::endl;
    code = e.exit_code();
  }
  MPI_Finalize();
  return code;
}
