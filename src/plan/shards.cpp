#include "plan/shards.h"

namespace amsp::plan {

std::vector<UnitShards> unit_shards(const std::vector<model::UnitSpec>& units,
                                    const Mesh& mesh, int64_t pos) {
  const ShardPlan& plan = mesh.plan();
  std::vector<UnitShards> out;
  out.reserve(units.size());
  for (const auto& unit : units) {
    UnitShards s;
    s.numel = unit.numel;
    s.padded = padded_numel(unit.numel, plan.os.size());
    s.p.size = s.padded / plan.p.size();
    s.p.begin = mesh.p_shard_index(pos) * s.p.size;
    s.g.size = s.padded / plan.g.size();
    s.g.begin = mesh.g_shard_index(pos) * s.g.size;
    s.os.size = s.padded / plan.os.size();
    s.os.begin = mesh.os_shard_index(pos) * s.os.size;
    out.push_back(s);
  }
  return out;
}

int64_t model_state_bytes(const std::vector<UnitShards>& shards, const StateBytes& b) {
  int64_t bytes = 0;
  for (const auto& s : shards) bytes += b.p * s.p.size + b.g * s.g.size + b.os * s.os.size;
  return bytes;
}

}  // namespace amsp::plan
