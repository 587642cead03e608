// What changed between the run that wrote a checkpoint and the run resuming
// from it, each change said with what it does to the training ("the cosine
// schedule now ends at step 2000 instead of 1000"). Resharding (another plan,
// another number of ranks with the same global batch) is not a change.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace amsp::engine {

struct ResumeChanges {
  std::vector<std::string> notes;     // changes of the trajectory the user may mean
  std::vector<std::string> refusals;  // changes that make the resume meaningless:
                                      // another dataset, model fields other than shapes
};

// Compares the options JSON (trainer.cpp's options_json) and model config JSON
// stored in a checkpoint with this run's. Keys missing on the checkpoint's side
// (older checkpoints) are not compared.
ResumeChanges compare_for_resume(const std::string& saved_options, const std::string& saved_model,
                                 const std::string& options, const std::string& model);

// Tokens drawn from each source of this run's data before the checkpoint, in
// the order of this run's options' "mixture" list (one entry for a single
// dataset): each source takes the count of the checkpoint's source that holds
// the same tokens (the same fingerprint, whatever its path), 0 where the
// checkpoint's run had no such source (a resume forced onto other data).
// saved_source_tokens: the checkpoint's (empty when it had one dataset: then
// saved_tokens is that dataset's count).
std::vector<int64_t> carried_source_tokens(const std::string& saved_options,
                                           const std::vector<int64_t>& saved_source_tokens, int64_t saved_tokens,
                                           const std::string& options);

// What identifies a dataset's content without reading all of it: sizes,
// tokenizer and a hash of 4096 tokens spread over each split. JSON text.
std::string data_fingerprint(const data::TokenDataset& data);

}  // namespace amsp::engine
