#include "data/hf_tokenizer.h"

#include <array>
#include <unordered_map>

#include "core/error.h"
#include "data/hf_bpe.h"
#include "data/hf_config.h"
#include "data/hf_pretokenize.h"
#include "data/unicode.h"

namespace amsp::data {
namespace {

using namespace hf;  // the configuration's types

// Added tokens found leftmost-longest, as tokenizers' Aho-Corasick automaton
// finds them: at each position the longest token that starts there, walked in a
// byte trie (LLaMA-3's 256 special tokens all begin with "<|").
class AddedTokenMatcher {
 public:
  // A token's content as a path of bytes in a trie; the first of equal contents wins.
  void add(const std::string& content, int32_t id) {
    if (content.empty()) return;
    int node = 0;
    for (unsigned char c : content) {
      int next = child(node, c);
      if (next < 0) {
        next = static_cast<int>(nodes_.size());
        nodes_[node].children.push_back({c, next});
        nodes_.emplace_back();
      }
      node = next;
    }
    if (nodes_[node].id < 0) nodes_[node].id = id;
  }

  // Calls f(piece, id, offset) for consecutive pieces of s: an added token
  // (id >= 0) or the non-empty text between them (id = -1).
  template <typename F>
  void split(std::string_view s, F&& f) const {
    size_t start = 0;
    for (size_t i = 0; i < s.size();) {
      const auto [len, id] = longest_at(s, i);
      if (len == 0) {
        ++i;
        continue;
      }
      if (i > start) f(s.substr(start, i - start), -1, start);
      f(s.substr(i, len), id, i);
      i += len;
      start = i;
    }
    if (start < s.size()) f(s.substr(start), -1, start);
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> children;
    int32_t id = -1;  // a token ends here
  };
  int child(int node, unsigned char c) const {
    for (const auto& [byte, next] : nodes_[node].children)
      if (byte == c) return next;
    return -1;
  }
  // The longest token that starts at s[i]: (its length, its id), or (0, -1).
  std::pair<size_t, int32_t> longest_at(std::string_view s, size_t i) const {
    std::pair<size_t, int32_t> best{0, -1};
    int node = 0;
    for (size_t k = i; k < s.size() && (node = child(node, static_cast<unsigned char>(s[k]))) >= 0; ++k)
      if (nodes_[node].id >= 0) best = {k - i + 1, nodes_[node].id};
    return best;
  }

  std::vector<Node> nodes_ = std::vector<Node>(1);  // [0]: the root
};

// A byte-level string back to its bytes: each character of GPT-2's alphabet is
// one byte; anything else stays as it is.
std::string byte_level_decode(const std::string& s) {
  static const std::unordered_map<std::string, char> inverse = [] {
    std::unordered_map<std::string, char> m;
    for (int b = 0; b < 256; ++b) m[byte_level_chars()[b]] = static_cast<char>(b);
    return m;
  }();
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    decode_utf8(s.data() + i, s.size() - i, &len);
    const auto it = inverse.find(s.substr(i, len));
    if (it != inverse.end()) out += it->second;
    else out.append(s, i, len);
    i += len;
  }
  return out;
}

// A "<0xXX>" token's byte, or -1.
int fallback_byte(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (char c : t.substr(3, 2)) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    if (decode_utf8(s.data() + i, s.size() - i, &len) == 0xFFFD && s.compare(i, 3, "\xEF\xBF\xBD") != 0) return false;
    i += len;
  }
  return true;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  size_t start = 0;
  for (size_t at; (at = s.find(from, start)) != std::string::npos; start = at + from.size())
    out.append(s, start, at - start).append(to);
  return out.append(s, start, std::string::npos);
}

