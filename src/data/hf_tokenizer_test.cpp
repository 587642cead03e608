// tokenizer.json: the split patterns on the cases that backtracking decides,
// BPE merges, the pipeline's order, refusals. That the ids equal Hugging Face
// tokenizers' on real text is validation/tokenizer_compare.py's job.
#include "data/hf_tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/dataset.h"
#include "data/hf_pretokenize.h"
#include "data/unicode.h"
#include "data/test_support.h"

namespace amsp::data {
namespace {

using nlohmann::json;
using testing::TempDir;

std::vector<std::string> split(SplitPattern p, const std::string& s) {
  std::vector<std::string_view> parts;
  split_by_pattern(p, s, &parts);
  return {parts.begin(), parts.end()};
}

using Pieces = std::vector<std::string>;

TEST(HfSplitPattern, Gpt2) {
  EXPECT_EQ(split(SplitPattern::kGpt2, "Hello world's  end\n\n"),
            (Pieces{"Hello", " world", "'s", " ", " end", "\n\n"}));
  // Case-sensitive contractions; numbers in runs; a lone space before text
  // goes with the text.
  EXPECT_EQ(split(SplitPattern::kGpt2, "IT'S 12345 ok"), (Pieces{"IT", "'", "S", " 12345", " ok"}));
  // Only U+0020 joins the text after it; other spaces stand alone.
  EXPECT_EQ(split(SplitPattern::kGpt2, "a\u00a0b \u3000c"), (Pieces{"a", "\u00a0", "b", " ", "\u3000", "c"}));
}

TEST(HfSplitPattern, Llama3AndQwen2) {
  // (?i:'s) also takes the long s, which case-folds to s. Pieces checked
  // against tokenizers' own Split.
  const std::string s = "  \n\n x123456's\tIT'S x'ſ";
  EXPECT_EQ(split(SplitPattern::kLlama3, s),
            (Pieces{"  \n\n", " x", "123", "456", "'s", "\tIT", "'S", " x", "'\u017f"}));
  EXPECT_EQ(split(SplitPattern::kQwen2, "x123"), (Pieces{"x", "1", "2", "3"}));
  // Punctuation takes the line ends after it.
  EXPECT_EQ(split(SplitPattern::kLlama3, "ok.\r\n\nnext"), (Pieces{"ok", ".\r\n\n", "next"}));
}

TEST(Nfc, ComposesReordersAndKeepsExclusionsApart) {
  EXPECT_EQ(nfc("plain ASCII, 日本語"), "plain ASCII, 日本語");
  EXPECT_EQ(nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(nfc("\u212b"), "\u00c5");              // a singleton: the Angstrom sign
  EXPECT_EQ(nfc("a\u0301\u0316"), "\u00e1\u0316");  // marks reordered by class, then composed
  EXPECT_EQ(nfc("\u1e0b\u0323"), "\u1e0d\u0307");   // dot above decomposed, dot below composed first
  EXPECT_EQ(nfc("\u1100\u1161\u11a8"), "\uac01");   // Hangul jamo by arithmetic
  EXPECT_EQ(nfc("\u0958"), "\u0915\u093c");         // a composition exclusion stays apart
  EXPECT_EQ(nfc("\uf900"), "\u8c48");               // a CJK compatibility ideograph
}

TEST(HfSplitPattern, KnowsOnlyItsPatterns) {
  EXPECT_FALSE(known_split_pattern("\\s+").has_value());
  EXPECT_FALSE(known_split_pattern("").has_value());
}

// A byte-level tokenizer.json: the 256 byte characters, then what `merges` adds.
json byte_level_json(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_chars()[b]] = b;
  json m = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = static_cast<int>(vocab.size());
    m.push_back(a + " " + b);
  }
  const int bos = static_cast<int>(vocab.size());
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", {{{"id", bos}, {"content", "<s>"}, {"special", true}, {"normalized", false}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {bos}}, {"tokens", {"<s>"}}}}}}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

TEST(HfTokenizer, ByteLevelMergesLowestRankFirstAndRoundTrips) {
  const std::string G = byte_level_chars()[' '];  // "Ġ"
  // "he" outranks "th": "the" becomes t + he, then "the" is out of reach.
  auto tok = make_hf_tokenizer(byte_level_json({{"h", "e"}, {"t", "h"}, {"th", "e"}, {G, "t"}}).dump(), "test");
  EXPECT_EQ(tok->kind(), "huggingface");
  EXPECT_EQ(tok->vocab_size(), 256 + 4 + 1);
  const auto ids = tok->encode("the");
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0], 't');
  EXPECT_EQ(ids[1], 256);  // "he"
  EXPECT_EQ(tok->bos_id(), 260);
  EXPECT_EQ(tok->eos_id(), -1);
  std::vector<int32_t> doc;
  tok->encode_document("x", &doc);
  EXPECT_EQ(doc, (std::vector<int32_t>{260, 'x'}));

