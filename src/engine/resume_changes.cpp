#include "engine/resume_changes.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"

namespace amsp::engine {
namespace {

using nlohmann::json;

std::string text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

// Both sides have the key and its values differ.
bool changed(const json& before, const json& now, const char* key) {
  return before.contains(key) && now.contains(key) && before[key] != now[key];
}

std::string was(const json& before, const json& now, const char* option, const char* key) {
  return cat(option, " ", text(now[key]), " (was ", text(before[key]), ")");
}

void schedule_notes(const json& b, const json& n, std::vector<std::string>* out) {
  if (changed(b, n, "steps"))
    out->push_back(cat(was(b, n, "--steps", "steps"), ": the cosine schedule now ends at step ", text(n["steps"]),
                       " instead of ", text(b["steps"])));
  if (changed(b, n, "warmup_steps"))
    out->push_back(cat(was(b, n, "--warmup-steps", "warmup_steps"), ": warmup now ends at step ",
                       text(n["warmup_steps"]), " instead of ", text(b["warmup_steps"])));
  if (changed(b, n, "lr"))
    out->push_back(cat(was(b, n, "--lr", "lr"), ": the schedule's peak learning rate changes"));
  if (changed(b, n, "min_lr"))
    out->push_back(cat(was(b, n, "--min-lr", "min_lr"), ": the schedule now decays to ", text(n["min_lr"])));
}

void batch_notes(const json& b, const json& n, std::vector<std::string>* out) {
  if (changed(b, n, "rows_per_step") || changed(b, n, "seq_len"))
    out->push_back(cat("each step now trains ", text(n["rows_per_step"]), " sequences of ", text(n["seq_len"]),
                       " tokens (was ", text(b.value("rows_per_step", json())), " of ", text(b["seq_len"]),
                       "; batch x grad-accum x ranks): the gradient noise and the data order differ from "
                       "the original run's from here on"));
  if (changed(b, n, "seed"))
    out->push_back(cat(was(b, n, "--seed", "seed"), ": the data order differs from the original run's"));
  for (const auto& [key, option] : {std::pair{"weight_decay", "--weight-decay"}, {"beta1", "--beta1"},
                                    {"beta2", "--beta2"}, {"adam_eps", "--adam-eps"}, {"grad_clip", "--grad-clip"},
                                    {"decay_norms_and_embeddings", "--decay-norms-and-embeddings"}})
    if (changed(b, n, key)) out->push_back(cat(was(b, n, option, key), ": the optimizer's update changes"));
}

// A run's datasets as stored in its options: the "mixture" list, or the one
// dataset of "data" with its fingerprint; empty for checkpoints older than
// fingerprints.
struct Source {
  std::string path;
  double weight = 1;
  json fingerprint;
};

std::vector<Source> sources(const json& options) {
  std::vector<Source> out;
  if (options.contains("mixture")) {
    for (const json& s : options["mixture"])
      out.push_back({s.value("path", ""), s.value("weight", 1.0), s.value("fingerprint", json())});
  } else if (options.contains("data_fingerprint")) {
    out.push_back({text(options.value("data", json())), 1.0, options["data_fingerprint"]});
  }
  return out;
}

// For each of now's sources, the index of the first source of before with the
// same tokens not matched yet, or -1.
std::vector<int> match_sources(const std::vector<Source>& before, const std::vector<Source>& now) {
  std::vector<int> match(now.size(), -1);
  std::vector<bool> used(before.size(), false);
  for (size_t i = 0; i < now.size(); ++i)
    for (size_t j = 0; j < before.size(); ++j)
      if (!used[j] && before[j].fingerprint == now[i].fingerprint) {
        match[i] = static_cast<int>(j);
        used[j] = true;
        break;
      }
  return match;
}

std::string paths(const std::vector<Source>& sources) {
  std::string out;
  for (size_t i = 0; i < sources.size(); ++i) out += cat(i ? ", " : "", sources[i].path);
  return out;
}

// A mixture on either side. Its sources are the dataset: one with tokens the
// checkpoint's run never drew from, or one of its sources left out, is another
// dataset (refused as one is). Other weights or another order only change which
// source each row draws from, as another seed changes the windows: listed.
void mixture_changes(const json& b, const json& n, ResumeChanges* r) {
  const std::vector<Source> before = sources(b), now = sources(n);
  if (before.empty() || now.empty()) return;
  const std::vector<int> match = match_sources(before, now);
  std::vector<bool> kept(before.size(), false);
  bool same_order = before.size() == now.size(), same_paths = same_order;
  for (size_t i = 0; i < now.size(); ++i) {
    if (match[i] < 0) {
      r->refusals.push_back(cat("--data ", now[i].path, " holds other tokens than the datasets the checkpoint's run ",
                                "trained on (", paths(before), ")"));
      continue;
    }
    const Source& old = before[match[i]];
    kept[match[i]] = true;
    if (match[i] != static_cast<int>(i) || old.weight != now[i].weight) same_order = false;
    if (old.path != now[i].path) same_paths = false;
  }
  for (size_t j = 0; j < before.size(); ++j)
    if (!kept[j])
      r->refusals.push_back(cat("--data ", text(n["data"]), " leaves out ", before[j].path,
                                ", which the checkpoint's run trained on (weight ", before[j].weight, ")"));
  if (!r->refusals.empty()) return;
  if (!same_order)
    r->notes.push_back(cat(was(b, n, "--data", "data"), ": the mixture's weights or order changed: which dataset "
                           "each row draws from differs from the original run's from here on"));
  else if (!same_paths)
    r->notes.push_back(cat(was(b, n, "--data", "data"), ": the same tokens (sizes and samples agree)"));
}

json parse(const std::string& s) {
  try {
    return json::parse(s);
  } catch (const std::exception&) {
    return json::object();
  }
}

}  // namespace

ResumeChanges compare_for_resume(const std::string& saved_options, const std::string& saved_model,
                                 const std::string& options, const std::string& model) {
  const json b = parse(saved_options), n = parse(options), bm = parse(saved_model), nm = parse(model);
  ResumeChanges r;
  schedule_notes(b, n, &r.notes);
  batch_notes(b, n, &r.notes);
  // Checkpoints hold fp32 master weights and moments whatever the precision
  // (files written before precision was recorded are fp32).
  const std::string was_precision = b.value("precision", "fp32"), now_precision = n.value("precision", "fp32");
  if (was_precision != now_precision)
    r.notes.push_back(cat("--precision ", now_precision, " (was ", was_precision,
                          "): training continues from the checkpoint's fp32 master weights and moments "
                          "with ", now_precision, " parameters and gradients"));
  if (b.contains("mixture") || n.contains("mixture"))
    mixture_changes(b, n, &r);
  else if (changed(b, n, "data_fingerprint"))
    r.refusals.push_back(cat("--data ", text(n["data"]), " holds other tokens than the checkpoint's run trained on (",
                             text(b["data"]), ", ", text(b["data_fingerprint"].value("train", json()).value("tokens", json())),
                             " train tokens; now ", text(n["data_fingerprint"].value("train", json()).value("tokens", json())),
                             ", and other samples)"));
  else if (changed(b, n, "data"))
    r.notes.push_back(cat(was(b, n, "--data", "data"), ": the same tokens (sizes and samples agree)"));
  for (const char* field : {"max_position_embeddings", "rms_norm_eps", "rope_theta"})
    if (changed(bm, nm, field))
      r.refusals.push_back(cat("model field ", field, " is ", text(nm[field]), " here but ", text(bm[field]),
                               " in the checkpoint: the trained weights would be used by another model"));
  return r;
}

std::vector<int64_t> carried_source_tokens(const std::string& saved_options,
                                           const std::vector<int64_t>& saved_source_tokens, int64_t saved_tokens,
                                           const std::string& options) {
  const json b = parse(saved_options), n = parse(options);
  const std::vector<Source> before = sources(b), now = sources(n);
  // One dataset before: its count is the checkpoint's tokens.
  const std::vector<int64_t> counts =
      b.contains("mixture") ? saved_source_tokens : std::vector<int64_t>(before.size(), saved_tokens);
  std::vector<int64_t> out(std::max<size_t>(now.size(), 1), 0);
  const std::vector<int> match = match_sources(before, now);
  for (size_t i = 0; i < now.size(); ++i)
    if (match[i] >= 0 && static_cast<size_t>(match[i]) < counts.size()) out[i] = counts[match[i]];
  return out;
}

std::string data_fingerprint(const data::TokenDataset& data) {
  json j = {{"tokenizer", data.tokenizer()}, {"vocab_size", data.vocab_size()}};
  for (const auto split : {data::Split::kTrain, data::Split::kValid}) {
    const size_t n = static_cast<size_t>(data.size(split)), samples = std::min<size_t>(n, 4096);
    uint64_t h = 0;
    for (size_t k = 0; k < samples; ++k) {
      const size_t i = samples < n ? k * (n / samples) : k;
      int32_t t = 0;
      data.read(split, static_cast<int64_t>(i), 1, &t);
      h += mix64(mix64(i) ^ static_cast<uint32_t>(t));
    }
    char hex[32];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    const char* name = split == data::Split::kTrain ? "train" : "valid";
    j[name] = {{"tokens", n}, {"sample_hash", hex}};
  }
  return j.dump();
}

}  // namespace amsp::engine
