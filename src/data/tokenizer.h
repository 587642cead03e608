// Tokenizers turn text into token ids. Three kinds: the built-in byte-level one
// (id = byte value, vocabulary 256: needs nothing and covers any text),
// SentencePiece models (a LLaMA tokenizer.model works as it is) and Hugging Face
// tokenizer.json files with a BPE model (data/hf_tokenizer.h).
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
  // Appends the ids of one document as a dataset holds it: the text's ids
  // between the BOS and EOS that the tokenizer puts around a document (byte: a
  // newline after a document that does not end in one).
  virtual void encode_document(const std::string& text, std::vector<int32_t>* out) const;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // Id to put between documents, or -1 if the tokenizer has none (byte).
  virtual int32_t eos_id() const = 0;
  virtual int32_t bos_id() const = 0;
  // "byte", "sentencepiece" or "huggingface".
  virtual std::string kind() const = 0;
  // The model stored in the dataset so that the dataset decodes without the
  // original file: the SentencePiece model proto, the tokenizer.json text.
  virtual std::string serialized_model() const { return {}; }
};

// spec is "byte" or the path of a SentencePiece .model or Hugging Face
// tokenizer.json file (told apart by content: JSON begins with '{'). Throws
// UsageError naming the option (--tokenizer) for a missing or unreadable model.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

// A SentencePiece tokenizer from a serialized model proto (as stored in a
// dataset's /tokenizer/model). what names the source in error messages.
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& serialized_model,
                                                        const std::string& what);

}  // namespace amsp::data