// One decoder step on the list of token strings, as tokenizers' decode_chain.
std::vector<std::string> decode_step(const Decoder& d, std::vector<std::string> tokens) {
  std::vector<std::string> out;
  switch (d.kind) {
    case Decoder::Kind::kByteLevel: {
      std::string all;
      for (const auto& t : tokens) all += t;
      return {byte_level_decode(all)};
    }
    case Decoder::Kind::kFuse: {
      std::string all;
      for (const auto& t : tokens) all += t;
      return {all};
    }
    case Decoder::Kind::kByteFallback: {
      std::string bytes;
      auto flush = [&] {
        if (bytes.empty()) return;
        if (valid_utf8(bytes)) out.push_back(bytes);
        else for (size_t i = 0; i < bytes.size(); ++i) out.push_back("\xEF\xBF\xBD");
        bytes.clear();
      };
      for (auto& t : tokens) {
        const int b = fallback_byte(t);
        if (b >= 0) { bytes.push_back(static_cast<char>(b)); continue; }
        flush();
        out.push_back(std::move(t));
      }
      flush();
      return out;
    }
    case Decoder::Kind::kReplace:
      for (auto& t : tokens) t = replace_all(t, d.a, d.b);
      return tokens;
    case Decoder::Kind::kStrip:
      for (auto& t : tokens) {
        size_t s = 0, e = t.size();
        for (size_t k = 0; k < d.start && t.compare(s, d.a.size(), d.a) == 0; ++k) s += d.a.size();
        for (size_t k = 0; k < d.stop && e >= s + d.a.size() && t.compare(e - d.a.size(), d.a.size(), d.a) == 0; ++k)
          e -= d.a.size();
        t = t.substr(s, e - s);
      }
      return tokens;
    case Decoder::Kind::kMetaspace:
      for (size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = replace_all(tokens[i], d.a, i == 0 && d.prepended ? "" : " ");
      return tokens;
  }
  return tokens;
}

// ---------------------------------------------------------------- the tokenizer

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const std::string& text, hf::Config c);

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    encode_text(text, &ids);
    return ids;
  }
  void encode_document(const std::string& text, std::vector<int32_t>* out) const override {
    out->insert(out->end(), before_.begin(), before_.end());
    encode_text(text, out);
    out->insert(out->end(), after_.begin(), after_.end());
  }
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return before_.size() == 1 ? before_[0] : -1; }
  int32_t eos_id() const override { return after_.size() == 1 ? after_[0] : -1; }
  std::string kind() const override { return "huggingface"; }
  std::string serialized_model() const override { return json_; }

 private:
  void encode_text(std::string_view text, std::vector<int32_t>* out) const;
  void pre_tokenize(size_t step, std::string_view piece, bool at_start, std::vector<int32_t>* out) const;
  void model_encode(std::string_view word, std::vector<int32_t>* out) const;
  std::string normalize(std::string_view s) const;

  std::string json_;
  std::vector<Normalizer> normalizers_;
  std::vector<PreTokenizer> pre_tokenizers_;
  bool byte_level_ = false;
  AddedTokenMatcher raw_added_, normalized_added_;
  std::vector<int32_t> before_, after_;
  std::vector<Decoder> decoders_;
  std::vector<std::string> pieces_;  // id -> its string, for decoding
  std::vector<char> special_;        // id -> a special added token (skipped when decoding)
  int64_t vocab_size_ = 0;
  BpeModel model_;
};


HfTokenizer::HfTokenizer(const std::string& text, hf::Config c)
    : json_(text),
      normalizers_(std::move(c.normalizers)),
      pre_tokenizers_(std::move(c.pre_tokenizers)),
      byte_level_(!pre_tokenizers_.empty() && std::holds_alternative<ByteLevel>(pre_tokenizers_.back())),
      before_(std::move(c.before)),
      after_(std::move(c.after)),
      decoders_(std::move(c.decoders)),
      pieces_(c.vocab_size),
      special_(c.vocab_size, 0),
      vocab_size_(c.vocab_size),
      model_(std::move(c.vocab), c.merges, c.bpe, c.what) {
  for (const auto& [piece, id] : model_.vocab()) pieces_[id] = piece;
  for (const AddedToken& t : c.added) {
    pieces_[t.id] = t.content;
    special_[t.id] = t.special;
    if (t.normalized) normalized_added_.add(normalize(t.content), t.id);
    else raw_added_.add(t.content, t.id);
  }
}

