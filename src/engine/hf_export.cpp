#include "engine/hf_export.h"

#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <stdio.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/fault.h"
#include "data/dataset.h"
#include "data/mixture.h"
#include "hf/model_dir.h"
#include "model/config.h"
#include "model/layout.h"

namespace amsp::engine {
namespace fs = std::filesystem;
namespace {

// The tokenizer files to write (name, bytes), or why there are none.
struct TokenizerFiles {
  std::vector<std::pair<std::string, std::string>> files;
  int64_t bos_id = -1, eos_id = -1;
  std::string note;
  std::string fast_warning;  // why AutoTokenizer's converted fast tokenizer would encode otherwise
};

// transformers makes LlamaTokenizerFast (what AutoTokenizer returns) by
// converting tokenizer.model under LLaMA's assumptions: ids 0, 1, 2 are
// <unk>, <s>, </s>; the text is not normalized, only "▁" prepended and spaces
// replaced by "▁" (the model's normalization rule and whitespace collapsing
// are dropped). The slow LlamaTokenizer runs sentencepiece itself and is
// exact. Empty if the model fits those assumptions, else what does not.
std::string fast_conversion_problem(const sentencepiece::SentencePieceProcessor& sp) {
  if (sp.unk_id() != 0 || sp.bos_id() != 1 || sp.eos_id() != 2)
    return cat("its <unk>, <s>, </s> ids are ", sp.unk_id(), ", ", sp.bos_id(), ", ", sp.eos_id(),
               ", not 0, 1, 2");
  std::vector<std::string> pieces;
  if (!sp.Encode("a", &pieces).ok() || pieces.empty() || pieces[0].rfind("\xE2\x96\x81", 0) != 0)
    return "it adds no dummy prefix";
  // Text the normalizer would change (repeated, leading and trailing spaces,
  // a compatibility ligature for NFKC) and that decodes to itself otherwise;
  // a probe that meets the unknown piece proves nothing.
  for (const char* probe : {"a  b", "  a", "a ", "\xEF\xAC\x81"}) {
    std::vector<int> ids;
    std::string back;
    if (!sp.Encode(probe, &ids).ok()) continue;
    bool unknown = false;
    for (int id : ids) unknown |= sp.IsUnknown(id);
    if (unknown || !sp.Decode(ids, &back).ok()) continue;
    if (back != probe) return "its normalizer rewrites text (whitespace or Unicode normalization)";
  }
  return {};
}

// A tokenizer.json dataset: the file as it was given, and the configuration
// that makes AutoTokenizer load it as PreTrainedTokenizerFast (which runs it as
// it is, post-processor included).
TokenizerFiles tokenizer_json_files(const data::Tokenizer& tok, const std::string& data, int64_t max_positions) {
  TokenizerFiles out;
  const std::string text = tok.serialized_model();
  const nlohmann::json file = nlohmann::json::parse(text);
  auto content = [&](int64_t id) -> nlohmann::ordered_json {
    for (const auto& a : file.value("added_tokens", nlohmann::json::array()))
      if (a.value("id", int64_t{-1}) == id) return a.value("content", "");
    return nullptr;
  };
  out.bos_id = tok.bos_id();
  out.eos_id = tok.eos_id();
  nlohmann::ordered_json special = {{"bos_token", content(out.bos_id)}, {"eos_token", content(out.eos_id)}};
  nlohmann::ordered_json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                   {"model_max_length", max_positions},
                                   {"clean_up_tokenization_spaces", false}};
  for (const auto& [k, v] : special.items()) config[k] = v;
  out.files = {{"tokenizer.json", text},
               {"tokenizer_config.json", config.dump(2) + "\n"},
               {"special_tokens_map.json", special.dump(2) + "\n"}};
  out.note = "tokenizer.json (Hugging Face, from the run's dataset " + data + ")";
  return out;
}

TokenizerFiles find_tokenizer(const ckpt::Metadata& meta, int64_t max_positions) {
  TokenizerFiles out;
  nlohmann::json opts;
  try {
    opts = nlohmann::json::parse(meta.options_json);
  } catch (const std::exception&) {
    out.note = "the checkpoint's run options are not JSON";
    return out;
  }
  // A mixture's datasets share one tokenizer (data/mixture.h): the first one's.
  std::string data = opts.value("data", "");
  try {
    if (!data.empty()) data = data::parse_mixture(data).front().path;
  } catch (const Error&) {
    // Named in the note below when it cannot be read.
  }
  std::string kind;
  if (opts.contains("data_fingerprint") && opts["data_fingerprint"].is_object())
    kind = opts["data_fingerprint"].value("tokenizer", "");
  if (kind == "byte") {
    out.note = "the run's dataset " + data +
               " uses amsp's byte-level tokenizer (id = byte value), which has no Hugging Face counterpart";
    return out;
  }
  if (kind != "sentencepiece" && kind != "huggingface") {
    out.note = "the checkpoint does not say which tokenizer its run used";
    return out;
  }
  std::unique_ptr<data::Tokenizer> tok;
  try {
    if (data.empty() || !fs::is_regular_file(data)) throw UsageError("no such file");
    tok = data::dataset_tokenizer(data);
  } catch (const Error& e) {
    out.note = "the run's " + kind + " tokenizer was stored in its dataset " + data + ", which cannot be read here (" +
               e.what() + ")";
    return out;
  }
  const int64_t vocab = opts["data_fingerprint"].value("vocab_size", int64_t{-1});
  if (tok->kind() != kind || tok->vocab_size() != vocab) {
    out.note = cat("the dataset ", data, " now holds a ", tok->kind(), " tokenizer of ", tok->vocab_size(),
                   " ids, not the run's ", kind, " one of ", vocab);
    return out;
  }
  if (kind == "huggingface") return tokenizer_json_files(*tok, data, max_positions);
  sentencepiece::SentencePieceProcessor sp;
  const std::string model = tok->serialized_model();
  if (!sp.LoadFromSerializedProto(model).ok()) {
    out.note = "the SentencePiece model stored in " + data + " does not load";
    return out;
  }
  auto piece = [&](int id) -> nlohmann::ordered_json {
    return id >= 0 && id < sp.GetPieceSize() ? nlohmann::ordered_json(sp.IdToPiece(id)) : nlohmann::ordered_json();
  };
  out.bos_id = sp.bos_id();
  out.eos_id = sp.eos_id();
  if (const std::string problem = fast_conversion_problem(sp); !problem.empty())
    out.fast_warning = "the SentencePiece model does not fit what transformers assumes when it converts "
                       "tokenizer.model to LlamaTokenizerFast (" + problem + "): AutoTokenizer would encode "
                       "otherwise; load it with use_fast=False (LlamaTokenizer runs the model as it is)";
  nlohmann::ordered_json special = {{"bos_token", piece(sp.bos_id())},
                                    {"eos_token", piece(sp.eos_id())},
                                    {"unk_token", piece(sp.unk_id())}};
  if (sp.pad_id() >= 0) special["pad_token"] = piece(sp.pad_id());
  nlohmann::ordered_json config = {{"tokenizer_class", "LlamaTokenizer"},
                                   {"add_bos_token", true},
                                   {"add_eos_token", false},
                                   {"legacy", true},
                                   {"model_max_length", max_positions},
                                   {"clean_up_tokenization_spaces", false}};
  for (const auto& [k, v] : special.items()) config[k] = v;
  out.files = {{"tokenizer.model", model},
               {"tokenizer_config.json", config.dump(2) + "\n"},
               {"special_tokens_map.json", special.dump(2) + "\n"}};
  out.note = "tokenizer.model (SentencePiece, from the run's dataset " + data + ")";
  return out;
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) fail(path.string(), ": write failed");
}

