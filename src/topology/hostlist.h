// Parsers for the compact notations Slurm uses in its environment variables:
// host lists (SLURM_JOB_NODELIST), task counts per node (SLURM_TASKS_PER_NODE) and
// switch addresses (SLURM_TOPOLOGY_ADDR).  Pure functions, no Slurm needed; bad
// input throws amsp::UsageError with a one-line message.  See doc/topology.md.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace amsp::topology {

// Expands a Slurm host list into host names, in Slurm's order, duplicates kept:
//   "n[001-003]"               -> n001 n002 n003   (the low bound's width sets the padding)
//   "a[1-2,5],b7,c[01-02]x[3-4]" -> a1 a2 a5 b7 c01x3 c01x4 c02x3 c02x4
//   "rack[1-2]-n[1-2]"         -> rack1-n1 rack1-n2 rack2-n1 rack2-n2 (first group slowest)
// Entries are separated by commas or white space outside brackets; empty entries are
// skipped, so "" gives an empty list.  Unbalanced or nested brackets, empty or reversed
// ranges, non-numeric bounds and lists of more than kMaxHosts names are errors.
std::vector<std::string> expand_hostlist(std::string_view expr);

// The most names expand_hostlist produces before it gives up.
inline constexpr size_t kMaxHosts = 1 << 20;

// Expands Slurm's tasks-per-node notation: "2(x3),1" -> {2, 2, 2, 1}.  Every count
// must be a non-negative integer, every repetition a positive one.
std::vector<int> parse_tasks_per_node(std::string_view spec);

// A node's place in the switch tree, from SLURM_TOPOLOGY_ADDR and its pattern.
struct SwitchAddress {
  std::vector<std::string> switches;  // from the top switch down to the leaf switch
  std::string node;                   // the node's own name (last component)
};

// Splits SLURM_TOPOLOGY_ADDR ("top.s1.n2") by the dotted SLURM_TOPOLOGY_ADDR_PATTERN
// ("switch.switch.node").  The pattern must be some "switch" components followed by one
// "node"; without a topology plugin Slurm sets "n2" / "node" (no switches).  If the
// address has more components than the pattern, the extra ones are part of the node's
// name (node names may contain dots).
SwitchAddress parse_topology_addr(std::string_view addr, std::string_view pattern);

// Joins switch names with '.': {"top", "s1"} -> "top.s1"; {} -> "".
std::string join_path(const std::vector<std::string>& switches);

// Orders strings so that digit runs compare as numbers: "n2" < "n10", "s1" < "s2".
// Ties in value ("n01" vs "n1") fall back to plain comparison, so the order is total.
bool natural_less(std::string_view a, std::string_view b);

}  // namespace amsp::topology
