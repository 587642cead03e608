#include "plan/mesh.h"

#include <set>

#include "core/error.h"

namespace amsp::plan {

const char* group_name(GroupKind kind) {
  switch (kind) {
    case GroupKind::kP: return "P";
    case GroupKind::kG: return "G";
    case GroupKind::kOS: return "OS";
    case GroupKind::kReplica: return "replica";
    case GroupKind::kGather: return "gather";
  }
  return "?";
}

Mesh::Mesh(const ShardPlan& plan, const MeshShape& shape)
    : plan_(plan), shape_(shape), sp_(plan.p.size()), sg_(plan.g.size()), sos_(plan.os.size()) {
  validate(plan_, shape_);
}

Coords Mesh::coords(int64_t pos) const {
  Coords c;
  c.p = pos % sp_;
  c.g = (pos / sp_) % (sg_ / sp_);
  c.o = (pos / sg_) % (sos_ / sg_);
  c.r = pos / sos_;
  return c;
}

int64_t Mesh::position(const Coords& c) const {
  return c.r * sos_ + c.o * sg_ + c.g * sp_ + c.p;
}

int64_t Mesh::group_size(GroupKind kind) const {
  switch (kind) {
    case GroupKind::kP: return sp_;
    case GroupKind::kG: return sg_ / sp_;
    case GroupKind::kOS: return sos_ / sg_;
    case GroupKind::kReplica: return shape_.world() / sos_;
    case GroupKind::kGather: return sos_ / sp_;
  }
  return 0;
}

int64_t Mesh::index_in_group(GroupKind kind, int64_t pos) const {
  const Coords c = coords(pos);
  switch (kind) {
    case GroupKind::kP: return c.p;
    case GroupKind::kG: return c.g;
    case GroupKind::kOS: return c.o;
    case GroupKind::kReplica: return c.r;
    // The all-gather must lay OS-shards out in P-shard order: slice j of the
    // P-shard is held by (g, o) with j = g * (s_os/s_g) + o, so o runs fastest.
    case GroupKind::kGather: return c.g * (sos_ / sg_) + c.o;
  }
  return 0;
}

std::vector<int64_t> Mesh::group_members(GroupKind kind, int64_t pos) const {
  const Coords base = coords(pos);
  std::vector<int64_t> members;
  const int64_t n = group_size(kind);
  members.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Coords c = base;
    switch (kind) {
      case GroupKind::kP: c.p = i; break;
      case GroupKind::kG: c.g = i; break;
      case GroupKind::kOS: c.o = i; break;
      case GroupKind::kReplica: c.r = i; break;
      case GroupKind::kGather:
        c.g = i / (sos_ / sg_);
        c.o = i % (sos_ / sg_);
        break;
    }
    members.push_back(position(c));
  }
  return members;
}

int64_t Mesh::group_nodes(GroupKind kind) const {
  std::set<int64_t> nodes;
  for (int64_t m : group_members(kind, 0)) nodes.insert(m / shape_.ranks_per_node);
  return static_cast<int64_t>(nodes.size());
}

int64_t Mesh::p_shard_index(int64_t pos) const { return coords(pos).p; }

int64_t Mesh::g_shard_index(int64_t pos) const {
  const Coords c = coords(pos);
  return c.p * (sg_ / sp_) + c.g;
}

int64_t Mesh::os_shard_index(int64_t pos) const {
  const Coords c = coords(pos);
  return g_shard_index(pos) * (sos_ / sg_) + c.o;
}

}  // namespace amsp::plan
