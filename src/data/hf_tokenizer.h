// Hugging Face tokenizer.json files with a BPE model: GPT-2, LLaMA-3, Qwen2,
// Mistral and LLaMA-2 conversions, and what people train with the `tokenizers`
// package. Encoding follows tokenizers step by step (added tokens, normalizer,
// pre-tokenizer, BPE, post-processor) so that the ids are identical; a feature
// of the file that is not implemented here is refused in one line naming it.
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace amsp::data {

// json is the file's text; what names it in error messages ("--tokenizer
// tok.json", "--data x.h5"). Throws UsageError for a file that is not a
// tokenizer.json or uses something not implemented.
std::unique_ptr<Tokenizer> make_hf_tokenizer(const std::string& json, const std::string& what);

}  // namespace amsp::data
