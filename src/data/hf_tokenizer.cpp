#include "data/hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <array>
#include <variant>

#include "core/error.h"
#include "data/hf_bpe.h"
#include "data/hf_pretokenize.h"
#include "data/unicode.h"

namespace amsp::data {
namespace {

using json = nlohmann::json;

// ------------------------------------------------------------ configuration

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
  bool special;
};

// Added tokens found leftmost-longest, as tokenizers' Aho-Corasick automaton
// finds them.
class AddedTokenMatcher {
 public:
  void add(const std::string& content, int32_t id) {
    if (content.empty()) return;
    const auto first = static_cast<unsigned char>(content[0]);
    by_first_[first].push_back(tokens_.size());
    tokens_.push_back({content, id});
  }
  bool empty() const { return tokens_.empty(); }

  // Calls f(piece, id) for consecutive pieces of s: an added token (id >= 0)
  // or the non-empty text between them (id = -1), with the piece's offset.
  template <typename F>
  void split(std::string_view s, F&& f) const {
    size_t start = 0;
    for (size_t i = 0; i < s.size();) {
      const auto& candidates = by_first_[static_cast<unsigned char>(s[i])];
      size_t best = tokens_.size();
      for (size_t t : candidates) {
        const std::string& c = tokens_[t].first;
        if (s.compare(i, c.size(), c) == 0 && (best == tokens_.size() || c.size() > tokens_[best].first.size()))
          best = t;
      }
      if (best == tokens_.size()) {
        ++i;
        continue;
      }
      if (i > start) f(s.substr(start, i - start), -1, start);
      f(s.substr(i, tokens_[best].first.size()), tokens_[best].second, i);
      i += tokens_[best].first.size();
      start = i;
    }
    if (start < s.size()) f(s.substr(start), -1, start);
  }

 private:
  std::vector<std::pair<std::string, int32_t>> tokens_;
  std::array<std::vector<size_t>, 256> by_first_;
};

// Decoders turn token strings back into text, each as a step on the list of
// strings (tokenizers' decode_chain).
struct Decoder {
  enum class Kind { kByteLevel, kByteFallback, kFuse, kReplace, kStrip, kMetaspace } kind;
  std::string a, b;  // Replace: from, to; Strip and Metaspace: the character
  size_t start = 0, stop = 0;
  bool prepended = false;  // Metaspace: its prepend_scheme is not "never"
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

// ---------------------------------------------------------------- parsing

struct Parser {
  std::string what;

  [[noreturn]] void unsupported(const std::string& where, const std::string& name) const {
    fail_usage(what, ": ", where, " ", name, " is not implemented (amsp runs BPE tokenizer.json files: ByteLevel, "
               "Split with the GPT-2, LLaMA-3 or Qwen2 pattern, Metaspace; NFC, Prepend and Replace normalizers)");
  }
  [[noreturn]] void bad(const std::string& where, const std::string& why) const {
    fail_usage(what, ": ", where, ": ", why, "; expected a Hugging Face tokenizer.json");
  }
  std::string type(const json& j, const std::string& where) const {
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) bad(where, "no \"type\"");
    return j["type"].get<std::string>();
  }
  bool flag(const json& j, const char* key, bool dflt) const {
    if (!j.contains(key) || j[key].is_null()) return dflt;
    if (!j[key].is_boolean()) bad(key, "not true or false");
    return j[key].get<bool>();
  }
  std::string string_of(const json& j, const char* key, const std::string& where) const {
    if (!j.contains(key) || !j[key].is_string()) bad(where, cat("no string \"", key, "\""));
    return j[key].get<std::string>();
  }
  // A pattern {"String": s}; a regular expression is refused.
  std::string literal_pattern(const json& j, const std::string& where) const {
    if (j.contains("pattern") && j["pattern"].is_object() && j["pattern"].contains("String") &&
        j["pattern"]["String"].is_string())
      return j["pattern"]["String"].get<std::string>();
    unsupported(where, "with a regular-expression pattern");
  }