bool empty_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) && fs::directory_iterator(p, ec) == fs::directory_iterator();
}

// A fresh directory beside `target`, named target.tmp-XXXXXX.
fs::path make_temporary(const fs::path& target) {
  std::string templ = target.string() + ".tmp-XXXXXX";
  if (!::mkdtemp(templ.data()))
    fail_usage("--output ", target.string(), ": cannot create a directory beside it (", std::strerror(errno), ")");
  return templ;
}

// Swaps the complete new export `fresh` with the old output `target`, so that
// at every moment `target` is one of the two, complete: renameat2's
// RENAME_EXCHANGE where the file system has it; elsewhere the old one is moved
// aside (to `fresh`.old), the new one moved in, and on a failure of that
// second rename the old one moved back. Afterwards the old export is at the
// returned path, for the caller to delete.
fs::path swap_in(const fs::path& fresh, const fs::path& target) {
  if (::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) return fresh;
  if (errno != EINVAL && errno != ENOSYS)
    fail("--output ", target.string(), ": cannot swap the new export in (", std::strerror(errno), ")");
  const fs::path aside = fresh.string() + ".old";
  std::error_code ec;
  fs::rename(target, aside, ec);
  if (ec) fail("--output ", target.string(), ": cannot move the old export aside (", ec.message(), ")");
  fs::rename(fresh, target, ec);
  if (ec) {
    std::error_code back;
    fs::rename(aside, target, back);
    fail("--output ", target.string(), ": cannot move the new export in (", ec.message(), ")",
         back ? cat("; the old one is at ", aside.string()) : std::string());
  }
  return aside;
}

}  // namespace

