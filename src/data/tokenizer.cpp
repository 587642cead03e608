#include "data/tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "core/error.h"
#include "data/hf_tokenizer.h"

namespace amsp::data {
namespace fs = std::filesystem;

namespace {

// id = byte value. No special tokens: documents are separated by '\n'.
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  void encode_document(const std::string& text, std::vector<int32_t>* out) const override {
    out->insert(out->end(), reinterpret_cast<const unsigned char*>(text.data()),
                reinterpret_cast<const unsigned char*>(text.data()) + text.size());
    if (text.empty() || text.back() != '\n') out->push_back('\n');
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    text.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < 256) {
        text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
      } else {
        text += "\xEF\xBF\xBD";  // U+FFFD: an id a byte model cannot mean
      }
    }
    return text;
  }
  int64_t vocab_size() const override { return 256; }
  int32_t eos_id() const override { return -1; }
  int32_t bos_id() const override { return -1; }
  std::string kind() const override { return "byte"; }
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // what names the source in error messages ("--tokenizer PATH", "dataset X").
  SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp, std::string what)
      : sp_(std::move(sp)), what_(std::move(what)) {}

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int> ids;
    const auto status = sp_->Encode(text, &ids);
    if (!status.ok()) fail(what_, ": SentencePiece cannot encode the text: ", status.ToString());
    return std::vector<int32_t>(ids.begin(), ids.end());
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    // An id outside the vocabulary (a model with a padded vocab can emit one)
    // decodes as the unknown piece rather than failing.
    const int n = sp_->GetPieceSize();
    std::vector<int> in;
    in.reserve(ids.size());
    for (int32_t id : ids) in.push_back(id >= 0 && id < n ? id : sp_->unk_id());
    std::string text;
    const auto status = sp_->Decode(in, &text);
    if (!status.ok()) fail(what_, ": SentencePiece cannot decode the ids: ", status.ToString());
    return text;
  }
  int64_t vocab_size() const override { return sp_->GetPieceSize(); }
  int32_t eos_id() const override { return sp_->eos_id(); }
  int32_t bos_id() const override { return sp_->bos_id(); }
  std::string kind() const override { return "sentencepiece"; }
  std::string serialized_model() const override { return sp_->serialized_model_proto(); }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string what_;
};

// The file's first byte that is not white space, or 0.
char first_byte(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char c = 0;
  while (in.get(c))
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return c;
  return 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) fail_usage("--tokenizer ", path, ": cannot read the file");
  return text;
}

constexpr const char* kExpected = "expected \"byte\", a SentencePiece .model or a Hugging Face tokenizer.json";

}  // namespace

void Tokenizer::encode_document(const std::string& text, std::vector<int32_t>* out) const {
  if (bos_id() >= 0) out->push_back(bos_id());
  const std::vector<int32_t> ids = encode(text);
  out->insert(out->end(), ids.begin(), ids.end());
  if (eos_id() >= 0) out->push_back(eos_id());
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  if (spec.empty()) fail_usage("--tokenizer: ", kExpected);
  std::error_code ec;
  if (!fs::exists(spec, ec)) fail_usage("--tokenizer ", spec, ": no such file; ", kExpected);
  if (!fs::is_regular_file(spec, ec)) fail_usage("--tokenizer ", spec, ": not a regular file; ", kExpected);
  if (first_byte(spec) == '{') return make_hf_tokenizer(read_file(spec), "--tokenizer " + spec);
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->Load(spec);
  if (!status.ok())
    fail_usage("--tokenizer ", spec, ": neither a SentencePiece model nor JSON; ", kExpected);
  if (sp->GetPieceSize() <= 0) fail_usage("--tokenizer ", spec, ": the SentencePiece model has no pieces");
  return std::make_unique<SentencePieceTokenizer>(std::move(sp), "--tokenizer " + spec);
}

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& serialized_model,
                                                        const std::string& what) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(serialized_model);
  if (!status.ok()) fail_usage(what, ": the stored SentencePiece model does not load (damaged file?)");
  if (sp->GetPieceSize() <= 0) fail_usage(what, ": the stored SentencePiece model has no pieces");
  return std::make_unique<SentencePieceTokenizer>(std::move(sp), what);
}

}  // namespace amsp::data
