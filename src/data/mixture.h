// Data mixtures: `--data a.h5:0.7,b.h5:0.2,c.h5:0.1` trains on several token
// datasets, each training row drawn from one of them by weight (doc/data.md,
// "Mixtures").
//
// The source of row `row` of step `step` is drawn from (seed, step, row) alone,
// on a counter-based stream of its own; the window within that source is then
// drawn exactly as for a single dataset (data/dataset.h). So a row's data still
// depends on nothing but (seed, step, row): not on how rows are divided among
// ranks and micro-batches, and a run resumed at step k on any number of ranks
// draws what it would have drawn. A single dataset draws no source at all: its
// windows are the same bits as before mixtures existed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace amsp::data {

// One entry of --data's text: a dataset path and its weight as given (1 when
// none is given; the weights are normalised by Mixture).
struct MixtureEntry {
  std::string path;
  double weight = 1;
};

// Parses --data's text (`option` names it in errors). Rules (doc/data.md):
// - text that names an existing file is that one file, whatever it contains;
// - otherwise comma-separated entries PATH or PATH:WEIGHT, the weight being what
//   follows an entry's last ':' when it reads as a number;
// - a weight must be a positive finite number; a path may appear only once.
// Throws UsageError with one line naming the entry and what was expected. Does
// not open the files (Mixture does).
std::vector<MixtureEntry> parse_mixture(const std::string& text, const std::string& option = "--data");

class Mixture {
 public:
  // parse_mixture, then every dataset opened (TokenDataset's errors); the
  // datasets of a mixture must share one tokenizer: its kind, its vocabulary
  // size and, for a stored model, the model's bytes. UsageError otherwise.
  explicit Mixture(const std::string& text, const std::string& option = "--data");

  size_t size() const { return sources_.size(); }
  bool single() const { return sources_.size() == 1; }
  const TokenDataset& dataset(size_t i) const { return *sources_[i].data; }
  // The path as given (without its weight).
  const std::string& path(size_t i) const { return sources_[i].path; }
  // The normalised weight: the share of rows drawn from source i.
  double weight(size_t i) const { return sources_[i].weight; }
  // "a.h5 (0.7), b.h5 (0.2), c.h5 (0.1)", or the one path.
  std::string describe() const;

  // The source row `row` of step `step` draws from; 0 for a single dataset,
  // without drawing.
  size_t source_of(uint64_t seed, int64_t step, int64_t row) const;
  // Where that row's window starts in its source's train split.
  int64_t window_start(uint64_t seed, int64_t step, int64_t row, int64_t T) const;
  // As data::sample_train_batch, rows first_row .. first_row + B - 1, each from
  // its own source. A single dataset is exactly data::sample_train_batch.
  void sample_train_batch(uint64_t seed, int64_t step, int64_t first_row, int64_t B, int64_t T,
                          int32_t* tokens, int32_t* targets) const;
  // How many of the rows 0 .. rows - 1 of the step draw from each source.
  std::vector<int64_t> rows_per_source(uint64_t seed, int64_t step, int64_t rows) const;

 private:
  struct Source {
    std::string path;
    double weight = 1;      // normalised
    double cumulative = 1;  // weights of sources 0..i: row goes to the first i with u < cumulative
    std::unique_ptr<TokenDataset> data;
  };
  std::vector<Source> sources_;
  void check_same_tokenizer(const std::string& option) const;
};

}  // namespace amsp::data