  void normalizers(const json& j, std::vector<Normalizer>* out) const {
    if (j.is_null()) return;
    const std::string t = type(j, "normalizer");
    if (t == "Sequence") {
      for (const json& n : j.value("normalizers", json::array())) normalizers(n, out);
    } else if (t == "NFC") {
      out->push_back(Nfc{});
    } else if (t == "Prepend") {
      out->push_back(Prepend{string_of(j, "prepend", "normalizer Prepend")});
    } else if (t == "Replace") {
      const std::string from = literal_pattern(j, "normalizer Replace");
      if (from.empty()) bad("normalizer Replace", "an empty pattern");
      out->push_back(Replace{from, string_of(j, "content", "normalizer Replace")});
    } else {
      unsupported("normalizer", t);
    }
  }

  void pre_tokenizers(const json& j, std::vector<PreTokenizer>* out) const {
    if (j.is_null()) return;
    const std::string t = type(j, "pre_tokenizer");
    if (t == "Sequence") {
      for (const json& p : j.value("pretokenizers", json::array())) pre_tokenizers(p, out);
    } else if (t == "ByteLevel") {
      out->push_back(ByteLevel{flag(j, "add_prefix_space", true), flag(j, "use_regex", true)});
    } else if (t == "Split") {
      if (!j.contains("pattern") || !j["pattern"].is_object() || !j["pattern"].contains("Regex"))
        unsupported("pre_tokenizer Split", "with a string pattern");
      const std::string regex = j["pattern"]["Regex"].is_string() ? j["pattern"]["Regex"].get<std::string>() : "";
      const auto pattern = known_split_pattern(regex);
      if (!pattern) unsupported("pre_tokenizer Split", cat("with the pattern ", json(regex).dump()));
      if (j.value("behavior", "") != "Isolated") unsupported("pre_tokenizer Split", cat("behavior ", j.value("behavior", "?")));
      if (flag(j, "invert", false)) unsupported("pre_tokenizer Split", "with invert");
      out->push_back(Split{*pattern});
    } else if (t == "Metaspace") {
      Metaspace m;
      m.replacement = string_of(j, "replacement", "pre_tokenizer Metaspace");
      const std::string scheme = j.value("prepend_scheme", "always");
      if (scheme == "first") m.prepend = Metaspace::Prepend::kFirst;
      else if (scheme == "never") m.prepend = Metaspace::Prepend::kNever;
      else if (scheme != "always") bad("pre_tokenizer Metaspace", cat("prepend_scheme \"", scheme, "\""));
      if (!flag(j, "add_prefix_space", true)) m.prepend = Metaspace::Prepend::kNever;
      m.split = flag(j, "split", true);
      out->push_back(m);
    } else {
      unsupported("pre_tokenizer", t);
    }
    for (size_t i = 0; i + 1 < out->size(); ++i)
      if (std::holds_alternative<ByteLevel>((*out)[i]))
        unsupported("pre_tokenizer", "ByteLevel before another pre-tokenizer");
  }

  // The special-token ids the post-processor puts before and after the text.
  void post_processor(const json& j, const Vocab& ids, std::vector<int32_t>* before, std::vector<int32_t>* after) const {
    if (j.is_null()) return;
    const std::string t = type(j, "post_processor");
    if (t == "Sequence") {
      for (const json& p : j.value("processors", json::array())) post_processor(p, ids, before, after);
    } else if (t == "ByteLevel") {
      // Offsets only.
    } else if (t == "TemplateProcessing") {
      template_processing(j, before, after);
    } else if (t == "BertProcessing" || t == "RobertaProcessing") {
      auto id_of = [&](const char* key) {
        if (!j.contains(key) || !j[key].is_array() || j[key].size() != 2 || !j[key][1].is_number_integer())
          bad(cat("post_processor ", t), cat("no [token, id] \"", key, "\""));
        return j[key][1].get<int32_t>();
      };
      before->push_back(id_of("cls"));
      after->push_back(id_of("sep"));
    } else {
      unsupported("post_processor", t);
    }
  }