  const std::string text = "Grüße, 世界! \t\n<s>🦙 the  end\r\n";
  const auto all = tok->encode(text);
  EXPECT_EQ(std::count(all.begin(), all.end(), 260), 1);  // <s> in the text is the special token
  EXPECT_EQ(tok->decode(all), "Grüße, 世界! \t\n🦙 the  end\r\n");  // special tokens are skipped
}

TEST(HfTokenizer, AddedTokensMatchLeftmostLongest) {
  json j = byte_level_json({});
  const int n = static_cast<int>(j["model"]["vocab"].size()) + 1;  // after <s>
  j["added_tokens"].push_back({{"id", n}, {"content", "<|a|>"}, {"special", true}, {"normalized", false}});
  j["added_tokens"].push_back({{"id", n + 1}, {"content", "<|a|><|b|>"}, {"special", true}, {"normalized", false}});
  j["added_tokens"].push_back({{"id", n + 2}, {"content", "|><"}, {"special", true}, {"normalized", false}});
  auto tok = make_hf_tokenizer(j.dump(), "test");
  // The longest at the leftmost position: not <|a|> then "<|b|>", and not the "|><" inside.
  EXPECT_EQ(tok->encode("x<|a|><|b|>y"), (std::vector<int32_t>{'x', n + 1, 'y'}));
  EXPECT_EQ(tok->encode("<|a|><|c"), (std::vector<int32_t>{n, '<', '|', 'c'}));
}

TEST(HfTokenizer, ByteFallbackAndNormalizerInOrder) {
  // A LLaMA-2 style file: "▁" prepended and spaces replaced, no pre-tokenizer,
  // unknown characters as <0xXX>.
  json vocab = {{"<unk>", 0}, {"\u2581", 1}, {"a", 2}, {"b", 3}, {"\u2581a", 4}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 5 + b;
  }
  json j = byte_level_json({});
  j["added_tokens"] = json::array();
  j["post_processor"] = nullptr;
  j["pre_tokenizer"] = nullptr;
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Prepend"}, {"prepend", "\u2581"}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"\u2581 a"}}, {"byte_fallback", true},
                {"unk_token", "<unk>"}};
  auto tok = make_hf_tokenizer(j.dump(), "test");
  // "a bé": ▁a ▁ b <0xC3> <0xA9>
  EXPECT_EQ(tok->encode("a bé"), (std::vector<int32_t>{4, 1, 3, 5 + 0xC3, 5 + 0xA9}));
  EXPECT_EQ(tok->decode(tok->encode("a bé")), "a bé");
}

std::string refusal(const json& j) {
  try {
    make_hf_tokenizer(j.dump(), "--tokenizer t.json");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(HfTokenizer, RefusesWhatItDoesNotImplementByName) {
  json j = byte_level_json({});
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_NE(refusal(j).find("--tokenizer t.json: normalizer NFKC is not implemented"), std::string::npos) << refusal(j);
  j = byte_level_json({});
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(refusal(j).find("model WordPiece is not implemented"), std::string::npos) << refusal(j);
  j = byte_level_json({});
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(refusal(j).find("pre_tokenizer Split with the pattern \"\\\\w+\" is not implemented"), std::string::npos)
      << refusal(j);
  j = byte_level_json({});
  j["added_tokens"][0]["lstrip"] = true;
  EXPECT_NE(refusal(j).find("added_tokens \"<s>\" with lstrip is not implemented"), std::string::npos) << refusal(j);
  j = byte_level_json({{"x", "y"}});
  j["model"]["merges"] = {"x q"};
  EXPECT_NE(refusal(j).find("merge #0 (\"x\" \"q\") names a token not in the vocabulary"), std::string::npos)
      << refusal(j);
  EXPECT_THROW(make_hf_tokenizer("{not json", "t"), UsageError);
}

TEST(HfTokenizer, DatasetStoresTheFileAndDecodesWithoutIt) {
  TempDir dir;
  const std::string json_path = dir.file("tokenizer.json"), text = dir.file("a.txt"), out = dir.file("d.h5");
  testing::write_text(json_path, byte_level_json({{"h", "e"}}).dump());
  testing::write_text(text, "hello there\n");
  PrepareOptions o;
  o.inputs = {text};
  o.output = out;
  o.tokenizer = json_path;
  o.valid_fraction = 0;
  const PrepareReport r = prepare_dataset(o);
  EXPECT_EQ(r.vocab_size, 258);
  std::filesystem::remove(json_path);
  auto tok = dataset_tokenizer(out);
  EXPECT_EQ(tok->kind(), "huggingface");
  const TokenDataset d(out);
  EXPECT_EQ(d.tokenizer(), "huggingface");
  EXPECT_EQ(d.tokens(Split::kTrain).front(), 257);  // <s>
  EXPECT_EQ(tok->decode(d.tokens(Split::kTrain)), "hello there\n");
}

}  // namespace
}  // namespace amsp::data
