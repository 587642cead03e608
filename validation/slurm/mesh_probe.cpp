// Builds the five groups of each shard plan named on the command line on the
// live topology and prints, from rank 0, one JSON line per (plan, rank) with the
// world ranks of every group, as the communicators themselves report them.
//
//   srun --mpi=pmi2 -N 4 --ntasks-per-node=2 amsp_mesh_probe zero3 mics:4 p=1,g=2x1,os=2x2

#include <mpi.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/plan_groups.h"
#include "topology/topology.h"

namespace {

using namespace amsp;

std::vector<int> world_ranks(const comm::Group& g) {
  MPI_Group group, world;
  MPI_Comm_group(g.comm(), &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> in(static_cast<size_t>(g.size())), out(in.size());
  for (int i = 0; i < g.size(); ++i) in[static_cast<size_t>(i)] = i;
  MPI_Group_translate_ranks(group, g.size(), in.data(), world, out.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return out;
}

std::string json_list(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// Gathers one line from every rank and prints them in rank order on rank 0.
void print_from_root(const std::string& line) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int len = static_cast<int>(line.size());
  std::vector<int> lens(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (int i = 0; i < size; ++i) {
    offsets[static_cast<size_t>(i)] = total;
    total += lens[static_cast<size_t>(i)];
  }
  std::vector<char> all(static_cast<size_t>(total) + 1);
  MPI_Gatherv(line.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, 0,
              MPI_COMM_WORLD);
  if (rank == 0) {
    for (int i = 0; i < size; ++i)
      std::printf("%.*s\n", lens[static_cast<size_t>(i)], all.data() + offsets[static_cast<size_t>(i)]);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    const topology::Topology topo = topology::discover(MPI_COMM_WORLD);
    for (int i = 1; i < argc; ++i) {
      const engine::PlanGroups pg = engine::make_plan_groups(MPI_COMM_WORLD, topo, argv[i]);
      std::string line = cat("{\"plan\":\"", argv[i], "\",\"factors\":\"", plan::to_string(pg.mesh.plan()),
                             "\",\"rank\":", topo.rank, ",\"node\":\"", topo.nodes[topo.node].name,
                             "\",\"position\":", pg.position, ",\"placement\":\"", pg.placement,
                             "\",\"groups\":{");
      bool first = true;
      for (plan::GroupKind kind : plan::kAllGroups) {
        line += cat(first ? "" : ",", "\"", plan::group_name(kind), "\":",
                    json_list(world_ranks(pg.group(kind))));
        first = false;
      }
      print_from_root(line + "}}");
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "amsp_mesh_probe: error: %s\n", e.what());
    rc = e.exit_code();
  }
  MPI_Finalize();
  return rc;
}
