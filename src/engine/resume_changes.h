// What changed between the run that wrote a checkpoint and the run resuming
// from it, each change said with what it does to the training ("the cosine
// schedule now ends at step 2000 instead of 1000"). Resharding (another plan,
// another number of ranks with the same global batch) is not a change.
#pragma once

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

// What identifies a dataset's content without reading all of it: sizes,
// tokenizer and a hash of 4096 tokens spread over each split. JSON text.
std::string data_fingerprint(const data::TokenDataset& data);

}  // namespace amsp::engine
