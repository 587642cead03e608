// A tokenizer.json read into plain data: what each stage of the pipeline is
// (normalizers, pre-tokenizers, the BPE model, added tokens, the
// post-processor's tokens, decoders). Everything the file holds that amsp does
// not implement is refused here, in one line naming it. Internal to data/.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "data/hf_bpe.h"
#include "data/hf_pretokenize.h"

namespace amsp::data::hf {

struct Prepend {
  std::string text;
};
struct Replace {
  std::string from, to;
};
struct Nfc {};
using Normalizer = std::variant<Prepend, Replace, Nfc>;

struct ByteLevel {
  bool add_prefix_space = false;
  bool use_regex = true;
};
struct Split {
  SplitPattern pattern;
};
struct Metaspace {
  std::string replacement;
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;
};
using PreTokenizer = std::variant<ByteLevel, Split, Metaspace>;

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;     // skipped when decoding
  bool normalized;  // matched in the normalized text, its content normalized too
};

// Decoders turn token strings back into text, each as a step on the list of
// strings (tokenizers' decode_chain).
struct Decoder {
  enum class Kind { kByteLevel, kByteFallback, kFuse, kReplace, kStrip, kMetaspace } kind;
  std::string a, b;  // Replace: from, to; Strip and Metaspace: the character
  size_t start = 0, stop = 0;
  bool prepended = false;  // Metaspace: its prepend_scheme is not "never"
};

struct Config {
  std::string what;                          // names the file in error messages
  Vocab vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  BpeOptions bpe;
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;  // ByteLevel, if there, is the last
  std::vector<AddedToken> added;
  std::vector<int32_t> before, after;        // the post-processor's ids around a text
  std::vector<Decoder> decoders;
  int64_t vocab_size = 0;                    // largest id + 1, added tokens included
};

// Throws UsageError naming `what` for a file that is not a tokenizer.json, is
// inconsistent, or uses what is not implemented.
Config parse_config(const std::string& text, const std::string& what);

}  // namespace amsp::data::hf
