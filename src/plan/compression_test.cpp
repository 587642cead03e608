#include "plan/compression.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace amsp::plan {
namespace {

TEST(Compression, OffIsTheDefaultAndCompressesNothing) {
  EXPECT_FALSE(parse_compression("off").any());
  EXPECT_EQ(parse_compression("off"), Compression{});
  EXPECT_EQ(to_string(Compression{}), "off");
}

TEST(Compression, ParsesWidthsBlockAndScope) {
  const Compression c = parse_compression("p=int8,g=int4,block=64");
  EXPECT_EQ(c.p_bits, 8);
  EXPECT_EQ(c.g_bits, 4);
  EXPECT_EQ(c.block, 64);
  EXPECT_FALSE(c.inter_node_only);
  EXPECT_EQ(to_string(c), "p=int8,g=int4,block=64");
  const Compression g = parse_compression("g=int8");
  EXPECT_EQ(g.p_bits, 0);
  EXPECT_EQ(g.block, 256);
  EXPECT_EQ(to_string(g), "p=off,g=int8,block=256");
  const Compression coarse = parse_compression("g=int4,block=chunk");
  EXPECT_EQ(coarse.block, Compression::kChunk);
  EXPECT_EQ(to_string(coarse), "p=off,g=int4,block=chunk");
}

TEST(Compression, OnAndInterNodeMeanInt8Both) {
  EXPECT_EQ(to_string(parse_compression("on")), "p=int8,g=int8,block=256");
  EXPECT_EQ(to_string(parse_compression("inter-node")), "p=int8,g=int8,block=256,inter-node");
  EXPECT_EQ(to_string(parse_compression("g=int8,inter-node")), "p=off,g=int8,block=256,inter-node");
  // The canonical text parses back to the same.
  for (const char* t : {"on", "inter-node", "p=int4,g=off,block=chunk", "g=int8,block=7"})
    EXPECT_EQ(parse_compression(to_string(parse_compression(t))), parse_compression(t)) << t;
}

TEST(Compression, SpecsFollowTheScope) {
  const Compression all = parse_compression("p=int8,g=int4,block=32");
  ASSERT_TRUE(compression_spec(all, Compressed::kParams, 1).has_value());
  EXPECT_EQ(compression_spec(all, Compressed::kParams, 1)->bits, 8);
  EXPECT_EQ(compression_spec(all, Compressed::kGrads, 3)->bits, 4);
  EXPECT_EQ(compression_spec(all, Compressed::kGrads, 3)->block, 32);
  const Compression inter = parse_compression("inter-node");
  EXPECT_FALSE(compression_spec(inter, Compressed::kParams, 1).has_value());
  EXPECT_TRUE(compression_spec(inter, Compressed::kParams, 2).has_value());
  EXPECT_FALSE(compression_spec(parse_compression("g=int8"), Compressed::kParams, 4).has_value());
}

TEST(Compression, RefusesWhatItDoesNotKnowInOneLine) {
  for (const char* bad : {"", "p=int2", "g=fp8", "block=0", "block=-3", "block=12x", "q=int8",
                          "p=off", "on,p=int8", "p", "int8", "p=int8,,g=int8"}) {
    try {
      parse_compression(bad);
      ADD_FAILURE() << "accepted --compress " << bad;
    } catch (const UsageError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--compress"), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  }
}


// --compress auto lets --shard auto choose among int8 for the parameters, the
// gradients or both, everywhere or across nodes only (and off); int4 never.
TEST(Compression, AutoLeavesTheChoiceToThePlanner) {
  const Compression c = parse_compression("auto");
  EXPECT_TRUE(c.choose);
  EXPECT_FALSE(c.any());
  EXPECT_EQ(to_string(c), "auto");
  EXPECT_FALSE(compression_spec(c, Compressed::kParams, 4));
  const std::vector<Compression> all = compression_candidates();
  EXPECT_EQ(all.size(), 6u);
  for (const Compression& k : all) {
    EXPECT_TRUE(k.any());
    EXPECT_FALSE(k.choose);
    EXPECT_TRUE((k.p_bits == 0 || k.p_bits == 8) && (k.g_bits == 0 || k.g_bits == 8)) << to_string(k);
    EXPECT_EQ(k.block, 256);
  }
}

}  // namespace
}  // namespace amsp::plan
