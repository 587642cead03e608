#include "engine/resume_changes.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace amsp::engine {
namespace {

using nlohmann::json;

// Fingerprints that tell datasets apart, as data_fingerprint's would.
json fingerprint(const std::string& tokens) { return {{"tokenizer", "byte"}, {"train", {{"sample_hash", tokens}}}}; }

// The options a run stores, trimmed to what the data comparison reads.
std::string one_dataset(const std::string& path, const std::string& tokens) {
  return json{{"data", path}, {"data_fingerprint", fingerprint(tokens)}, {"seed", 1}}.dump();
}

// sources: (path, weight, tokens) in --data's order.
std::string mixture(const std::string& text, const std::vector<std::tuple<std::string, double, std::string>>& sources) {
  json list = json::array();
  for (const auto& [path, weight, tokens] : sources)
    list.push_back({{"path", path}, {"weight", weight}, {"fingerprint", fingerprint(tokens)}});
  // As trainer.cpp stores it: the first dataset's fingerprint beside the list.
  return json{{"data", text}, {"data_fingerprint", list[0]["fingerprint"]}, {"mixture", list}, {"seed", 1}}.dump();
}

ResumeChanges compare(const std::string& before, const std::string& now) {
  return compare_for_resume(before, "{}", now, "{}");
}

const std::string kAb = mixture("a.h5:0.7,b.h5:0.3", {{"a.h5", 0.7, "A"}, {"b.h5", 0.3, "B"}});

TEST(ResumeMixture, TheSameMixtureIsNoChange) {
  const ResumeChanges r = compare(kAb, kAb);
  EXPECT_TRUE(r.notes.empty());
  EXPECT_TRUE(r.refusals.empty());
  // Weights spelled otherwise, the same once normalised: no change either.
  EXPECT_TRUE(compare(kAb, mixture("a.h5:7,b.h5:3", {{"a.h5", 0.7, "A"}, {"b.h5", 0.3, "B"}})).notes.empty());
}

// Other weights or another order change which dataset a row draws from, as
// another seed changes the windows: listed, not refused.
TEST(ResumeMixture, OtherWeightsOrOrderAreListed) {
  const std::string note =
      "--data a.h5:0.5,b.h5:0.5 (was a.h5:0.7,b.h5:0.3): the mixture's weights or order changed: which dataset "
      "each row draws from differs from the original run's from here on";
  const ResumeChanges r = compare(kAb, mixture("a.h5:0.5,b.h5:0.5", {{"a.h5", 0.5, "A"}, {"b.h5", 0.5, "B"}}));
  EXPECT_TRUE(r.refusals.empty());
  EXPECT_EQ(r.notes, std::vector<std::string>{note});
  const ResumeChanges swapped = compare(kAb, mixture("b.h5:0.3,a.h5:0.7", {{"b.h5", 0.3, "B"}, {"a.h5", 0.7, "A"}}));
  EXPECT_TRUE(swapped.refusals.empty());
  ASSERT_EQ(swapped.notes.size(), 1u);
  EXPECT_NE(swapped.notes[0].find("weights or order changed"), std::string::npos) << swapped.notes[0];
  // A source moved to another path with the same tokens: the same tokens.
  const ResumeChanges moved = compare(kAb, mixture("a.h5:0.7,new/b.h5:0.3", {{"a.h5", 0.7, "A"}, {"new/b.h5", 0.3, "B"}}));
  EXPECT_TRUE(moved.refusals.empty());
  EXPECT_EQ(moved.notes, std::vector<std::string>{"--data a.h5:0.7,new/b.h5:0.3 (was a.h5:0.7,b.h5:0.3): the same "
                                                  "tokens (sizes and samples agree)"});
}

// A source with other tokens, one added, one left out: another dataset, which
// a resume refuses without --force-resume (as for a single dataset).
TEST(ResumeMixture, OtherDatasetsAreRefused) {
  EXPECT_EQ(compare(kAb, mixture("a.h5:0.7,c.h5:0.3", {{"a.h5", 0.7, "A"}, {"c.h5", 0.3, "C"}})).refusals,
            (std::vector<std::string>{
                "--data c.h5 holds other tokens than the datasets the checkpoint's run trained on (a.h5, b.h5)",
                "--data a.h5:0.7,c.h5:0.3 leaves out b.h5, which the checkpoint's run trained on (weight 0.3)"}));
  EXPECT_EQ(compare(one_dataset("a.h5", "A"), kAb).refusals,
            std::vector<std::string>{"--data b.h5 holds other tokens than the datasets the checkpoint's run trained "
                                     "on (a.h5)"});
  EXPECT_EQ(compare(kAb, one_dataset("a.h5", "A")).refusals,
            std::vector<std::string>{"--data a.h5 leaves out b.h5, which the checkpoint's run trained on (weight 0.3)"});
  // One dataset on both sides keeps its own messages.
  const ResumeChanges single = compare(one_dataset("a.h5", "A"), one_dataset("c.h5", "C"));
  ASSERT_EQ(single.refusals.size(), 1u);
  EXPECT_EQ(single.refusals[0].rfind("--data c.h5 holds other tokens than the checkpoint's run trained on (a.h5", 0), 0u)
      << single.refusals[0];
}

// Tokens per source carry over by content, whatever the order or the path; a
// source new to the run (a forced resume) starts from 0.
TEST(ResumeMixture, SourceTokensCarryOverByContent) {
  EXPECT_EQ(carried_source_tokens(kAb, {700, 300}, 1000, kAb), (std::vector<int64_t>{700, 300}));
  EXPECT_EQ(carried_source_tokens(kAb, {700, 300}, 1000,
                                  mixture("x", {{"b2.h5", 0.5, "B"}, {"c.h5", 0.2, "C"}, {"a.h5", 0.3, "A"}})),
            (std::vector<int64_t>{300, 0, 700}));
  // From one dataset: its count is the checkpoint's tokens.
  EXPECT_EQ(carried_source_tokens(one_dataset("a.h5", "A"), {}, 1000, kAb), (std::vector<int64_t>{1000, 0}));
  EXPECT_EQ(carried_source_tokens(kAb, {700, 300}, 1000, one_dataset("b.h5", "B")), std::vector<int64_t>{300});
}

}  // namespace
}  // namespace amsp::engine
