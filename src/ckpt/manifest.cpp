#include "ckpt/manifest.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "ckpt/checksum.h"
#include "ckpt/format.h"
#include "core/error.h"
#include "model/layout.h"

namespace amsp::ckpt {
namespace {

using nlohmann::ordered_json;

std::string hex16(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The JSON text of an embedded object (model config, options) parsed back into
// an object, so that the manifest stays one JSON document.
ordered_json embedded(const std::string& text) {
  try {
    return ordered_json::parse(text);
  } catch (const std::exception&) {
    return text;
  }
}

}  // namespace

uint64_t text_checksum(const std::string& text) {
  uint64_t sum = 0;
  for (size_t i = 0; i < text.size(); ++i)
    sum += checksum_term(i, static_cast<unsigned char>(text[i]));
  return sum;
}

std::string manifest_to_json(const Manifest& m) {
  const Metadata& meta = m.meta;
  ordered_json datasets = ordered_json::array();
  for (const auto& d : m.datasets)
    datasets.push_back({{"name", d.name}, {"shape", d.shape}, {"dtype", "float32"}, {"checksum", hex16(d.checksum)}});
  ordered_json sampler = {{"kind", "counter-based"}, {"seed", meta.seed}, {"step", meta.step}};
  if (!meta.source_tokens.empty()) sampler["source_tokens"] = meta.source_tokens;
  const ordered_json j = {{"format", kFormat},
                          {"format_version", meta.format_version},
                          {"step", meta.step},
                          {"tokens", meta.tokens},
                          {"seed", meta.seed},
                          {"sampler", sampler},
                          {"model_config", embedded(meta.model_json)},
                          {"options", embedded(meta.options_json)},
                          {"plan", meta.plan},
                          {"topology", meta.topology},
                          {"world_size", meta.world_size},
                          {"checksum_algorithm", kChecksumAlgorithm},
                          {"datasets", datasets}};
  return j.dump();
}

Manifest manifest_from_json(const std::string& text, const std::string& path) {
  const std::string where = cat("checkpoint ", path, ": manifest");
  ordered_json j;
  try {
    j = ordered_json::parse(text);
  } catch (const std::exception&) {
    fail_usage(where, " is not JSON");
  }
  if (!j.is_object()) fail_usage(where, " is not a JSON object");
  auto field = [&](const char* name) -> const ordered_json& {
    if (!j.contains(name)) fail_usage(where, " has no field ", name);
    return j[name];
  };
  auto integer = [&](const char* name) {
    const auto& v = field(name);
    if (!v.is_number_integer()) fail_usage(where, " field ", name, " is not an integer");
    return v.get<int64_t>();
  };
  auto string = [&](const char* name) {
    const auto& v = field(name);
    if (!v.is_string()) fail_usage(where, " field ", name, " is not a string");
    return v.get<std::string>();
  };
  if (string("format") != kFormat) fail_usage(where, " format is not ", kFormat);
  Manifest m;
  m.meta.format_version = integer("format_version");
  m.meta.step = integer("step");
  m.meta.tokens = integer("tokens");
  if (!field("seed").is_number_unsigned()) fail_usage(where, " field seed is not an unsigned integer");
  m.meta.seed = j["seed"].get<uint64_t>();
  if (!field("model_config").is_object() || !field("options").is_object())
    fail_usage(where, " fields model_config and options are not objects");
  m.meta.model_json = j["model_config"].dump();
  m.meta.options_json = j["options"].dump();
  m.meta.plan = string("plan");
  m.meta.topology = string("topology");
  m.meta.world_size = integer("world_size");
  // A mixture's tokens per source (data/mixture.h); absent for one dataset.
  if (j.contains("sampler") && j["sampler"].is_object() && j["sampler"].contains("source_tokens")) {
    const auto& counts = j["sampler"]["source_tokens"];
    if (!counts.is_array()) fail_usage(where, " field sampler.source_tokens is not a list");
    for (const auto& c : counts) {
      if (!c.is_number_unsigned()) fail_usage(where, " field sampler.source_tokens holds ", c.dump(), "; expected integers >= 0");
      m.meta.source_tokens.push_back(c.get<int64_t>());
    }
  }
  if (m.meta.step < 0 || m.meta.tokens < 0 || m.meta.world_size < 1)
    fail_usage(where, " has step ", m.meta.step, ", tokens ", m.meta.tokens, ", world_size ", m.meta.world_size,
               "; expected step, tokens >= 0 and world_size >= 1");
  const auto& list = field("datasets");
  if (!list.is_array()) fail_usage(where, " field datasets is not a list");
  for (const auto& d : list) {
    ManifestDataset md;
    if (!d.is_object() || !d.contains("name") || !d["name"].is_string() || !d.contains("shape") ||
        !d["shape"].is_array() || !d.contains("checksum") || !d["checksum"].is_string() ||
        d.value("dtype", "") != "float32")
      fail_usage(where, " has a malformed dataset entry ", d.dump().substr(0, 120));
    md.name = d["name"].get<std::string>();
    for (const auto& x : d["shape"]) {
      if (!x.is_number_unsigned()) fail_usage(where, " dataset ", md.name, " has a malformed shape");
      md.shape.push_back(x.get<int64_t>());
    }
    const std::string c = d["checksum"].get<std::string>();
    char* end = nullptr;
    md.checksum = std::strtoull(c.c_str(), &end, 16);
    if (c.size() != 18 || c.rfind("0x", 0) != 0 || end != c.c_str() + c.size())
      fail_usage(where, " dataset ", md.name, " has a malformed checksum ", c);
    m.datasets.push_back(std::move(md));
  }
  return m;
}

std::vector<ManifestDataset> expected_datasets(const model::LlamaConfig& config) {
  std::vector<ManifestDataset> out;
  const auto units = model::build_layout(config);
  for (detail::State state : detail::kAllStates)
    for (const auto& u : units)
      for (const auto& t : u.tensors) out.push_back({detail::dataset_path(state, t.name), t.shape, 0});
  return out;
}

}  // namespace amsp::ckpt
