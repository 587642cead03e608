#include "plan/shards.h"

#include <gtest/gtest.h>

#include "model/config.h"

namespace amsp::plan {
namespace {

TEST(Shards, NestAndCoverEveryUnit) {
  const model::LlamaConfig config = model::load_config("tiny");
  const auto units = model::build_layout(config);
  const MeshShape shape{2, 4};
  for (const char* text : {"ddp", "zero1", "zero2", "zero3", "mics:2", "mics:4", "p=1,g=2x1,os=2x2",
                           "p=2x1,g=2x2,os=2x4"}) {
    const Mesh mesh(parse_shard_plan(text, shape), shape);
    std::vector<std::vector<int>> os_owner(units.size());
    for (int64_t pos = 0; pos < shape.world(); ++pos) {
      const auto shards = unit_shards(units, mesh, pos);
      for (size_t u = 0; u < units.size(); ++u) {
        const UnitShards& s = shards[u];
        EXPECT_EQ(s.padded % mesh.plan().os.size(), 0) << text;
        EXPECT_GE(s.padded, s.numel);
        EXPECT_LT(s.padded - s.numel, mesh.plan().os.size());
        EXPECT_TRUE(s.p.begin <= s.g.begin && s.g.end() <= s.p.end()) << text;
        EXPECT_TRUE(s.g.begin <= s.os.begin && s.os.end() <= s.g.end()) << text;
        os_owner[u].resize(static_cast<size_t>(s.padded / s.os.size), 0);
        ++os_owner[u][static_cast<size_t>(s.os.begin / s.os.size)];
      }
    }
    // Every OS slice is held by exactly one rank per replica.
    const int64_t replicas = mesh.group_size(GroupKind::kReplica);
    for (const auto& owners : os_owner)
      for (int n : owners) EXPECT_EQ(n, replicas) << text;
  }
}

TEST(Shards, ModelStateBytesByHand) {
  // One unit of 10 elements on 4 ranks: zero3 pads to 12, each rank holds 3 of
  // each state: 4*3 + 4*3 + 8*3 = 48 bytes. ddp holds everything unpadded.
  const StateBytes fp32 = state_bytes(Precision::kFp32);
  model::UnitSpec unit{model::UnitKind::kEmbedding, -1, "embed", {}, 10};
  const MeshShape shape{4, 1};
  const Mesh zero3(parse_shard_plan("zero3", shape), shape);
  EXPECT_EQ(model_state_bytes(unit_shards({unit}, zero3, 1), fp32), 48);
  const Mesh ddp(parse_shard_plan("ddp", shape), shape);
  EXPECT_EQ(model_state_bytes(unit_shards({unit}, ddp, 1), fp32), 160);
  const Mesh zero1(parse_shard_plan("zero1", shape), shape);
  EXPECT_EQ(model_state_bytes(unit_shards({unit}, zero1, 3), fp32), 4 * 12 + 4 * 12 + 8 * 3);
  // bf16: bf16 parameters, fp32 gradient accumulator, fp32 master + moments.
  EXPECT_EQ(model_state_bytes(unit_shards({unit}, zero3, 1), state_bytes(Precision::kBf16)),
            2 * 3 + 4 * 3 + 12 * 3);
}

}  // namespace
}  // namespace amsp::plan
