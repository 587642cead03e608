#include "data/hf_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/error.h"

namespace amsp::data::hf {
namespace {

using json = nlohmann::json;

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
  void post_processor(const json& j, std::vector<int32_t>* before, std::vector<int32_t>* after) const {
    if (j.is_null()) return;
    const std::string t = type(j, "post_processor");
    if (t == "Sequence") {
      for (const json& p : j.value("processors", json::array())) post_processor(p, before, after);
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

  void model(const json& m, Config* c) const {
    if (!m.is_object()) bad("model", "missing");
    const std::string t = m.value("type", "BPE");
    if (t != "BPE") unsupported("model", t);
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
      unsupported("model BPE", "dropout");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(key) && !m[key].is_null() && m[key] != "") unsupported("model BPE", key);
    if (!m.contains("vocab") || !m["vocab"].is_object()) bad("model", "no \"vocab\" object");
    Vocab& vocab = c->vocab;
    vocab.reserve(m["vocab"].size());
    for (const auto& [piece, id] : m["vocab"].items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 31))
        bad("model vocab", cat(json(piece).dump(), " has no non-negative integer id"));
      vocab.emplace(piece, id.get<int32_t>());
    }
    BpeOptions& o = c->bpe;
    o.byte_fallback = flag(m, "byte_fallback", false);
    o.ignore_merges = flag(m, "ignore_merges", false);
    o.fuse_unk = flag(m, "fuse_unk", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      const auto it = vocab.find(m["unk_token"].get<std::string>());
      if (it == vocab.end()) bad("model unk_token", "not in the vocabulary");
      o.unk_id = it->second;
    }
    c->merges = merges(m.value("merges", json()));
  }
  AddedToken added_token(const json& a) const {
    const std::string where = "added_tokens";
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string())
      bad(where, "an entry without \"id\" and \"content\"");
    for (const char* key : {"single_word", "lstrip", "rstrip"})
      if (flag(a, key, false)) unsupported(where, cat(json(a["content"]).dump(), " with ", key));
    const bool special = flag(a, "special", false);
    AddedToken t{a["content"].get<std::string>(), a["id"].get<int32_t>(), special, flag(a, "normalized", !special)};
    if (t.id < 0) bad(where, cat(json(t.content).dump(), " has a negative id"));
    return t;
  }
};

}  // namespace

Config parse_config(const std::string& text, const std::string& what) {
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
  Config c;
  c.what = what;
  p.model(j["model"], &c);
  p.normalizers(j.value("normalizer", json()), &c.normalizers);
  p.pre_tokenizers(j.value("pre_tokenizer", json()), &c.pre_tokenizers);
  p.post_processor(j.value("post_processor", json()), &c.before, &c.after);
  p.decoders(j.value("decoder", json()), &c.decoders);
  for (const auto& [piece, id] : c.vocab) c.vocab_size = std::max<int64_t>(c.vocab_size, int64_t{id} + 1);
  for (const json& a : j.value("added_tokens", json::array())) {
    c.added.push_back(p.added_token(a));
    c.vocab_size = std::max<int64_t>(c.vocab_size, int64_t{c.added.back().id} + 1);
  }
  for (const auto* ids : {&c.before, &c.after})
    for (int32_t id : *ids)
      if (id < 0 || id >= c.vocab_size) p.bad("post_processor", cat("id ", id, " is outside the vocabulary"));
  return c;
}

}  // namespace amsp::data::hf
