// The splitting patterns of Hugging Face pre-tokenizers, matched by hand.
//
// A tokenizer.json names its pattern as a regular expression that tokenizers
// runs with Oniguruma (a backtracking engine: the first alternative that
// matches wins, quantifiers are greedy). Three patterns cover the byte-level
// BPE models people train: GPT-2's (also ByteLevel's built-in one), LLaMA-3's
// and Qwen2's (LLaMA-3's with single digits). Each is written here as the
// backtracking engine would run it, so that the pieces are the same to the
// byte; any other pattern is refused by name rather than approximated.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace amsp::data {

enum class SplitPattern { kGpt2, kLlama3, kQwen2 };

// The pattern a regular expression of a tokenizer.json is, if it is one of ours.
std::optional<SplitPattern> known_split_pattern(const std::string& regex);

// Cuts s into the consecutive pieces the pattern matches (SplitDelimiterBehavior
// Isolated: every byte of s is in exactly one piece) and appends them to out.
void split_by_pattern(SplitPattern pattern, std::string_view s, std::vector<std::string_view>* out);

// ByteLevel's alphabet: GPT-2's map from each byte to a printable character
// (UTF-8), through which byte-level vocabularies spell every byte.
const std::array<std::string, 256>& byte_level_chars();

}  // namespace amsp::data
