// A checkpoint as a Hugging Face model directory (`amsp export --format hf`):
// the inverse of --init-from (engine/hf_init.h). The same table maps the two
// ways: model::build_layout's tensors, whose names and row-major shapes are
// the Hugging Face state dict's, so export writes tensor t of the layout under
// t.name with t.shape, and --init-from reads t.name back into the same place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hf/safetensors.h"

namespace amsp::engine {

struct ExportOptions {
  std::string checkpoint;                  // step-*.h5 of any plan and world size
  std::string output;                      // the directory to create
  hf::StoredType dtype = hf::StoredType::kF32;  // F32 or BF16 (rounded to nearest even)
  int64_t max_shard_bytes = 5'000'000'000; // transformers' default "5GB"
  bool force = false;                      // replace a non-empty output
};

struct ExportReport {
  int64_t step = 0;
  int64_t weight_bytes = 0;
  std::vector<std::string> files;  // written into output, in order
  std::string tokenizer;           // what was written, or why none was
  bool tokenizer_written = false;
  std::string tokenizer_warning;   // a written tokenizer that AutoTokenizer's fast conversion gets wrong
};

// One process, no MPI. Checks the checkpoint in a child process first
// (ckpt::check_in_child), reads it one tensor at a time (ckpt::read_parameters:
// checksums checked), writes into OUTPUT.tmp-XXXXXX beside OUTPUT and renames
// it into place only when complete; on any failure the temporary is removed
// and OUTPUT is as it was. With force over an existing OUTPUT the new export
// is written whole first, then swapped with the old one (an atomic exchange
// where the file system has one, else old moved aside, new moved in), then the
// old one deleted: a failure or a crash at any point leaves OUTPUT holding the
// old export or the new one, complete (a crash may leave the other beside it). Throws UsageError (exit 2) for a missing or damaged
// checkpoint and an output that exists and is not empty without force.
//
// The tokenizer: the checkpoint's run options name the dataset and its
// tokenizer kind. A SentencePiece dataset that is still there (and holds the
// same kind and vocabulary) gives tokenizer.model, tokenizer_config.json
// (LlamaTokenizer) and special_tokens_map.json (and the report warns when
// transformers' conversion of it to LlamaTokenizerFast, AutoTokenizer's
// default, would encode otherwise than the model); a tokenizer.json dataset
// gives the file as it was, tokenizer_config.json (PreTrainedTokenizerFast) and
// special_tokens_map.json; otherwise (the byte tokenizer,
// which has no Hugging Face counterpart, or a dataset gone) no tokenizer is
// written and the report says why.
ExportReport export_hf(const ExportOptions& options);

}  // namespace amsp::engine
