// The BPE model of Hugging Face tokenizers: a word's characters become
// vocabulary ids (or byte-fallback ids, or the unknown id), then the merges are
// applied lowest rank first, leftmost first among equals, exactly as
// tokenizers' Word::merge_all does. Words already seen are answered from a
// per-thread cache.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace amsp::data {

// A hash map from strings that looks up string_views without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  bool byte_fallback = false;  // unknown characters as <0xXX> byte tokens
  bool ignore_merges = false;  // a word in the vocabulary is one token, merges or not
  bool fuse_unk = false;       // consecutive unknown characters as one unknown token
  int32_t unk_id = -1;         // -1: unknown characters are dropped
};

class BpeModel {
 public:
  // Throws UsageError (naming `what`) for a merge of, or into, a string not in
  // the vocabulary.
  BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           const std::string& what);

  // Appends the ids of one pre-tokenized word.
  void encode(std::string_view word, std::vector<int32_t>* out) const;

  const Vocab& vocab() const { return vocab_; }

 private:
  struct Merge {
    uint32_t rank;
    int32_t id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void initial_symbols(std::string_view word, std::vector<int32_t>* ids) const;
  void merge_all(std::vector<int32_t>* ids) const;

  Vocab vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t byte_ids_[256];  // <0xXX> ids (byte fallback), -1 where absent
  BpeOptions options_;
  uint64_t cache_key_;     // this model's key in the per-thread cache
};

}  // namespace amsp::data