std::string HfTokenizer::normalize(std::string_view s) const {
  std::string out(s);
  for (const Normalizer& n : normalizers_) {
    if (const auto* p = std::get_if<Prepend>(&n)) {
      if (!out.empty()) out.insert(0, p->text);
    } else if (std::holds_alternative<Nfc>(n)) {
      out = nfc(out);
    } else {
      const auto& r = std::get<Replace>(n);
      std::string next;
      size_t from = 0;
      for (size_t at; (at = out.find(r.from, from)) != std::string::npos; from = at + r.from.size())
        next.append(out, from, at - from).append(r.to);
      next.append(out, from, std::string::npos);
      out.swap(next);
    }
  }
  return out;
}

// tokenizers' AddedVocabulary::extract_and_normalize, then the pre-tokenizer
// and the model on each piece that is not an added token.
void HfTokenizer::encode_text(std::string_view text, std::vector<int32_t>* out) const {
  raw_added_.split(text, [&](std::string_view seg, int32_t id, size_t offset) {
    if (id >= 0) return out->push_back(id);
    const std::string norm = normalize(seg);
    normalized_added_.split(norm, [&](std::string_view piece, int32_t id2, size_t offset2) {
      if (id2 >= 0) return out->push_back(id2);
      pre_tokenize(0, piece, offset == 0 && offset2 == 0, out);
    });
  });
}

void HfTokenizer::pre_tokenize(size_t step, std::string_view piece, bool at_start, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (step == pre_tokenizers_.size()) return model_encode(piece, out);
  thread_local std::vector<std::string_view> parts;
  const size_t first = parts.size();  // parts is shared by the recursion: a stack
  std::string owned;
  const PreTokenizer& p = pre_tokenizers_[step];
  if (const auto* b = std::get_if<ByteLevel>(&p)) {
    if (b->add_prefix_space && piece[0] != ' ') piece = owned = cat(" ", piece);
    if (b->use_regex) split_by_pattern(SplitPattern::kGpt2, piece, &parts);
    else parts.push_back(piece);
  } else if (const auto* s = std::get_if<Split>(&p)) {
    split_by_pattern(s->pattern, piece, &parts);
  } else {
    const auto& m = std::get<Metaspace>(p);
    for (char c : piece) c == ' ' ? owned += m.replacement : owned += c;
    const bool prepend = m.prepend == Metaspace::Prepend::kAlways ||
                         (m.prepend == Metaspace::Prepend::kFirst && at_start);
    if (prepend && owned.compare(0, m.replacement.size(), m.replacement) != 0) owned.insert(0, m.replacement);
    piece = owned;
    if (!m.split) {
      parts.push_back(piece);
    } else {  // MergedWithNext: each replacement begins a piece
      size_t start = 0;
      for (size_t at = piece.find(m.replacement, 1); at != std::string_view::npos;
           at = piece.find(m.replacement, at + m.replacement.size())) {
        parts.push_back(piece.substr(start, at - start));
        start = at;
      }
      parts.push_back(piece.substr(start));
    }
  }
  const size_t last = parts.size();
  for (size_t i = first; i < last; ++i) pre_tokenize(step + 1, parts[i], at_start && i == first, out);
  parts.resize(first);
}

void HfTokenizer::model_encode(std::string_view word, std::vector<int32_t>* out) const {
  if (!byte_level_) return model_.encode(word, out);
  thread_local std::string mapped;
  mapped.clear();
  for (unsigned char b : word) mapped += byte_level_chars()[b];
  model_.encode(mapped, out);
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) tokens.push_back("\xEF\xBF\xBD");  // an id the file cannot mean
    else if (!special_[id]) tokens.push_back(pieces_[id]);
  }
  for (const Decoder& d : decoders_) tokens = decode_step(d, std::move(tokens));
  std::string text;
  for (const auto& t : tokens) text += t;
  return text;
}

}  // namespace

std::unique_ptr<Tokenizer> make_hf_tokenizer(const std::string& json, const std::string& what) {
  return std::make_unique<HfTokenizer>(json, hf::parse_config(json, what));
}

}  // namespace amsp::data