  void template_processing(const json& j, std::vector<int32_t>* before, std::vector<int32_t>* after) const {
    const std::string where = "post_processor TemplateProcessing";
    if (!j.contains("single") || !j["single"].is_array()) bad(where, "no \"single\" template");
    bool seen_text = false;
    for (const json& piece : j["single"]) {
      if (piece.contains("Sequence")) {
        if (seen_text) bad(where, "the text twice in the single template");
        seen_text = true;
        continue;
      }
      if (!piece.contains("SpecialToken")) bad(where, "a template piece that is neither Sequence nor SpecialToken");
      const std::string name = piece["SpecialToken"].value("id", "");
      const json& specials = j.value("special_tokens", json::object());
      if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array())
        bad(where, cat("special token \"", name, "\" has no ids"));
      for (const json& id : specials[name]["ids"]) (seen_text ? after : before)->push_back(id.get<int32_t>());
    }
    if (!seen_text) bad(where, "no $A in the single template");
  }

  void decoders(const json& j, std::vector<Decoder>* out) const {
    if (j.is_null()) return;
    const std::string t = type(j, "decoder");
    Decoder d{};
    if (t == "Sequence") {
      for (const json& x : j.value("decoders", json::array())) decoders(x, out);
      return;
    } else if (t == "ByteLevel") {
      d.kind = Decoder::Kind::kByteLevel;
    } else if (t == "ByteFallback") {
      d.kind = Decoder::Kind::kByteFallback;
    } else if (t == "Fuse") {
      d.kind = Decoder::Kind::kFuse;
    } else if (t == "Replace") {
      d.kind = Decoder::Kind::kReplace;
      d.a = literal_pattern(j, "decoder Replace");
      d.b = string_of(j, "content", "decoder Replace");
      if (d.a.empty()) bad("decoder Replace", "an empty pattern");
    } else if (t == "Strip") {
      d.kind = Decoder::Kind::kStrip;
      d.a = string_of(j, "content", "decoder Strip");
      d.start = j.value("start", size_t{0});
      d.stop = j.value("stop", size_t{0});
    } else if (t == "Metaspace") {
      d.kind = Decoder::Kind::kMetaspace;
      d.a = string_of(j, "replacement", "decoder Metaspace");
      d.prepended = j.value("prepend_scheme", "always") != "never" && flag(j, "add_prefix_space", true);
    } else {
      unsupported("decoder", t);
    }
    out->push_back(d);
  }

  std::vector<std::pair<std::string, std::string>> merges(const json& j) const {
    std::vector<std::pair<std::string, std::string>> out;
    if (!j.is_array()) bad("model", "no \"merges\" list");
    out.reserve(j.size());
    for (const json& m : j) {
      if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
        continue;
      }
      if (!m.is_string()) bad("model merges", cat("merge #", out.size(), " is neither \"a b\" nor [a, b]"));
      const std::string s = m.get<std::string>();
      if (s.rfind("#version", 0) == 0) continue;
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        bad("model merges", cat("merge #", out.size(), " ", json(s).dump(), " is not two tokens"));
      out.emplace_back(s.substr(0, space), s.substr(space + 1));
    }
    return out;
  }

  BpeModel model(const json& m, Vocab* vocab_copy) const {
    if (!m.is_object()) bad("model", "missing");
    const std::string t = m.value("type", "BPE");
    if (t != "BPE") unsupported("model", t);
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
      unsupported("model BPE", "dropout");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(key) && !m[key].is_null() && m[key] != "") unsupported("model BPE", key);
    if (!m.contains("vocab") || !m["vocab"].is_object()) bad("model", "no \"vocab\" object");
    Vocab vocab;
    vocab.reserve(m["vocab"].size());
    for (const auto& [piece, id] : m["vocab"].items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 31))
        bad("model vocab", cat(json(piece).dump(), " has no non-negative integer id"));
      vocab.emplace(piece, id.get<int32_t>());
    }
    BpeOptions o;
    o.byte_fallback = flag(m, "byte_fallback", false);
    o.ignore_merges = flag(m, "ignore_merges", false);
    o.fuse_unk = flag(m, "fuse_unk", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      const auto it = vocab.find(m["unk_token"].get<std::string>());
      if (it == vocab.end()) bad("model unk_token", "not in the vocabulary");
      o.unk_id = it->second;
    }
    *vocab_copy = vocab;
    return BpeModel(std::move(vocab), merges(m.value("merges", json())), o, what);
  }
};

