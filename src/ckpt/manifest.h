// The manifest of a checkpoint: everything that decides what a resume does,
// in one JSON text stored as the root attribute "manifest", covered by one
// checksum stored as "manifest_checksum". The loose root attributes (step,
// seed, plan, ...) stay for h5py and h5dump readers; a reader takes the values
// from the manifest and refuses a file whose loose attributes disagree with it.
//
//   {"format": "amsp-checkpoint", "format_version": 2, "step": ..., "tokens": ...,
//    "seed": ..., "sampler": {...}, "model_config": {...}, "options": {...},
//    "plan": "...", "topology": "...", "world_size": ..., "checksum_algorithm": "...",
//    "datasets": [{"name": "model/embed_tokens.weight", "shape": [256, 128],
//                  "dtype": "float32", "checksum": "0x..."}, ...]}
//
// The dataset list is in file order and must be exactly what the model of
// model_config implies: every parameter and both Adam moments of every tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "model/config.h"

namespace amsp::ckpt {

struct ManifestDataset {
  std::string name;            // "optimizer/exp_avg/layers.0.mlp.up_proj.weight"
  std::vector<int64_t> shape;
  uint64_t checksum = 0;       // ckpt/checksum.h over the dataset's elements
  bool operator==(const ManifestDataset&) const = default;
};

struct Manifest {
  Metadata meta;
  std::vector<ManifestDataset> datasets;
};

// The JSON text (deterministic: same manifest, same bytes).
std::string manifest_to_json(const Manifest& m);
// Parses and checks the text; UsageError naming `path` and the first field
// that is missing or malformed.
Manifest manifest_from_json(const std::string& text, const std::string& path);

// Checksum of a text: the dataset checksum's sum over its bytes (byte i as
// element i), so one algorithm covers data and metadata.
uint64_t text_checksum(const std::string& text);

// The datasets a checkpoint of this model holds, in file order, with shapes
// (checksums zero). What the manifest must list, no more and no less.
std::vector<ManifestDataset> expected_datasets(const model::LlamaConfig& config);

}  // namespace amsp::ckpt
