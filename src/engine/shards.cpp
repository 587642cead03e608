#include "engine/shards.h"

namespace amsp::engine {

int64_t padded_numel(int64_t numel, const plan::ShardPlan& plan) {
  const int64_t s = plan.os.size();
  return (numel + s - 1) / s * s;
}

std::vector<UnitShards> unit_shards(const std::vector<model::UnitSpec>& units,
                                    const plan::Mesh& mesh, int64_t pos) {
  const plan::ShardPlan& plan = mesh.plan();
  std::vector<UnitShards> out;
  out.reserve(units.size());
  for (const auto& unit : units) {
    UnitShards s;
    s.numel = unit.numel;
    s.padded = padded_numel(unit.numel, plan);
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

int64_t model_state_bytes(const std::vector<UnitShards>& shards) {
  int64_t bytes = 0;
  for (const auto& s : shards) bytes += 4 * s.p.size + 4 * s.g.size + 8 * s.os.size;
  return bytes;
}

}  // namespace amsp::engine
