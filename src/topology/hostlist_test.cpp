#include "topology/hostlist.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"

namespace amsp::topology {
namespace {

using Names = std::vector<std::string>;

// Expects a one-line UsageError whose message contains `part`.
template <typename F>
void expect_usage_error(F&& f, const std::string& part) {
  try {
    f();
    FAIL() << "expected UsageError containing \"" << part << "\"";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(HostlistTest, PlainNamesAndSeparators) {
  EXPECT_EQ(expand_hostlist("x"), Names({"x"}));
  EXPECT_EQ(expand_hostlist("a,b c\td"), Names({"a", "b", "c", "d"}));
  EXPECT_EQ(expand_hostlist(",n1,,n2,"), Names({"n1", "n2"}));
  EXPECT_TRUE(expand_hostlist("").empty());
  EXPECT_EQ(expand_hostlist("n-1"), Names({"n-1"}));
  EXPECT_EQ(expand_hostlist("node.example.org"), Names({"node.example.org"}));
}

TEST(HostlistTest, RangesAndPadding) {
  EXPECT_EQ(expand_hostlist("n[1-4]"), Names({"n1", "n2", "n3", "n4"}));
  EXPECT_EQ(expand_hostlist("n[001-003]"), Names({"n001", "n002", "n003"}));
  EXPECT_EQ(expand_hostlist("n[08-11]"), Names({"n08", "n09", "n10", "n11"}));
  // Slurm pads to the width of the low bound: n[1-003] is n1..n3, n[001-3] is n001..n003.
  EXPECT_EQ(expand_hostlist("n[1-003]"), Names({"n1", "n2", "n3"}));
  EXPECT_EQ(expand_hostlist("n[001-3]"), Names({"n001", "n002", "n003"}));
  EXPECT_EQ(expand_hostlist("n[007]"), Names({"n007"}));
  EXPECT_EQ(expand_hostlist("n[0-1]"), Names({"n0", "n1"}));
  const auto big = expand_hostlist("n[01-100]");
  ASSERT_EQ(big.size(), 100u);
  EXPECT_EQ(big.front(), "n01");
  EXPECT_EQ(big[98], "n99");
  EXPECT_EQ(big.back(), "n100");
}

TEST(HostlistTest, CommasInsideAndOutsideBrackets) {
  EXPECT_EQ(expand_hostlist("a[1-2,5],b7,c[01-02]x[3-4]"),
            Names({"a1", "a2", "a5", "b7", "c01x3", "c01x4", "c02x3", "c02x4"}));
  EXPECT_EQ(expand_hostlist("n[1,3-4,10]"), Names({"n1", "n3", "n4", "n10"}));
  EXPECT_EQ(expand_hostlist("n[1-2],n1"), Names({"n1", "n2", "n1"}));  // duplicates kept, like Slurm
}

TEST(HostlistTest, SeveralBracketGroupsInSlurmsOrder) {
  EXPECT_EQ(expand_hostlist("rack[1-2]-n[1-2]"), Names({"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"}));
  EXPECT_EQ(expand_hostlist("n[1-2][3]"), Names({"n13", "n23"}));
  EXPECT_EQ(expand_hostlist("n[1-2]x[5]"), Names({"n1x5", "n2x5"}));
  // Three or more groups: Slurm varies the last fastest, then the first, second, ...
  // (checked against `scontrol show hostnames` by validation/slurm).
  EXPECT_EQ(expand_hostlist("a[1-2]b[1-2]c[1-2]"),
            Names({"a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2", "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2"}));
  const auto four = expand_hostlist("a[1-2]b[1-2]c[1-2]d[1-2]");
  ASSERT_EQ(four.size(), 16u);
  EXPECT_EQ(Names(four.begin(), four.begin() + 5), Names({"a1b1c1d1", "a1b1c1d2", "a2b1c1d1", "a2b1c1d2", "a1b2c1d1"}));
  EXPECT_EQ(four[8], "a1b1c2d1");
  EXPECT_EQ(expand_hostlist("n[9-10]y"), Names({"n9y", "n10y"}));  // Slurm itself rejects this one
}

TEST(HostlistTest, BadExpressionsAreOneLineErrors) {
  expect_usage_error([] { expand_hostlist("n[1-2"); }, "never closed");
  expect_usage_error([] { expand_hostlist("n1]"); }, "']' without '['");
  expect_usage_error([] { expand_hostlist("n[1-3]]"); }, "']' without '['");
  expect_usage_error([] { expand_hostlist("n[[1-2]]"); }, "nested");
  expect_usage_error([] { expand_hostlist("n[3-1]"); }, "reversed");
  expect_usage_error([] { expand_hostlist("n[]"); }, "empty range");
  expect_usage_error([] { expand_hostlist("n[1,,2]"); }, "empty range");
  expect_usage_error([] { expand_hostlist("n[a-b]"); }, "\"a-b\"");
  expect_usage_error([] { expand_hostlist("n[-1]"); }, "\"-1\"");
  expect_usage_error([] { expand_hostlist("n[1-2-3]"); }, "\"1-2-3\"");
  expect_usage_error([] { expand_hostlist("n[ 1-2]"); }, "white space");
  expect_usage_error([] { expand_hostlist("n[1-99999999]"); }, "more than");
  expect_usage_error([] { expand_hostlist("a[1-2000]b[1-2000]"); }, "more than");
  expect_usage_error([] { expand_hostlist("n[3-1]"); }, "bad host list \"n[3-1]\"");
}

TEST(TasksPerNodeTest, Parses) {
  EXPECT_EQ(parse_tasks_per_node("2(x3),1"), std::vector<int>({2, 2, 2, 1}));
  EXPECT_EQ(parse_tasks_per_node("4"), std::vector<int>({4}));
  EXPECT_EQ(parse_tasks_per_node("2(x4)"), std::vector<int>({2, 2, 2, 2}));
  EXPECT_EQ(parse_tasks_per_node("1,3(x2),2"), std::vector<int>({1, 3, 3, 2}));
  EXPECT_EQ(parse_tasks_per_node("2,1"), std::vector<int>({2, 1}));
}

TEST(TasksPerNodeTest, BadCounts) {
  for (const char* bad : {"", "x", "2(x)", "2(x0)", "2(3)", "2(x3", "(x3)", "2,,1", "2,", "-1", "2(x-1)", "1.5"}) {
    SCOPED_TRACE(bad);
    expect_usage_error([&] { parse_tasks_per_node(bad); }, "bad tasks-per-node list");
  }
}

TEST(TopologyAddrTest, SplitsSwitchesAndNode) {
  auto a = parse_topology_addr("top.s1.n2", "switch.switch.node");
  EXPECT_EQ(a.switches, Names({"top", "s1"}));
  EXPECT_EQ(a.node, "n2");
  a = parse_topology_addr("n7", "node");
  EXPECT_TRUE(a.switches.empty());
  EXPECT_EQ(a.node, "n7");
  a = parse_topology_addr("s1.n1.example", "switch.node");  // dotted node name
  EXPECT_EQ(a.switches, Names({"s1"}));
  EXPECT_EQ(a.node, "n1.example");
  EXPECT_EQ(join_path({"top", "s1"}), "top.s1");
  EXPECT_EQ(join_path({}), "");
}

TEST(TopologyAddrTest, BadAddresses) {
  expect_usage_error([] { parse_topology_addr("top.n1", "switch.switch.node"); }, "2 components");
  expect_usage_error([] { parse_topology_addr("top.s1.n1", "switch.node.switch"); }, "must end in \"node\"");
  expect_usage_error([] { parse_topology_addr("top.s1.n1", "switch.rack.node"); }, "\"rack\"");
  expect_usage_error([] { parse_topology_addr("top..n1", "switch.switch.node"); }, "empty component");
}

TEST(NaturalOrderTest, NumbersCompareByValue) {
  EXPECT_TRUE(natural_less("n2", "n10"));
  EXPECT_FALSE(natural_less("n10", "n2"));
  EXPECT_TRUE(natural_less("s1", "s2"));
  EXPECT_TRUE(natural_less("a", "b"));
  EXPECT_TRUE(natural_less("n", "n1"));
  EXPECT_TRUE(natural_less("rack2-n10", "rack10-n1"));
  EXPECT_FALSE(natural_less("n1", "n1"));
  // Equal values: a total order still (n01 vs n1).
  EXPECT_NE(natural_less("n01", "n1"), natural_less("n1", "n01"));
  Names v = {"n10", "n9", "n1", "n100", "m3"};
  std::sort(v.begin(), v.end(), [](const std::string& a, const std::string& b) { return natural_less(a, b); });
  EXPECT_EQ(v, Names({"m3", "n1", "n9", "n10", "n100"}));
}

}  // namespace
}  // namespace amsp::topology
