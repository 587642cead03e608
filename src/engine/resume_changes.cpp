#include "engine/resume_changes.h"

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
  if (changed(b, n, "data_fingerprint"))
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

std::string data_fingerprint(const data::TokenDataset& data) {
  json j = {{"tokenizer", data.tokenizer()}, {"vocab_size", data.vocab_size()}};
  for (const auto split : {data::Split::kTrain, data::Split::kValid}) {
    const auto& t = data.tokens(split);
    const size_t n = t.size(), samples = std::min<size_t>(n, 4096);
    uint64_t h = 0;
    for (size_t k = 0; k < samples; ++k) {
      const size_t i = samples < n ? k * (n / samples) : k;
      h += mix64(mix64(i) ^ static_cast<uint32_t>(t[i]));
    }
    char hex[32];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    const char* name = split == data::Split::kTrain ? "train" : "valid";
    j[name] = {{"tokens", n}, {"sample_hash", hex}};
  }
  return j.dump();
}

}  // namespace amsp::engine
