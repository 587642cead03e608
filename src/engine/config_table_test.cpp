#include "engine/config_table.h"

#include <gtest/gtest.h>

#include <sstream>

namespace amsp::engine {
namespace {

// Every line of the table as wide as its rules, the column bars in the rules' places.
TEST(ConfigTable, ColumnsFitTheWidestKeyAndValue) {
  const std::string long_value(90, 'v');
  const std::string table = format_table({{"batch x seq x accum x ranks", "8 x 2048 x 4 x 256 = 16777216 tokens/step"},
                                          {"data", long_value},
                                          {"seed", "1"}});
  std::istringstream in(table);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 5u);
  const std::string& rule = lines.front();
  EXPECT_EQ(rule, "+" + std::string(29, '-') + "+" + std::string(92, '-') + "+");
  EXPECT_EQ(lines.back(), rule);
  for (const std::string& line : lines) {
    EXPECT_EQ(line.size(), rule.size()) << line;
    for (size_t i = 0; i < rule.size(); ++i)
      if (rule[i] == '+') EXPECT_TRUE(line[i] == '+' || line[i] == '|') << line;
  }
  EXPECT_EQ(lines[3], "| seed" + std::string(24, ' ') + "| 1" + std::string(90, ' ') + "|");
  EXPECT_EQ(format_table({{"a", "b"}}), "+---+---+\n| a | b |\n+---+---+\n");
}

}  // namespace
}  // namespace amsp::engine