ExportReport export_hf(const ExportOptions& o) {
  if (o.dtype != hf::StoredType::kF32 && o.dtype != hf::StoredType::kBF16)
    fail_usage("--dtype ", hf::stored_type_name(o.dtype), ": expected fp32 or bf16");
  if (!fs::is_regular_file(o.checkpoint)) fail_usage("--checkpoint ", o.checkpoint, ": no such file");
  fs::path target = fs::path(o.output).lexically_normal();
  if (target.has_filename() == false) target = target.parent_path();  // "dir/" -> "dir"
  if (target.empty()) fail_usage("--output: expected a directory path");
  std::error_code ec;
  const bool exists = fs::exists(fs::symlink_status(target, ec));
  if (exists && !empty_dir(target) && !o.force)
    fail_usage("--output ", target.string(), ": exists and is not empty; give --force to replace it");
  // The file's structure in a child process first: a damaged file must not crash this one.
  if (const std::string problem = ckpt::check_in_child(o.checkpoint, /*data=*/false); !problem.empty())
    fail_usage("checkpoint ", o.checkpoint, ": ", problem);
  const ckpt::Metadata meta = ckpt::read_metadata(o.checkpoint);
  model::LlamaConfig config = model::config_from_json(meta.model_json, "checkpoint " + o.checkpoint);
  config.validate();
  const auto units = model::build_layout(config);
  const TokenizerFiles tok = find_tokenizer(meta, config.max_position_embeddings);

  ExportReport report;
  report.step = meta.step;
  report.tokenizer = tok.note;
  report.tokenizer_written = !tok.files.empty();
  report.tokenizer_warning = tok.fast_warning;
  std::vector<hf::TensorDecl> decls;
  for (const auto& u : units)
    for (const auto& t : u.tensors) {
      decls.push_back({t.name, o.dtype, t.shape});
      report.weight_bytes += decls.back().bytes();
    }

  if (!target.parent_path().empty()) fs::create_directories(target.parent_path(), ec);
  const fs::path tmp = make_temporary(target);
  try {
    hf::write_config(tmp.string(), config, o.dtype, tok.bos_id, tok.eos_id);
    report.files.push_back(hf::kConfigFile);
    for (const auto& [name, bytes] : tok.files) {
      write_file(tmp / name, bytes);
      report.files.push_back(name);
    }
    hf::WeightsWriter weights(tmp.string(), decls, o.max_shard_bytes);
    ckpt::read_parameters(o.checkpoint, units, [&](const model::TensorSpec&, std::vector<float>& data) {
      weights.write_tensor(data.data(), static_cast<int64_t>(data.size()));
    });
    for (const auto& f : weights.close()) report.files.push_back(f);
    // What --init-from will make of it: the headers against the layout.
    hf::ModelDir(tmp.string()).check(units);
    fault::point("export.written", meta.step, 0);
    if (!exists) {
      fs::rename(tmp, target);
      return report;
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  // --force over an existing output: the new export is complete beside it; swap
  // it in, then delete the old one. A failure or a crash at any point leaves
  // the old export or the new one, complete, at `target`.
  const fs::path old = [&] {
    try {
      return swap_in(tmp, target);
    } catch (...) {
      fs::remove_all(tmp, ec);
      throw;
    }
  }();
  fault::point("export.swapped", meta.step, 0);
  fs::remove_all(old, ec);
  if (ec)
    std::fprintf(stderr, "amsp export: warning: cannot delete the old export, moved to %s: %s\n",
                 old.string().c_str(), ec.message().c_str());
  return report;
}

}  // namespace amsp::engine
