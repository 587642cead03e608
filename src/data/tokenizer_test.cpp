#include "data/tokenizer.h"

#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include "core/error.h"
#include "data/test_support.h"

namespace amsp::data {
namespace {

using testing::TempDir;

TEST(TokenizerTest, ByteRoundTripsEveryByte) {
  auto tok = make_tokenizer("byte");
  EXPECT_EQ(tok->kind(), "byte");
  EXPECT_EQ(tok->vocab_size(), 256);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(tok->eos_id(), -1);
  EXPECT_TRUE(tok->serialized_model().empty());

  std::string text;
  for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  text += "Grüße, 世界\n";
  const auto ids = tok->encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i], static_cast<unsigned char>(text[i]));
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_TRUE(tok->encode("").empty());
}

TEST(TokenizerTest, ByteDecodesOutOfRangeIdsAsReplacementCharacter) {
  auto tok = make_tokenizer("byte");
  EXPECT_EQ(tok->decode({'a', 300, 'b', -1}), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
}

TEST(TokenizerTest, MissingModelIsUsageError) {
  TempDir dir;
  const std::string path = dir.file("nope.model");
  try {
    make_tokenizer(path);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--tokenizer"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(TokenizerTest, GarbageModelIsUsageError) {
  TempDir dir;
  const std::string path = dir.file("garbage.model");
  testing::write_text(path, "this is not a protobuf at all\n");
  try {
    make_tokenizer(path);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--tokenizer " + path), std::string::npos) << msg;
    EXPECT_NE(msg.find("SentencePiece"), std::string::npos) << msg;
  }
  EXPECT_THROW(make_tokenizer(""), UsageError);
  EXPECT_THROW(make_sentencepiece_tokenizer("garbage", "--data x.h5"), UsageError);
}

// Trains a tiny BPE model with exact round trips (identity normalization, no
// whitespace rewriting) and returns its path.
std::string train_tiny_model(const TempDir& dir) {
  const std::string corpus = dir.file("sp_corpus.txt");
  testing::write_text(corpus, testing::sample_text(3000, 7));
  const std::string prefix = dir.file("sp");
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + corpus + " --model_prefix=" + prefix +
      " --vocab_size=300 --model_type=bpe --character_coverage=1.0"
      " --normalization_rule_name=identity --add_dummy_prefix=false --remove_extra_whitespaces=false"
      " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 --num_threads=1 --minloglevel=2");
  EXPECT_TRUE(status.ok()) << status.ToString();
  return prefix + ".model";
}

TEST(TokenizerTest, SentencePieceRoundTrip) {
  TempDir dir;
  const std::string model = train_tiny_model(dir);
  auto tok = make_tokenizer(model);
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 300);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);

  const std::string text = "The cat reads the letter and kaloter today. A quiet river explains seven apples!";
  const auto ids = tok->encode(text);
  EXPECT_LT(ids.size(), text.size());  // merges happened
  for (int32_t id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 300);
  }
  EXPECT_EQ(tok->decode(ids), text);

  // The serialized proto rebuilds the same tokenizer.
  const std::string proto = tok->serialized_model();
  ASSERT_FALSE(proto.empty());
  auto again = make_sentencepiece_tokenizer(proto, "test");
  EXPECT_EQ(again->encode(text), ids);
  EXPECT_EQ(again->vocab_size(), 300);

  // Ids outside the vocabulary decode (as unknown) instead of failing.
  EXPECT_NO_THROW(tok->decode({5, 100000, -3}));
}

}  // namespace
}  // namespace amsp::data