// ---------------------------------------------------------------- the tokenizer

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const std::string& text, const std::string& what) : json_(text), model_(load(text, what)) {}

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
  BpeModel load(const std::string& text, const std::string& what);
  void encode_text(std::string_view text, std::vector<int32_t>* out) const;
  void pre_tokenize(size_t step, std::string_view piece, bool at_start, std::vector<int32_t>* out) const;
  void model_encode(std::string_view word, std::vector<int32_t>* out) const;
  std::string normalize(std::string_view s) const;

  std::string json_;
  std::vector<Normalizer> normalizers_;
  std::vector<PreTokenizer> pre_tokenizers_;
  bool byte_level_ = false;
  AddedTokenMatcher raw_added_, normalized_added_;
  std::vector<AddedToken> added_;
  std::vector<int32_t> before_, after_;
  std::vector<Decoder> decoders_;
  std::vector<std::string> pieces_;  // id -> its string, for decoding
  std::vector<char> special_;        // id -> a special added token (skipped when decoding)
  int64_t vocab_size_ = 0;
  BpeModel model_;
};

BpeModel HfTokenizer::load(const std::string& text, const std::string& what) {
  const Parser p{what};
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail_usage(what, ": not JSON (", e.what(), "); expected a Hugging Face tokenizer.json");
  }
  if (!j.is_object() || !j.contains("model")) p.bad("the file", "no \"model\"");
  for (const char* key : {"truncation", "padding"})
    if (j.contains(key) && !j[key].is_null()) p.unsupported(key, "(set it to null)");
  Vocab vocab;
  BpeModel model = p.model(j["model"], &vocab);
  p.normalizers(j.value("normalizer", json()), &normalizers_);
  p.pre_tokenizers(j.value("pre_tokenizer", json()), &pre_tokenizers_);
  byte_level_ = !pre_tokenizers_.empty() && std::holds_alternative<ByteLevel>(pre_tokenizers_.back());
  p.post_processor(j.value("post_processor", json()), vocab, &before_, &after_);
  p.decoders(j.value("decoder", json()), &decoders_);

  for (const auto& [piece, id] : vocab) vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
  for (const json& a : j.value("added_tokens", json::array())) {
    const std::string where = "added_tokens";
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string())
      p.bad(where, "an entry without \"id\" and \"content\"");
    for (const char* key : {"single_word", "lstrip", "rstrip"})
      if (p.flag(a, key, false)) p.unsupported(where, cat(json(a["content"]).dump(), " with ", key));
    const bool special = p.flag(a, "special", false);
    AddedToken t{a["content"].get<std::string>(), a["id"].get<int32_t>(), special};
    if (t.id < 0) p.bad(where, cat(json(t.content).dump(), " has a negative id"));
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{t.id} + 1);
    if (p.flag(a, "normalized", !special)) {
      normalized_added_.add(normalize(t.content), t.id);
    } else {
      raw_added_.add(t.content, t.id);
    }
    added_.push_back(t);
  }
  for (int32_t id : before_) if (id < 0 || id >= vocab_size_) p.bad("post_processor", cat("id ", id, " is outside the vocabulary"));
  for (int32_t id : after_) if (id < 0 || id >= vocab_size_) p.bad("post_processor", cat("id ", id, " is outside the vocabulary"));

  pieces_.assign(vocab_size_, std::string());
  special_.assign(vocab_size_, 0);
  for (const auto& [piece, id] : vocab) pieces_[id] = piece;
  for (const AddedToken& t : added_) pieces_[t.id] = t.content, special_[t.id] = t.special;
  return model;
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
  return std::make_unique<HfTokenizer>(json, what);
}

}  // namespace amsp::data
