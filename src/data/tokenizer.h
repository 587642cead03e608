// Tokenizers turn text into token ids. Two kinds: the built-in byte-level one
// (id = byte value, vocabulary 256: needs nothing and covers any text) and
// SentencePiece models (a LLaMA tokenizer.model works as it is).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace amsp::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // Id to put between documents, or -1 if the tokenizer has none (byte).
  virtual int32_t eos_id() const = 0;
  virtual int32_t bos_id() const = 0;
  // "byte" or "sentencepiece".
  virtual std::string kind() const = 0;
  // For sentencepiece: the serialized model proto, stored in the dataset so
  // that the dataset can be decoded without the original file.
  virtual std::string serialized_model() const { return {}; }
};

// spec is "byte" or the path of a SentencePiece .model file. Throws UsageError
// naming the option (--tokenizer) for a missing or unreadable model.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

// A SentencePiece tokenizer from a serialized model proto (as stored in a
// dataset's /tokenizer/model). what names the source in error messages.
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& serialized_model,
                                                        const std::string& what);

}  // namespace amsp::data
