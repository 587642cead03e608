#include "data/mixture.h"

#include <cmath>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/parse.h"
#include "core/rng.h"
#include "data/tokenizer.h"

namespace amsp::data {
namespace fs = std::filesystem;

namespace {

// RNG stream of a training row's source ("mixsourc"); no other user of
// core/rng.h may use it. Apart from the window starts' stream, so that the
// window drawn within a source is the one a single dataset would draw.
constexpr uint64_t kSourceStream = 0x6d6978736f757263ULL;

bool exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

// What identifies a file for "named twice": its canonical path where it
// exists (a.h5, ./a.h5 and a symlink to it are one file), else the text.
std::string identity(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

const char* kExpected = "expected PATH or PATH:WEIGHT entries separated by commas";

// One entry: the weight is what follows the last ':' when it reads as a
// number. A text after it that is no number makes the whole entry a path,
// unless the part before it is an existing file: then it was meant as a weight.
MixtureEntry parse_entry(const std::string& entry, const std::string& option) {
  const size_t colon = entry.rfind(':');
  if (colon == std::string::npos) return {entry, 1.0};
  const std::string path = entry.substr(0, colon), tail = entry.substr(colon + 1);
  const std::optional<double> weight = parse_double(tail);
  if (!weight) {
    if (!exists(entry) && exists(path))
      fail_usage(option, " ", entry, ": weight \"", tail, "\" is not a number; ", kExpected,
                 ", WEIGHT a positive number");
    return {entry, 1.0};
  }
  if (path.empty()) fail_usage(option, " ", entry, ": no path before the weight; ", kExpected);
  if (!(*weight > 0) || !std::isfinite(*weight))
    fail_usage(option, " ", entry, ": weight ", tail, " of ", path, "; expected a positive finite number");
  return {path, *weight};
}

}  // namespace

std::vector<MixtureEntry> parse_mixture(const std::string& text, const std::string& option) {
  // A path that holds ':' or ',' stays usable as one dataset.
  if (text.empty() || exists(text)) return {{text, 1.0}};
  std::vector<MixtureEntry> entries;
  size_t begin = 0;
  for (int number = 1;; ++number) {
    const size_t comma = text.find(',', begin);
    const std::string entry = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    if (entry.empty()) fail_usage(option, " ", text, ": entry ", number, " is empty; ", kExpected);
    entries.push_back(parse_entry(entry, option));
    for (size_t i = 0; i + 1 < entries.size(); ++i)
      if (identity(entries[i].path) == identity(entries.back().path))
        fail_usage(option, " ", text, ": ", entries.back().path, " is named twice (entries ", i + 1, " and ", number,
                   "); expected each dataset once (give it the sum of the weights)");
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return entries;
}

Mixture::Mixture(const std::string& text, const std::string& option) {
  double total = 0;
  for (const MixtureEntry& e : parse_mixture(text, option)) {
    total += e.weight;
    sources_.push_back({e.path, e.weight, 0.0, std::make_unique<TokenDataset>(e.path)});
  }
  double sum = 0;
  for (Source& s : sources_) {
    sum += s.weight;
    s.cumulative = sum / total;
    s.weight /= total;
  }
  // u < 1 always reaches the last source, whatever the rounding of the sums.
  sources_.back().cumulative = 1.0;
  if (!single()) check_same_tokenizer(option);
}

// Token ids mean the same in every source only under one tokenizer.
void Mixture::check_same_tokenizer(const std::string& option) const {
  const TokenDataset& first = dataset(0);
  const std::string first_model = dataset_tokenizer(first.path())->serialized_model();
  for (size_t i = 1; i < size(); ++i) {
    const TokenDataset& d = dataset(i);
    if (d.tokenizer() != first.tokenizer() || d.vocab_size() != first.vocab_size())
      fail_usage(option, " ", path(i), ": tokenizer ", d.tokenizer(), " with ", d.vocab_size(), " ids, but ",
                 path(0), " has ", first.tokenizer(), " with ", first.vocab_size(),
                 " ids; expected every dataset of a mixture prepared with the same tokenizer");
    if (dataset_tokenizer(d.path())->serialized_model() != first_model)
      fail_usage(option, " ", path(i), ": its ", d.tokenizer(), " model differs from ", path(0),
                 "'s (both ", d.vocab_size(), " ids); expected every dataset of a mixture prepared with the same "
                 "tokenizer");
  }
}

std::string Mixture::describe() const {
  if (single()) return path(0);
  std::string out;
  for (size_t i = 0; i < size(); ++i) out += cat(i ? ", " : "", path(i), " (", weight(i), ")");
  return out;
}

size_t Mixture::source_of(uint64_t seed, int64_t step, int64_t row) const {
  if (single()) return 0;
  const double u = random_uniform(seed, kSourceStream, step_row_index(step, row));
  size_t i = 0;
  while (u >= sources_[i].cumulative) ++i;
  return i;
}

int64_t Mixture::window_start(uint64_t seed, int64_t step, int64_t row, int64_t T) const {
  return train_window_start(dataset(source_of(seed, step, row)), seed, step, row, T);
}

void Mixture::sample_train_batch(uint64_t seed, int64_t step, int64_t first_row, int64_t B, int64_t T,
                                 int32_t* tokens, int32_t* targets) const {
  if (single()) return data::sample_train_batch(dataset(0), seed, step, first_row, B, T, tokens, targets);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t row = first_row + b;
    data::sample_train_batch(dataset(source_of(seed, step, row)), seed, step, row, 1, T, tokens + b * T,
                             targets + b * T);
  }
}

std::vector<int64_t> Mixture::rows_per_source(uint64_t seed, int64_t step, int64_t rows) const {
  std::vector<int64_t> counts(size(), 0);
  for (int64_t row = 0; row < rows; ++row) counts[source_of(seed, step, row)] += 1;
  return counts;
}

}  // namespace amsp::data
